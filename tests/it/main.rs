//! The integration test binary: the real service on a random port, over real
//! HTTP, against SQLite and PostgreSQL (and Redis where limits are shared).

mod child;
mod dash_client;
mod helpers;
mod webdriver;

mod account_limits;
mod api;
mod browser;
mod budget;
mod connection_caps;
mod connections;
mod dashboard;
mod docs;
mod edge;
mod explain;
mod health;
mod images;
mod journal;
mod keys;
mod languages;
mod limits;
mod metrics;
mod moderations;
mod nsfwjs_reference;
mod ocr;
mod openapi;
mod policies;
mod signatures;
mod signup;
mod speed;
mod store;
mod text_model;
mod usage;
mod vision;
