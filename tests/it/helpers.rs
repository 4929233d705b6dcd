//! `spawn_app`: the real service on 127.0.0.1:0 over a fresh database of
//! either backend, and the small tools every test needs.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use moderato::access::{ApiKeyRecord, KeyId, Tier, UsageEvent};
use moderato::config::Config;
use moderato::store::Store;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh, empty database of the backend: a temp SQLite file or a new
/// PostgreSQL database on the local server, dropped again when the `TestDb`
/// is (even when the test panics), so that a test run leaves no databases.
pub struct TestDb {
    pub url: String,
    postgres: Option<PgDatabase>,
    _dir: Option<Arc<tempfile::TempDir>>,
}

struct PgDatabase {
    admin_url: String,
    name: String,
}

pub fn pg_admin_url() -> String {
    std::env::var("MODERATO_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub fn redis_url() -> String {
    std::env::var("MODERATO_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// `admin_url` with its database replaced by `database` (query kept).
fn with_database(admin_url: &str, database: &str) -> String {
    let (base, query) = match admin_url.split_once('?') {
        Some((b, q)) => (b, format!("?{q}")),
        None => (admin_url, String::new()),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let server = match base[authority_start..].find('/') {
        Some(slash) => &base[..authority_start + slash],
        None => base,
    };
    format!("{server}/{database}{query}")
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let url = format!("sqlite://{}", dir.path().join("moderato.db").display());
                TestDb {
                    url,
                    postgres: None,
                    _dir: Some(Arc::new(dir)),
                }
            }
            Backend::Postgres => {
                use sqlx::Connection;
                let admin_url = pg_admin_url();
                let name = format!("moderato_it_{}", uuid::Uuid::new_v4().simple());
                let mut conn = sqlx::PgConnection::connect(&admin_url)
                    .await
                    .expect("PostgreSQL must be running for the tests (see README)");
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .expect("create database");
                let _ = conn.close().await;
                TestDb {
                    url: with_database(&admin_url, &name),
                    postgres: Some(PgDatabase { admin_url, name }),
                    _dir: None,
                }
            }
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some(PgDatabase { admin_url, name }) = self.postgres.take() else {
            return;
        };
        // Drop is synchronous and may run inside a runtime: drop the
        // database from a thread of its own. FORCE ends the connections the
        // service under test may still hold.
        let dropped = std::thread::spawn(move || {
            use sqlx::Connection;
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test database");
            runtime.block_on(async {
                let mut admin = sqlx::PgConnection::connect(&admin_url).await?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await?;
                admin.close().await
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("could not drop the test database: {e}");
        }
    }
}

pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    pub db: TestDb,
    pub config: Config,
    pub store: Arc<dyn Store>,
    pub shutdown: CancellationToken,
    pub server: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    pub _dir: Arc<tempfile::TempDir>,
}

/// The service's own defaults, pointed at `db`, with secrets in a temp dir.
pub fn test_config(db: &TestDb, dir: &tempfile::TempDir) -> Config {
    let mut config = Config::load(None).expect("default config");
    config.database_url = moderato::config::Secret(db.url.clone());
    config.signing.key_file = dir.path().join("signing-key.pem");
    config.auth.pepper_file = dir.path().join("pepper");
    config.usage.journal_dir = dir.path().join("usage-journal");
    config.models_dir = models_dir();
    config.shutdown_grace_ms = 10_000;
    // `run` serves no metrics; tests that want them bind their own listener.
    config.metrics_addr = String::new();
    // Every test is one client (127.0.0.1) and some fire a hundred requests
    // at once through reqwest's pool; the cap per client has tests of its
    // own (`connection_caps`), at its default.
    config.server.max_connections_per_client = config.server.max_connections;
    config
}

pub fn models_dir() -> PathBuf {
    moderato::config::repository_models_dir()
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_app_with(backend, |_| {}).await
}

pub async fn spawn_app_with(backend: Backend, tweak: impl FnOnce(&mut Config)) -> TestApp {
    let db = TestDb::new(backend).await;
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let mut config = test_config(&db, &dir);
    tweak(&mut config);
    spawn_with_config(db, dir, config).await
}

/// Logs at `MODERATO_LOG` (default warn) through the test harness, so a
/// failing test shows what the service said.
fn init_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("MODERATO_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

pub async fn spawn_with_config(db: TestDb, dir: Arc<tempfile::TempDir>, config: Config) -> TestApp {
    spawn_serving(db, dir, config, None).await
}

/// The app with `GET /metrics` on a listener of its own; returns the
/// metrics base URL too.
pub async fn spawn_app_with_metrics(
    backend: Backend,
    tweak: impl FnOnce(&mut Config),
) -> (TestApp, String) {
    let db = TestDb::new(backend).await;
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let mut config = test_config(&db, &dir);
    tweak(&mut config);
    let metrics = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind metrics");
    let metrics_base = format!("http://{}", metrics.local_addr().expect("addr"));
    (
        spawn_serving(db, dir, config, Some(metrics)).await,
        metrics_base,
    )
}

async fn spawn_serving(
    db: TestDb,
    dir: Arc<tempfile::TempDir>,
    config: Config,
    metrics: Option<tokio::net::TcpListener>,
) -> TestApp {
    init_logs();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(moderato::run_with_metrics(
        config.clone(),
        listener,
        metrics,
        shutdown.clone(),
    ));
    let store = moderato::store::connect(&db.url).await.expect("store");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client");
    let base = format!("http://{addr}");
    let mut app = TestApp {
        base,
        client,
        db,
        config,
        store,
        shutdown,
        server: Some(server),
        _dir: dir,
    };
    app.wait_until_ready().await;
    app
}

impl TestApp {
    async fn wait_until_ready(&mut self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::time::Instant::now() < deadline {
            if self.server.as_ref().is_some_and(|s| s.is_finished()) {
                let result = self.server.take().expect("server").await;
                panic!("the app stopped during start-up: {result:?}");
            }
            if let Ok(r) = self.client.get(format!("{}/ready", self.base)).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the app did not become ready within two minutes");
    }

    /// A new key of `tier`, made as `moderato keys create` makes it.
    pub async fn create_key(&self, tier: Tier, rpm: Option<u32>) -> (KeyId, String) {
        let pepper = moderato::load_pepper(&self.config).expect("pepper");
        let new = moderato::access::keys::generate(&pepper);
        let record = ApiKeyRecord {
            id: new.id.clone(),
            name: "test".into(),
            tier,
            custom_rpm: rpm,
            owner: moderato::access::KeyOwner::Operator,
            secret_hash: new.secret_hash,
            created_at: chrono::Utc::now(),
            revoked_at: None,
            policy_id: None,
            policy: None,
        };
        self.store.insert_key(&record).await.expect("insert key");
        (new.id, new.full_key)
    }

    pub async fn moderate(&self, key: &str, body: &Value) -> reqwest::Response {
        self.client
            .post(format!("{}/v1/moderate", self.base))
            .header("x-api-key", key)
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn moderate_text(&self, key: &str, text: &str) -> reqwest::Response {
        self.moderate(
            key,
            &serde_json::json!({"input": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// Stops the service gracefully and waits for it.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(server) = self.server.take() {
            server.await.expect("server task").expect("server result");
        }
    }

    /// Usage events once the writer has caught up with `expected` events.
    pub async fn usage_events(&self, expected: usize) -> Vec<UsageEvent> {
        let mut events = Vec::new();
        for _ in 0..200 {
            events = self.store.usage_events(None).await.expect("usage events");
            if events.len() >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        events
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A second replica of `first`: the same database, pepper, signing key and
/// Redis, its own usage journal. Returns its base URL and its shutdown.
pub async fn spawn_second_replica(first: &TestApp) -> (String, CancellationToken) {
    let mut config = first.config.clone();
    config.usage.journal_dir = first._dir.path().join("second-journal");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    tokio::spawn(moderato::run(config, listener, shutdown.clone()));
    for _ in 0..200 {
        let ready = first.client.get(format!("{base}/ready")).send().await;
        if ready.is_ok_and(|r| r.status() == 200) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (base, shutdown)
}

/// Status, headers and parsed body of a response.
pub async fn parts(response: reqwest::Response) -> (u16, reqwest::header::HeaderMap, Value) {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.bytes().await.expect("body");
    let body =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("body is not JSON: {bytes:?}"));
    (status, headers, body)
}

/// Asserts the error object's shape and code, returns its message.
pub fn error_message(body: &Value, code: &str) -> String {
    assert_eq!(body["error"]["code"], code, "body: {body}");
    let message = body["error"]["message"]
        .as_str()
        .expect("message is a string")
        .to_string();
    assert!(!message.is_empty());
    message
}

/// A TCP proxy in front of a real server, which a test can cut off and
/// restore: "the database is unreachable" without stopping the database.
pub struct Proxy {
    pub port: u16,
    open: Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl Proxy {
    pub async fn start(target: &str) -> Proxy {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let open = Arc::new(AtomicBool::new(true));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let target = target.to_string();
        let (accept_open, accept_cut) = (open.clone(), cut.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if !accept_open.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let mut cut_rx = accept_cut.subscribe();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.changed() => {}
                    }
                });
            }
        });
        Proxy { port, open, cut }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut_off(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    pub fn restore(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The request a client sent, as its verifier knows it: a response is
/// verified as the answer to this request.
#[derive(Clone, Debug)]
pub struct SentRequest {
    pub method: &'static str,
    pub path: String,
    pub body: Vec<u8>,
    pub nonce: Option<String>,
}

impl SentRequest {
    /// A POST of `body` as `reqwest`'s `.json(body)` sends it.
    pub fn post_json(path: &str, body: &Value) -> SentRequest {
        SentRequest {
            method: "POST",
            path: path.to_string(),
            body: serde_json::to_vec(body).expect("json"),
            nonce: None,
        }
    }

    pub fn get(path: &str) -> SentRequest {
        SentRequest {
            method: "GET",
            path: path.to_string(),
            body: Vec::new(),
            nonce: None,
        }
    }

    pub fn with_nonce(mut self, nonce: &str) -> SentRequest {
        self.nonce = Some(nonce.to_string());
        self
    }
}

/// Verifies a response's signature with the independent Python verifier,
/// as the answer to `request`.
pub fn verify_signature(
    jwks: &Value,
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &[u8],
    request: &SentRequest,
) -> Result<(), String> {
    use base64::Engine;
    use std::io::Write;
    let header_map: serde_json::Map<String, Value> = headers
        .iter()
        .filter_map(|(k, v)| {
            Some((
                k.as_str().to_string(),
                Value::String(v.to_str().ok()?.to_string()),
            ))
        })
        .collect();
    let input = serde_json::json!({
        "jwks": jwks,
        "status": status,
        "headers": header_map,
        "body_b64": base64::engine::general_purpose::STANDARD.encode(body),
        "request": {
            "method": request.method,
            "path": request.path,
            "body_b64": base64::engine::general_purpose::STANDARD.encode(&request.body),
            "nonce": request.nonce,
        },
    });
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/verify_signature.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = std::process::Command::new(python)
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 with the cryptography package (see README)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.to_string().as_bytes())
        .expect("write");
    let output = child.wait_with_output().expect("verifier");
    let said = String::from_utf8_lossy(&output.stdout).trim().to_string();
    if output.status.success() {
        Ok(())
    } else {
        Err(said)
    }
}

/// Generates a `sqlite` and a `postgres` test in a module named after each
/// function: `async fn name(Backend)`, or, after `with runner:`, any
/// function that `runner(Backend, name)` runs (the store suite's).
#[macro_export]
macro_rules! on_both_backends {
    (with $runner:path: $($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    $runner($crate::helpers::Backend::Sqlite, super::$name).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    $runner($crate::helpers::Backend::Postgres, super::$name).await
                }
            }
        )*
    };
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::helpers::Backend::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name($crate::helpers::Backend::Postgres).await
                }
            }
        )*
    };
}

#[test]
fn test_urls_replace_only_the_database() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "t1"),
        "postgres://postgres@127.0.0.1:5432/t1"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=disable", "t2"),
        "postgres://u:p@h/t2?sslmode=disable"
    );
    assert_eq!(
        with_database("postgres://h:5432", "t3"),
        "postgres://h:5432/t3"
    );
}
