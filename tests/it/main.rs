//! Integration tests (one binary). These may need the fetched model files:
//! run `scripts/setup.sh` (or `scripts/fetch-minilm.sh`) first.

mod text_model;
