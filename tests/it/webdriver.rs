//! Headless Chromium through chromedriver, for the browser tests: a
//! chromedriver of our own on a free port (killed with its browsers when the
//! test ends, passed or not), a fresh profile, and screenshots of pages.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;

const INSTALL_HINT: &str = "the browser tests need Debian's chromium and chromium-driver: \
     apt-get install -y chromium chromium-driver \
     (or set CHROMEDRIVER and CHROME_BIN to their paths)";

fn chromedriver_path() -> PathBuf {
    std::env::var_os("CHROMEDRIVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromedriver"))
}

fn chrome_path() -> PathBuf {
    std::env::var_os("CHROME_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// Where screenshots go: `$MODERATO_SCREENSHOT_DIR`, else
/// `target/screenshots/`.
pub fn screenshot_dir() -> PathBuf {
    std::env::var_os("MODERATO_SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/screenshots"))
}

/// A running chromedriver, in a process group of its own so that dropping
/// it also ends the browsers it started.
struct Driver {
    process: Child,
    port: u16,
}

impl Driver {
    async fn start() -> Driver {
        let path = chromedriver_path();
        assert!(
            path.exists(),
            "{} is missing: {INSTALL_HINT}",
            path.display()
        );
        assert!(
            chrome_path().exists(),
            "{} is missing: {INSTALL_HINT}",
            chrome_path().display()
        );
        let port = free_port();
        let process = {
            use std::os::unix::process::CommandExt;
            Command::new(&path)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}; {INSTALL_HINT}", path.display()))
        };
        let driver = Driver { process, port };
        driver.wait_until_ready().await;
        driver
    }

    async fn wait_until_ready(&self) {
        let status = format!("http://127.0.0.1:{}/status", self.port);
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(response) = client.get(&status).send().await {
                if response.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "chromedriver did not answer on port {} within 20 s",
            self.port
        );
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The whole group: chromedriver and the Chromium processes under it.
        let group = format!("-{}", self.process.id());
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.process.wait();
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// One headless Chromium with a fresh profile, driven over WebDriver.
pub struct Browser {
    pub client: Client,
    base: String,
    // Dropped after the client: first the browser, then its profile.
    _driver: Driver,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// A browser for the service at `base` (`http://127.0.0.1:port`).
    pub async fn start(base: &str) -> Browser {
        let driver = Driver::start().await;
        let profile = tempfile::tempdir().expect("profile dir");
        let args = vec![
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            format!("--user-data-dir={}", profile.path().display()),
            "--window-size=1280,900".into(),
        ];
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({ "binary": chrome_path(), "args": args }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", driver.port))
            .await
            .unwrap_or_else(|e| {
                panic!("chromedriver would not start Chromium: {e}; {INSTALL_HINT}")
            });
        Browser {
            client,
            base: base.to_string(),
            _driver: driver,
            _profile: profile,
        }
    }

    pub async fn goto(&self, path: &str) {
        self.client
            .goto(&format!("{}{path}", self.base))
            .await
            .unwrap_or_else(|e| panic!("goto {path}: {e}"));
    }

    /// The current URL's path and query.
    pub async fn path(&self) -> String {
        let url = self.client.current_url().await.expect("current url");
        match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        }
    }

    /// Waits (at most 10 s) until the current path is `path`.
    pub async fn wait_for_path(&self, path: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.path().await;
            if now == path {
                return;
            }
            assert!(Instant::now() < deadline, "at {now}, expected {path}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn find(&self, css: &str) -> fantoccini::elements::Element {
        let found = self
            .client
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await;
        match found {
            Ok(element) => element,
            Err(e) => panic!("no element {css} on {}: {e}", self.path().await),
        }
    }

    pub async fn exists(&self, css: &str) -> bool {
        !self
            .client
            .find_all(Locator::Css(css))
            .await
            .expect("find_all")
            .is_empty()
    }

    /// The element's visible text, or its value for a form field.
    pub async fn text(&self, css: &str) -> String {
        let element = self.find(css).await;
        let text = element.text().await.expect("text");
        if !text.trim().is_empty() {
            return text.trim().to_string();
        }
        let value = element.prop("value").await.expect("value");
        value.unwrap_or_default().trim().to_string()
    }

    pub async fn fill(&self, css: &str, value: &str) {
        let field = self.find(css).await;
        field.clear().await.expect("clear");
        field.send_keys(value).await.expect("type");
    }

    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click {css}: {e}"));
    }

    /// Clicks what submits a form or follows a link, then waits (at most
    /// 10 s) until the next page has replaced this one and finished loading.
    /// Reading right after a plain click can find the element on the page
    /// being left, which either goes stale in the hand or holds the old
    /// value; a page that redirects to itself (a policy's update) gives no
    /// new path to wait for. So this page is marked, and the wait is for a
    /// loaded document without the mark. A script can fail while the
    /// documents change over: such failures mean "not yet".
    pub async fn submit(&self, css: &str) {
        self.client
            .execute("window.__moderatoLeaving = true", vec![])
            .await
            .expect("mark the page being left");
        self.click(css).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let arrived = self
                .client
                .execute(
                    "return window.__moderatoLeaving !== true && document.readyState === 'complete'",
                    vec![],
                )
                .await;
            if matches!(arrived, Ok(serde_json::Value::Bool(true))) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{css} did not lead to a new page (at {}: {arrived:?})",
                self.path().await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Saves a PNG of the window as `<name>.png` in the screenshot folder.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).expect("screenshot dir");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write screenshot");
        path
    }

    /// Ends the WebDriver session (closes Chromium) before the driver goes.
    pub async fn close(self) {
        let Browser { client, .. } = self;
        let _ = client.close().await;
    }
}
