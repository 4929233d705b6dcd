pub mod moderation;
pub mod store;
