//! What the dashboard tests share: a browser-less session (reqwest without
//! redirects and a cookie jar kept by hand, so that every `Set-Cookie` can be
//! inspected), small HTML look-ups by the contract's selectors, and the real
//! `moderato accounts` command for making accounts.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use regex::Regex;
use serde_json::Value;

use crate::helpers::TestApp;

/// A password long enough for the dashboard's rule (12 characters or more).
pub const PASSWORD: &str = "correct horse battery staple";

/// One answer of the dashboard, read whole.
#[derive(Debug)]
pub struct Page {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Page {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn location(&self) -> &str {
        self.header("location")
            .unwrap_or_else(|| panic!("no Location header (status {})", self.status))
    }

    /// Every `Set-Cookie` header, raw.
    pub fn set_cookies(&self) -> Vec<String> {
        self.headers
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect()
    }

    /// The hidden CSRF token of the page's (first) form.
    pub fn csrf(&self) -> String {
        input_value(&self.body, "csrf_token")
            .unwrap_or_else(|| panic!("no csrf_token input in the page:\n{}", self.body))
    }

    pub fn testid_text(&self, id: &str) -> Option<String> {
        testid_text(&self.body, id)
    }

    pub fn has_testid(&self, id: &str) -> bool {
        self.body.contains(&format!("data-testid=\"{id}\""))
    }

    /// 303 to the path `to` (a full URL with that path is accepted too).
    pub fn assert_see_other(&self, to: &str) {
        assert_eq!(
            self.status, 303,
            "expected 303 to {to}; body:\n{}",
            self.body
        );
        let location = self.location();
        assert!(
            location == to || location.ends_with(to),
            "303 to {location:?}, expected {to:?}"
        );
    }
}

/// A browser-less user of the dashboard: keeps its own cookies (name →
/// value), sends them on every request, and can pretend to come from another
/// address through a trusted proxy's `X-Forwarded-For`.
pub struct Session {
    base: String,
    http: reqwest::Client,
    pub cookies: BTreeMap<String, String>,
    pub forwarded_for: Option<String>,
}

impl Session {
    pub fn new(app: &TestApp) -> Session {
        Session {
            base: app.base.clone(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            cookies: BTreeMap::new(),
            forwarded_for: None,
        }
    }

    pub fn from_address(app: &TestApp, address: &str) -> Session {
        let mut session = Session::new(app);
        session.forwarded_for = Some(address.to_string());
        session
    }

    fn cookie_header(&self) -> Option<String> {
        (!self.cookies.is_empty()).then(|| {
            self.cookies
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    async fn send(&mut self, request: reqwest::RequestBuilder) -> Page {
        let mut request = request;
        if let Some(cookie) = self.cookie_header() {
            request = request.header("cookie", cookie);
        }
        if let Some(address) = &self.forwarded_for {
            request = request.header("x-forwarded-for", address);
        }
        let response = request.send().await.expect("dashboard request");
        let page = Page {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.text().await.expect("body"),
        };
        for raw in page.set_cookies() {
            self.store_cookie(&raw);
        }
        page
    }

    /// Keeps or (when expired) drops one `Set-Cookie`.
    fn store_cookie(&mut self, raw: &str) {
        let cookie = SetCookie::parse(raw);
        if cookie.removes() {
            self.cookies.remove(&cookie.name);
        } else {
            self.cookies.insert(cookie.name, cookie.value);
        }
    }

    pub async fn get(&mut self, path: &str) -> Page {
        let request = self.http.get(format!("{}{path}", self.base));
        self.send(request).await
    }

    pub async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Page {
        let request = self.http.post(format!("{}{path}", self.base)).form(form);
        self.send(request).await
    }

    /// A POST with extra request headers (what a browser adds: `Origin`,
    /// `Sec-Fetch-Site`).
    pub async fn post_with_headers(
        &mut self,
        path: &str,
        form: &[(&str, &str)],
        headers: &[(&str, &str)],
    ) -> Page {
        let mut request = self.http.post(format!("{}{path}", self.base)).form(form);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        self.send(request).await
    }

    /// GET the login page, then POST the credentials with its token.
    pub async fn sign_in(&mut self, email: &str, password: &str) -> Page {
        let login = self.get("/dashboard/login").await;
        assert_eq!(login.status, 200, "login page: {}", login.body);
        let csrf = login.csrf();
        self.post(
            "/dashboard/login",
            &[
                ("email", email),
                ("password", password),
                ("csrf_token", csrf.as_str()),
            ],
        )
        .await
    }

    /// Signs in and asserts the contract's answer: 303 to the keys page.
    pub async fn signed_in(app: &TestApp, email: &str, password: &str) -> Session {
        let mut session = Session::new(app);
        let page = session.sign_in(email, password).await;
        page.assert_see_other("/dashboard/keys");
        session
    }

    /// A CSRF token of this session, taken from a page with a form.
    pub async fn csrf(&mut self, path: &str) -> String {
        let page = self.get(path).await;
        assert_eq!(page.status, 200, "{path}: {}", page.body);
        page.csrf()
    }

    /// Creates a key in the dashboard; returns its id and secret.
    pub async fn create_key(&mut self, name: &str) -> (String, String) {
        let csrf = self.csrf("/dashboard/keys").await;
        let page = self
            .post(
                "/dashboard/keys",
                &[("name", name), ("csrf_token", csrf.as_str())],
            )
            .await;
        assert_eq!(page.status, 200, "create key: {}", page.body);
        let secret = page
            .testid_text("new-key")
            .unwrap_or_else(|| panic!("no new-key element:\n{}", page.body));
        let id = key_id_of(&secret);
        (id, secret)
    }
}

/// One `Set-Cookie` header: name, value and attributes (lower-cased names).
#[derive(Debug)]
pub struct SetCookie {
    pub name: String,
    pub value: String,
    pub attributes: BTreeMap<String, String>,
}

impl SetCookie {
    pub fn parse(raw: &str) -> SetCookie {
        let mut parts = raw.split(';');
        let (name, value) = parts
            .next()
            .and_then(|p| p.split_once('='))
            .unwrap_or_else(|| panic!("malformed Set-Cookie {raw:?}"));
        let attributes = parts
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.trim().to_ascii_lowercase(), v.trim().to_string())
            })
            .collect();
        SetCookie {
            name: name.trim().to_string(),
            value: value.trim().to_string(),
            attributes,
        }
    }

    pub fn has(&self, attribute: &str) -> bool {
        self.attributes
            .contains_key(&attribute.to_ascii_lowercase())
    }

    pub fn get(&self, attribute: &str) -> Option<&str> {
        self.attributes
            .get(&attribute.to_ascii_lowercase())
            .map(String::as_str)
    }

    /// An empty value or a zero/negative Max-Age: the cookie is being deleted.
    fn removes(&self) -> bool {
        self.value.is_empty()
            || self
                .get("max-age")
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|age| age <= 0)
    }
}

/// The id part of `mdr_<id>_<secret>`.
pub fn key_id_of(secret: &str) -> String {
    let rest = secret
        .strip_prefix("mdr_")
        .unwrap_or_else(|| panic!("{secret:?} is not an mdr_ key"));
    rest.split('_').next().expect("id").to_string()
}

/// The secret part of an `mdr_<id>_<secret>` key. Not `rsplit('_')`: the
/// secret is URL-safe base64, which has underscores of its own, so its last
/// piece can be a couple of characters that any page contains by chance.
pub fn key_secret_of(secret: &str) -> String {
    let id = key_id_of(secret);
    secret[format!("mdr_{id}_").len()..].to_string()
}

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("regex")
}

/// Markup to text: tags dropped, entities of the usual five decoded,
/// whitespace collapsed.
pub fn text_of(html: &str) -> String {
    let stripped = regex(r"(?s)<[^>]*>").replace_all(html, " ");
    let decoded = stripped
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&amp;", "&");
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The `value` of the `<input>` named `name`.
pub fn input_value(html: &str, name: &str) -> Option<String> {
    let input = regex(&format!(
        r#"(?s)<input\b[^>]*\bname="{}"[^>]*>"#,
        regex::escape(name)
    ));
    let tag = input.find(html)?.as_str();
    let value = regex(r#"\bvalue="([^"]*)""#);
    value.captures(tag).map(|c| c[1].to_string())
}

/// The text of the first element carrying `data-testid="{id}"` (its content
/// up to the element's closing tag; nested markup is dropped).
pub fn testid_text(html: &str, id: &str) -> Option<String> {
    let element = regex(&format!(
        r#"(?s)<([a-zA-Z][a-zA-Z0-9]*)\b[^>]*\bdata-testid="{}"[^>]*>(.*?)</([a-zA-Z][a-zA-Z0-9]*)>"#,
        regex::escape(id)
    ));
    if let Some(captures) = element.captures(html) {
        if !captures[1].eq_ignore_ascii_case("input") {
            return Some(text_of(&captures[2]));
        }
    }
    // A read-only input shows its value.
    let input = regex(&format!(
        r#"(?s)<input\b[^>]*\bdata-testid="{}"[^>]*>"#,
        regex::escape(id)
    ));
    let tag = input.find(html)?.as_str();
    regex(r#"\bvalue="([^"]*)""#)
        .captures(tag)
        .map(|c| text_of(&c[1]))
}

/// The inner HTML of each `<tr>` whose attribute `attribute` is set, by
/// that attribute's value.
pub fn rows(html: &str, attribute: &str) -> BTreeMap<String, String> {
    let row = regex(&format!(
        r#"(?s)<tr\b[^>]*\b{}="([^"]*)"[^>]*>(.*?)</tr>"#,
        regex::escape(attribute)
    ));
    row.captures_iter(html)
        .map(|c| (c[1].to_string(), c[2].to_string()))
        .collect()
}

/// The text of the cell `data-col="{column}"` in a row's inner HTML.
pub fn cell(row: &str, column: &str) -> String {
    let cell = regex(&format!(
        r#"(?s)<t[dh]\b[^>]*\bdata-col="{}"[^>]*>(.*?)</t[dh]>"#,
        regex::escape(column)
    ));
    cell.captures(row)
        .map(|c| text_of(&c[1]))
        .unwrap_or_else(|| panic!("no cell data-col={column:?} in row:\n{row}"))
}

/// A numeric cell (digits only, thousands separators allowed).
pub fn number_cell(row: &str, column: &str) -> u64 {
    let text = cell(row, column);
    text.replace([',', ' ', '\u{a0}'], "")
        .parse()
        .unwrap_or_else(|_| panic!("cell {column} is not a number: {text:?}"))
}

/// The key rows of the keys page, by key id.
pub fn key_rows(html: &str) -> BTreeMap<String, String> {
    rows(html, "data-key-id")
}

/// The usage table's rows (`requests`, `items`, `rate_limited`) by day.
pub fn usage_rows(html: &str) -> BTreeMap<String, [u64; 3]> {
    let table = regex(r#"(?s)<table\b[^>]*data-testid="usage-table"[^>]*>(.*?)</table>"#)
        .captures(html)
        .unwrap_or_else(|| panic!("no usage-table in the page:\n{html}"))[1]
        .to_string();
    rows(&table, "data-day")
        .into_iter()
        .map(|(day, row)| {
            let figures = [
                number_cell(&row, "requests"),
                number_cell(&row, "items"),
                number_cell(&row, "rate_limited"),
            ];
            (day, figures)
        })
        .collect()
}

/// The security headers every dashboard page carries.
pub fn assert_security_headers(what: &str, page: &Page) {
    assert_eq!(
        page.header("content-security-policy"),
        Some("default-src 'self'; frame-ancestors 'none'"),
        "{what}: Content-Security-Policy"
    );
    assert_eq!(
        page.header("x-content-type-options"),
        Some("nosniff"),
        "{what}: X-Content-Type-Options"
    );
    assert_eq!(
        page.header("referrer-policy"),
        Some("same-origin"),
        "{what}: Referrer-Policy"
    );
}

/// Output of one run of the real binary.
pub struct CliOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `moderato args…`, asserting success; its standard output as JSON.
pub fn cli_json(app: &TestApp, args: &[&str]) -> Value {
    let out = moderato(app, args, "");
    assert!(out.success, "moderato {args:?} failed: {}", out.stderr);
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|_| panic!("moderato {args:?} printed {:?}", out.stdout))
}

/// Runs `moderato args…` against the app's database and pepper, with
/// `stdin` on its standard input.
pub fn moderato(app: &TestApp, args: &[&str], stdin: &str) -> CliOutput {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moderato"))
        .args(args)
        .env("MODERATO_DATABASE_URL", &app.db.url)
        .env("MODERATO_AUTH__PEPPER_FILE", &app.config.auth.pepper_file)
        .env("MODERATO_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run moderato");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let output = child.wait_with_output().expect("moderato output");
    CliOutput {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// An account made as the operator makes it: `moderato accounts create
/// --password-stdin --json`. Returns the printed `{"id","email","role"}`.
pub fn create_account(app: &TestApp, email: &str, role: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "accounts",
        "create",
        "--email",
        email,
        "--role",
        role,
        "--password-stdin",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = moderato(app, &args, &format!("{PASSWORD}\n"));
    assert!(out.success, "accounts create failed: {}", out.stderr);
    serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|_| panic!("accounts create --json printed {:?}", out.stdout))
}

/// Calls `/v1/moderate` with `key` until it answers `status`, for at most
/// `within`; returns how long it took, or panics with the last status.
pub async fn until_api_answers(
    app: &TestApp,
    key: &str,
    status: u16,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    loop {
        let got = app.moderate_text(key, "hello").await.status().as_u16();
        if got == status {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < within,
            "the API still answered {got} (not {status}) after {:?}",
            start.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
