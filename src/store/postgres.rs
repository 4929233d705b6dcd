pub struct PostgresStore;
