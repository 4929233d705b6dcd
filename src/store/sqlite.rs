pub struct SqliteStore;
