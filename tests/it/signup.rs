//! Open sign-up confirms the address (#26, finding 6): the account stays
//! unusable until the one-time link e-mailed to it is followed, and the
//! password is chosen there. The mail goes through a real SMTP server on
//! loopback (Python's aiosmtpd, `tests/smtp_sink.py`), and the tests follow
//! the link from the message it received. Both backends.

use std::process::Stdio;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use moderato::config::{
    ImageClassifierKind, IpBlock, Signup, SmtpSecurity, SmtpSettings, TextClassifierKind,
};

use crate::dash_client::*;
use crate::helpers::*;
use crate::on_both_backends;

/// What links in the e-mails start with (never the test server's address:
/// links are built from the configuration, not from the request).
const PUBLIC_URL: &str = "https://moderato.example";

/// One message the SMTP server received.
#[derive(Debug, Deserialize)]
pub struct Mail {
    pub to: Vec<String>,
    pub subject: String,
    pub body: String,
}

impl Mail {
    /// The sign-up link's path and query, checked to start with the
    /// configured public address.
    pub fn link_path(&self) -> String {
        let link = Regex::new(r"https?://\S+/dashboard/set-password\?token=[A-Za-z0-9_-]+")
            .unwrap()
            .find(&self.body)
            .unwrap_or_else(|| panic!("no set-password link in {:?}", self.body))
            .as_str()
            .to_owned();
        let path = link
            .strip_prefix(PUBLIC_URL)
            .unwrap_or_else(|| panic!("{link} does not start with {PUBLIC_URL}"));
        path.to_owned()
    }

    fn has_link(&self) -> bool {
        self.body.contains("token=")
    }
}

/// A real SMTP server on a free loopback port, for as long as it lives.
pub struct MailServer {
    _child: Child,
    messages: Lines<BufReader<ChildStdout>>,
    pub port: u16,
}

impl MailServer {
    /// `refuse`: answer every message with 554, as a server that will not
    /// relay does.
    pub async fn start(refuse: bool) -> MailServer {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/smtp_sink.py");
        let mut command = Command::new(python);
        command.arg(script);
        if refuse {
            command.arg("--refuse");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 with aiosmtpd (see README)");
        let mut messages = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), messages.next_line())
            .await
            .expect("the SMTP server started")
            .expect("its output")
            .expect("python3 with aiosmtpd==1.4.6 (pip install aiosmtpd==1.4.6)");
        let port = serde_json::from_str::<Value>(&first).expect("{\"port\": N}")["port"]
            .as_u64()
            .expect("a port") as u16;
        MailServer {
            _child: child,
            messages,
            port,
        }
    }

    /// The next message, within 10 s.
    pub async fn next(&mut self) -> Mail {
        self.within(Duration::from_secs(10))
            .await
            .expect("a message within 10 s")
    }

    /// The next message if one arrives within `wait`.
    pub async fn within(&mut self, wait: Duration) -> Option<Mail> {
        let line = tokio::time::timeout(wait, self.messages.next_line())
            .await
            .ok()?
            .expect("the SMTP server's output")
            .expect("the SMTP server is running");
        Some(serde_json::from_str(&line).expect("a message as JSON"))
    }

    fn settings(&self) -> SmtpSettings {
        SmtpSettings {
            host: "127.0.0.1".into(),
            port: Some(self.port),
            security: SmtpSecurity::None,
            username: None,
            password: None,
            from: "Moderato <no-reply@moderato.example>".into(),
            timeout_ms: 5_000,
        }
    }
}

/// The app with open sign-up mailing through `mail`, behind a trusted proxy
/// (so each test client can have an address of its own).
pub async fn app_with_open_signup(backend: Backend, mail: &MailServer) -> TestApp {
    let smtp = mail.settings();
    spawn_app_with(backend, |c| {
        c.text_classifier = TextClassifierKind::Lexical;
        c.image_classifier = ImageClassifierKind::None;
        c.dashboard.signup = Signup::Open;
        c.dashboard.public_url = Some(PUBLIC_URL.into());
        c.smtp = Some(smtp);
        c.auth.trusted_proxies = vec![IpBlock::try_from("127.0.0.1".to_string()).unwrap()];
    })
    .await
}

/// Fills in the sign-up form from client `address`.
async fn sign_up(app: &TestApp, address: &str, email: &str) -> Page {
    let mut session = Session::from_address(app, address);
    let form = session.get("/dashboard/signup").await;
    assert_eq!(form.status, 200, "{}", form.body);
    assert!(
        !form.body.contains(r#"name="password""#),
        "the password is chosen after the link, not on the sign-up form"
    );
    let csrf = form.csrf();
    session
        .post(
            "/dashboard/signup",
            &[("email", email), ("csrf_token", csrf.as_str())],
        )
        .await
}

/// Follows a set-password link as its reader would: the form, then the
/// new password.
async fn set_password_through(app: &TestApp, path: &str, password: &str) -> Page {
    let mut session = Session::new(app);
    let form = session.get(path).await;
    if form.status != 200 {
        return form;
    }
    session
        .post(
            path,
            &[("password", password), ("csrf_token", form.csrf().as_str())],
        )
        .await
}

fn account(app: &TestApp, email: &str) -> Option<Value> {
    let out = moderato(app, &["accounts", "list", "--json"], "");
    assert!(out.success, "{}", out.stderr);
    let all: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    all.as_array()
        .expect("an array")
        .iter()
        .find(|a| a["email"] == email)
        .cloned()
}

/// An answer without what differs by design in every response: the date,
/// the request id, the signature over them and the form tokens.
fn comparable(page: &Page) -> (u16, String) {
    let body = Regex::new(r#"name="csrf_token" value="[^"]*""#)
        .unwrap()
        .replace_all(&page.body, r#"name="csrf_token" value="<token>""#)
        .into_owned();
    (page.status, body)
}

async fn a_sign_up_is_confirmed_by_the_emailed_link(backend: Backend) {
    let mut mail = MailServer::start(false).await;
    let app = app_with_open_signup(backend, &mail).await;

    let page = sign_up(&app, "203.0.113.10", "Carol@Example.com").await;
    assert_eq!(page.status, 200, "{}", page.body);
    let sent = page.testid_text("sent").expect("what to do next");
    assert!(sent.contains("carol@example.com"), "{sent}");
    assert!(
        !page.body.contains("token="),
        "the link is only in the e-mail"
    );

    // Nothing is usable before the link: no password exists to sign in with.
    let unconfirmed = account(&app, "carol@example.com").expect("an account row");
    assert_eq!(unconfirmed["awaiting_confirmation"], true);
    let attempt = Session::new(&app)
        .sign_in("carol@example.com", "any password at all")
        .await;
    assert_eq!(attempt.status, 401);

    let message = mail.next().await;
    assert_eq!(message.to, vec!["carol@example.com".to_string()]);
    assert!(message.subject.contains("Confirm"), "{}", message.subject);
    let path = message.link_path();

    let set = set_password_through(&app, &path, PASSWORD).await;
    set.assert_see_other("/dashboard/login");
    Session::signed_in(&app, "carol@example.com", PASSWORD).await;
    assert_eq!(
        account(&app, "carol@example.com").unwrap()["awaiting_confirmation"],
        false
    );

    // The link works once.
    let again = set_password_through(&app, &path, "another password 123").await;
    assert_eq!(again.status, 400, "{}", again.body);
    Session::signed_in(&app, "carol@example.com", PASSWORD).await;
}

/// The finding: a stranger who signs up with someone else's address first
/// neither gets in nor keeps its owner from signing up.
async fn a_stranger_who_signs_up_first_does_not_lock_the_owner_out(backend: Backend) {
    let mut mail = MailServer::start(false).await;
    let app = app_with_open_signup(backend, &mail).await;

    let stranger = sign_up(&app, "198.51.100.7", "victim@example.com").await;
    assert_eq!(stranger.status, 200, "{}", stranger.body);
    // The link went to the owner's mailbox, not to the stranger.
    let first = mail.next().await;
    assert_eq!(first.to, vec!["victim@example.com".to_string()]);

    // The owner, later and elsewhere, signs up too and gets a link.
    let owner = sign_up(&app, "203.0.113.20", "victim@example.com").await;
    assert_eq!(comparable(&owner), comparable(&stranger));
    let second = mail.next().await;
    assert_eq!(second.to, vec!["victim@example.com".to_string()]);
    assert_ne!(first.link_path(), second.link_path(), "a new link");

    set_password_through(&app, &second.link_path(), PASSWORD)
        .await
        .assert_see_other("/dashboard/login");
    Session::signed_in(&app, "victim@example.com", PASSWORD).await;
    // The owner's link ended the one the stranger caused.
    let stale = set_password_through(&app, &first.link_path(), "stranger's choice 1").await;
    assert_eq!(stale.status, 400, "{}", stale.body);
    Session::signed_in(&app, "victim@example.com", PASSWORD).await;
}

async fn sign_up_does_not_tell_whether_an_email_is_taken(backend: Backend) {
    let mut mail = MailServer::start(false).await;
    let app = app_with_open_signup(backend, &mail).await;
    create_account(&app, "alice@example.com", "customer", &["--tier", "free"]);

    let taken = sign_up(&app, "203.0.113.40", "alice@example.com").await;
    let new = sign_up(&app, "203.0.113.41", "bob@example.com").await;
    assert_eq!(taken.status, 200, "{}", taken.body);
    // The same page, but for the address it names.
    let (status, body) = comparable(&taken);
    assert_eq!(
        (status, body.replace("alice@example.com", "bob@example.com")),
        comparable(&new)
    );

    // The same work behind it: one message each. Alice's says someone
    // tried, and carries no link; nothing changed for her.
    let to_alice = mail.next().await;
    let to_bob = mail.next().await;
    assert_eq!(to_alice.to, vec!["alice@example.com".to_string()]);
    assert!(!to_alice.has_link(), "{}", to_alice.body);
    assert!(to_alice.body.contains(PUBLIC_URL), "{}", to_alice.body);
    assert_eq!(to_bob.to, vec!["bob@example.com".to_string()]);
    assert!(to_bob.has_link());
    assert!(mail.within(Duration::from_millis(500)).await.is_none());
    Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    assert_eq!(
        account(&app, "alice@example.com").unwrap()["awaiting_confirmation"],
        false
    );
}

async fn sign_ups_are_bounded_per_address(backend: Backend) {
    let mut mail = MailServer::start(false).await;
    let app = app_with_open_signup(backend, &mail).await;
    for i in 0..5 {
        let page = sign_up(&app, "203.0.113.70", &format!("bulk{i}@example.com")).await;
        assert_eq!(page.status, 200, "{}", page.body);
        mail.next().await;
    }
    let refused = sign_up(&app, "203.0.113.70", "bulk5@example.com").await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let retry: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("seconds");
    assert!((3500..=3600).contains(&retry), "Retry-After {retry}");
    assert!(refused
        .testid_text("error")
        .is_some_and(|m| m.contains("Too many")));
    assert!(account(&app, "bulk5@example.com").is_none());
    assert!(
        mail.within(Duration::from_millis(500)).await.is_none(),
        "no mail for a refused sign-up"
    );

    // Another address is not affected.
    let page = sign_up(&app, "203.0.113.71", "bulk5@example.com").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(mail.next().await.to, vec!["bulk5@example.com".to_string()]);
}

/// A mail server that refuses the message: the sign-up says to try again
/// (the same for a taken address), and a later attempt sends a link that
/// works.
async fn a_refused_message_asks_to_try_again(backend: Backend) {
    let refusing = MailServer::start(true).await;
    let app = app_with_open_signup(backend, &refusing).await;
    create_account(&app, "alice@example.com", "customer", &["--tier", "free"]);
    let new = sign_up(&app, "203.0.113.80", "dora@example.com").await;
    let taken = sign_up(&app, "203.0.113.81", "alice@example.com").await;
    assert_eq!(new.status, 503, "{}", new.body);
    assert!(new
        .testid_text("error")
        .is_some_and(|m| m.contains("could not send the e-mail")));
    let (status, body) = comparable(&taken);
    assert_eq!(
        (
            status,
            body.replace("alice@example.com", "dora@example.com")
        ),
        comparable(&new)
    );
    assert!(
        !new.body.contains("Relay access denied"),
        "the server's answer stays in the log"
    );
}

/// The accounts whose e-mail starts with `prefix`.
fn accounts_starting_with(app: &TestApp, prefix: &str) -> usize {
    let out = moderato(app, &["accounts", "list", "--json"], "");
    assert!(out.success, "{}", out.stderr);
    let all: Value = serde_json::from_str(out.stdout.trim()).expect("JSON");
    all.as_array()
        .expect("an array")
        .iter()
        .filter(|a| a["email"].as_str().is_some_and(|e| e.starts_with(prefix)))
        .count()
}

/// A sign-up form post from `address` for `email`, as raw HTTP/1.1 bytes
/// with the form's cookie and token (so that it can be sent in two parts).
async fn raw_sign_up(app: &TestApp, address: &str, email: &str) -> Vec<u8> {
    let mut session = Session::from_address(app, address);
    let form = session.get("/dashboard/signup").await;
    assert_eq!(form.status, 200, "{}", form.body);
    let body = format!(
        "email={}&csrf_token={}",
        email.replace('@', "%40"),
        form.csrf()
    );
    let cookie = session
        .cookies
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("; ");
    let host = app.base.trim_start_matches("http://");
    format!(
        "POST /dashboard/signup HTTP/1.1\r\nHost: {host}\r\nCookie: {cookie}\r\n\
         X-Forwarded-For: {address}\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len(),
    )
    .into_bytes()
}

/// Issue #58, C: sign-ups from one address sent together, each with its
/// last byte held back and then all released at once, make at most the
/// five accounts an hour an address may make.
async fn racing_sign_ups_from_one_address_make_at_most_five_accounts(backend: Backend) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mail = MailServer::start(false).await;
    let app = app_with_open_signup(backend, &mail).await;
    let mut sockets = Vec::new();
    for i in 0..100 {
        let request = raw_sign_up(&app, "203.0.113.90", &format!("race{i}@example.com")).await;
        let mut socket = tokio::net::TcpStream::connect(app.base.trim_start_matches("http://"))
            .await
            .expect("connect");
        let (head, last) = request.split_at(request.len() - 1);
        socket.write_all(head).await.expect("send");
        sockets.push((socket, last.to_vec()));
    }
    for (socket, last) in &mut sockets {
        socket.write_all(last).await.expect("send the last byte");
    }
    let mut statuses = Vec::new();
    for (mut socket, _) in sockets {
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), socket.read_to_end(&mut answer))
            .await
            .expect("an answer within 60 s")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer);
        statuses.push(answer.split(' ').nth(1).unwrap_or("none").to_owned());
    }
    let accepted = statuses.iter().filter(|s| *s == "200").count();
    let refused = statuses.iter().filter(|s| *s == "429").count();
    assert_eq!((accepted, refused), (5, 95), "{statuses:?}");
    assert_eq!(accounts_starting_with(&app, "race"), 5);
}

/// Issue #58, C: one recipient gets at most three sign-up e-mails an hour,
/// however many addresses ask; the page past the bound is the same.
async fn one_recipient_gets_a_bounded_number_of_sign_up_mails(backend: Backend) {
    let mut mail = MailServer::start(false).await;
    let app = app_with_open_signup(backend, &mail).await;
    let mut pages = Vec::new();
    for i in 0..6 {
        let page = sign_up(
            &app,
            &format!("198.51.100.{}", 20 + i),
            "victim@example.com",
        )
        .await;
        assert_eq!(page.status, 200, "{}", page.body);
        pages.push(comparable(&page));
    }
    assert!(
        pages.windows(2).all(|w| w[0] == w[1]),
        "the same page each time"
    );
    for _ in 0..MAX_MAILS {
        assert_eq!(mail.next().await.to, vec!["victim@example.com".to_string()]);
    }
    assert!(
        mail.within(Duration::from_millis(1500)).await.is_none(),
        "no more than {MAX_MAILS} e-mails"
    );
    // Another recipient is not affected.
    let page = sign_up(&app, "198.51.100.40", "other@example.com").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert_eq!(mail.next().await.to, vec!["other@example.com".to_string()]);
}

/// `moderato::dashboard::signup::MAX_MAILS_PER_RECIPIENT`, as a user reads it.
const MAX_MAILS: usize = 3;

on_both_backends!(
    racing_sign_ups_from_one_address_make_at_most_five_accounts,
    one_recipient_gets_a_bounded_number_of_sign_up_mails,
    a_sign_up_is_confirmed_by_the_emailed_link,
    a_stranger_who_signs_up_first_does_not_lock_the_owner_out,
    sign_up_does_not_tell_whether_an_email_is_taken,
    sign_ups_are_bounded_per_address,
    a_refused_message_asks_to_try_again,
);
