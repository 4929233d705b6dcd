//! The fetcher against a real HTTP server on 127.0.0.1, written by hand so
//! that it can lie, stall and redirect; the fetcher runs under the test-only
//! policy that lets it connect to loopback (and only loopback besides public
//! addresses).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::moderation::engine::{
    Engine, EngineBudget, EngineError, EngineParts, ImageSource, Item, ItemOutcome,
};
use crate::moderation::image::decode::{DecodedImage, ImageError};
use crate::moderation::text::null::NullClassifier;
use crate::moderation::{Category, ImageClassifier, ImageScores, Thresholds};

const MAX_BYTES: usize = 4096;
const TIMEOUT_MS: u64 = 400;

/// What the fake host does for a path.
enum Reply {
    /// A whole raw response.
    Raw(Vec<u8>),
    /// The header and this body, then the connection is closed: no
    /// Content-Length, so only the cap can stop the reading.
    UntilClose(Vec<u8>),
    /// The header, then nothing, forever.
    StallBody,
    /// Nothing at all, forever.
    StallHead,
}

struct FakeHost {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
}

impl FakeHost {
    async fn start(respond: fn(&str, SocketAddr) -> Reply) -> FakeHost {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(answer(stream, respond, addr));
            }
        });
        FakeHost { addr, connections }
    }

    fn url(&self, path: &str) -> String {
        format!("http://localhost:{}{path}", self.addr.port())
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

async fn answer(mut stream: TcpStream, respond: fn(&str, SocketAddr) -> Reply, addr: SocketAddr) {
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buffer[..n]),
        }
    }
    let text = String::from_utf8_lossy(&request);
    let path = text.split(' ').nth(1).unwrap_or("/").to_owned();
    match respond(&path, addr) {
        Reply::Raw(bytes) => {
            let _ = stream.write_all(&bytes).await;
        }
        Reply::UntilClose(body) => {
            let head = "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nConnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(&body).await;
        }
        Reply::StallBody => {
            let head = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nsome";
            let _ = stream.write_all(head.as_bytes()).await;
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Reply::StallHead => tokio::time::sleep(Duration::from_secs(3600)).await,
    }
    let _ = stream.shutdown().await;
}

fn png() -> Vec<u8> {
    use image::ImageEncoder as _;
    let pixels =
        image::RgbImage::from_fn(16, 12, |x, y| image::Rgb([x as u8 * 15, y as u8 * 20, 90]));
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out)
        .write_image(pixels.as_raw(), 16, 12, image::ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn ok(content_type: &str, body: &[u8]) -> Reply {
    let mut raw = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    Reply::Raw(raw)
}

fn status(code: u16, location: Option<String>) -> Reply {
    let location = location.map_or(String::new(), |l| format!("Location: {l}\r\n"));
    Reply::Raw(format!("HTTP/1.1 {code} X\r\n{location}Content-Length: 0\r\n\r\n").into_bytes())
}

fn routes(path: &str, addr: SocketAddr) -> Reply {
    let port = addr.port();
    match path {
        "/cat.png" => ok("image/png", &png()),
        "/page.html" => ok("image/png", b"<html>not an image</html>"),
        "/declared-too-large" => Reply::Raw(
            format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
                MAX_BYTES + 1
            )
            .into_bytes(),
        ),
        "/streamed-too-large" => Reply::UntilClose(vec![0x89; MAX_BYTES + 1]),
        "/streamed-at-the-limit" => {
            let mut body = png();
            body.resize(MAX_BYTES, 0);
            Reply::UntilClose(body)
        }
        "/stall-body" => Reply::StallBody,
        "/cut-short" => {
            Reply::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n\x89PNG".to_vec())
        }
        "/stall-head" => Reply::StallHead,
        "/missing" => status(404, None),
        "/broken" => status(500, None),
        "/moved" => status(302, Some(format!("http://127.0.0.1:{port}/cat.png"))),
        "/moved-away" => status(301, Some("http://elsewhere.example/cat.png".into())),
        "/moved-inside" => status(302, Some("http://10.0.0.1/cat.png".into())),
        "/moved-to-metadata" => status(302, Some("http://169.254.169.254/latest/".into())),
        "/moved-with-password" => status(
            302,
            Some(format!("http://u:hunter2@127.0.0.1:{port}/cat.png")),
        ),
        "/loop" => status(302, Some("/loop".into())),
        _ => status(404, None),
    }
}

fn settings(hosts: &[&str]) -> RemoteImageSettings {
    RemoteImageSettings {
        enabled: true,
        allowed_hosts: hosts
            .iter()
            .map(|h| AllowedHost::try_from(h.to_string()).unwrap())
            .collect(),
        max_bytes: Some(MAX_BYTES),
        timeout_ms: TIMEOUT_MS,
        max_concurrent_fetches: 4,
        allow_http: true,
    }
}

/// Allowed: loopback by name and literal, and addresses the test redirects
/// to, so that the address rule (not the list) is what refuses them.
fn loopback_fetcher() -> RemoteImages {
    let hosts = ["localhost", "127.0.0.1", "10.0.0.1", "169.254.169.254"];
    let fetcher = Fetcher::new(
        &settings(&hosts),
        &crate::config::Config::embedded_defaults().limits.image,
        AddressPolicy::LoopbackToo,
    )
    .expect("fetcher");
    RemoteImages::Enabled(fetcher)
}

async fn fetch(remote: &RemoteImages, url: &str) -> Result<Bytes, FetchError> {
    remote.check(url)?.fetch().await
}

#[tokio::test]
async fn an_image_is_fetched_whole() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    let bytes = fetch(&remote, &host.url("/cat.png"))
        .await
        .expect("fetched");
    assert_eq!(&bytes[..], &png()[..]);
    // Exactly at the cap, with no Content-Length, is still whole.
    let bytes = fetch(&remote, &host.url("/streamed-at-the-limit"))
        .await
        .unwrap();
    assert_eq!(bytes.len(), MAX_BYTES);
}

#[tokio::test]
async fn too_large_is_refused_by_content_length_and_while_streaming() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    for path in ["/declared-too-large", "/streamed-too-large"] {
        assert_eq!(
            fetch(&remote, &host.url(path)).await,
            Err(FetchError::TooLarge { limit: MAX_BYTES }),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_stalling_server_is_cut_off_at_the_timeout() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    for path in ["/stall-head", "/stall-body"] {
        let started = Instant::now();
        let result = fetch(&remote, &host.url(path)).await;
        let took = started.elapsed();
        assert_eq!(
            result,
            Err(FetchError::TimedOut { ms: TIMEOUT_MS }),
            "{path}"
        );
        assert!(
            took >= Duration::from_millis(TIMEOUT_MS),
            "{path}: {took:?}"
        );
        assert!(
            took < Duration::from_millis(TIMEOUT_MS + 1500),
            "{path}: {took:?}"
        );
    }
}

#[tokio::test]
async fn a_status_other_than_2xx_is_refused_with_it() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    for (path, code) in [("/missing", 404), ("/broken", 500)] {
        assert_eq!(
            fetch(&remote, &host.url(path)).await,
            Err(FetchError::Status { status: code }),
            "{path}"
        );
    }
}

#[tokio::test]
async fn redirects_are_followed_only_where_the_first_url_could_go() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    let bytes = fetch(&remote, &host.url("/moved")).await.expect("followed");
    assert_eq!(&bytes[..], &png()[..]);

    let refused = |inner: FetchError| Err(FetchError::Redirect(Box::new(inner)));
    assert_eq!(
        fetch(&remote, &host.url("/moved-away")).await,
        refused(FetchError::HostNotAllowed {
            host: "elsewhere.example".into()
        })
    );
    for (path, target) in [
        ("/moved-inside", "10.0.0.1"),
        ("/moved-to-metadata", "169.254.169.254"),
    ] {
        assert_eq!(
            fetch(&remote, &host.url(path)).await,
            refused(FetchError::NotPublic {
                host: target.into()
            }),
            "{path}"
        );
    }
    let with_password = fetch(&remote, &host.url("/moved-with-password")).await;
    assert_eq!(with_password, refused(FetchError::Credentials));
    assert!(!with_password.unwrap_err().to_string().contains("hunter2"));
    assert_eq!(
        fetch(&remote, &host.url("/loop")).await,
        Err(FetchError::TooManyRedirects)
    );
}

#[tokio::test]
async fn the_service_policy_refuses_loopback_before_any_connection() {
    let host = FakeHost::start(routes).await;
    let remote = RemoteImages::from_settings(
        &settings(&["localhost", "127.0.0.1", "[::1]"]),
        &crate::config::Config::embedded_defaults().limits.image,
    )
    .unwrap();
    let port = host.addr.port();
    for (url, name) in [
        // Resolved by our resolver, which finds only loopback addresses.
        (format!("http://localhost:{port}/cat.png"), "localhost"),
        // Literals never reach a resolver: checked as the URL is.
        (format!("http://127.0.0.1:{port}/cat.png"), "127.0.0.1"),
        (format!("http://[::1]:{port}/cat.png"), "::1"),
        // Another spelling of 127.0.0.1, which the URL parser normalises.
        (format!("http://2130706433:{port}/cat.png"), "127.0.0.1"),
    ] {
        assert_eq!(
            fetch(&remote, &url).await,
            Err(FetchError::NotPublic { host: name.into() }),
            "{url}"
        );
    }
    assert_eq!(host.connections(), 0, "the fake host saw a connection");
}

#[test]
fn urls_are_checked_before_any_look_up() {
    let remote = RemoteImages::from_settings(
        &RemoteImageSettings {
            allow_http: false,
            ..settings(&["images.example.com", "*.cdn.example.net"])
        },
        &crate::config::Config::embedded_defaults().limits.image,
    )
    .unwrap();
    let check = |url: &str| remote.check(url).map(|_| ());
    assert_eq!(check("https://images.example.com/a.png"), Ok(()));
    assert_eq!(check("https://IMAGES.Example.COM./a.png?sig=1"), Ok(()));
    assert_eq!(check("https://a.b.cdn.example.net/a.png"), Ok(()));
    assert_eq!(
        check("https://cdn.example.net/a.png"),
        Err(FetchError::HostNotAllowed {
            host: "cdn.example.net".into()
        }),
        "a wildcard covers subdomains only"
    );
    assert_eq!(
        check("https://evilcdn.example.net/a.png"),
        Err(FetchError::HostNotAllowed {
            host: "evilcdn.example.net".into()
        })
    );
    assert_eq!(
        check("https://images.example.com.evil.org/a.png"),
        Err(FetchError::HostNotAllowed {
            host: "images.example.com.evil.org".into()
        })
    );
    assert_eq!(
        check("http://images.example.com/a.png"),
        Err(FetchError::SchemeNotAllowed {
            scheme: "http".into()
        })
    );
    let with_password = check("https://user:s3cret@images.example.com/a.png");
    assert_eq!(with_password, Err(FetchError::Credentials));
    assert!(!with_password.unwrap_err().to_string().contains("s3cret"));
    assert_eq!(
        check("https://user@images.example.com/a.png"),
        Err(FetchError::Credentials)
    );
    assert!(matches!(check("https://"), Err(FetchError::InvalidUrl(_))));
    assert_eq!(
        RemoteImages::Disabled
            .check("https://images.example.com/a.png")
            .map(|_| ()),
        Err(FetchError::Disabled)
    );
}

#[test]
fn allow_list_entries_are_host_names() {
    let parse = |s: &str| AllowedHost::try_from(s.to_string());
    assert_eq!(
        parse("Images.Example.com."),
        Ok(AllowedHost::Exact("images.example.com".into()))
    );
    assert_eq!(
        parse("*.example.com"),
        Ok(AllowedHost::Subdomains(".example.com".into()))
    );
    assert_eq!(
        parse("203.0.113.7"),
        Ok(AllowedHost::Exact("203.0.113.7".into()))
    );
    assert_eq!(
        parse("[2001:db8::1]"),
        Ok(AllowedHost::Exact("2001:db8::1".into()))
    );
    assert_eq!(
        parse("2001:db8::1"),
        Ok(AllowedHost::Exact("2001:db8::1".into()))
    );
    assert_eq!(
        parse("Bücher.example"),
        Ok(AllowedHost::Exact("xn--bcher-kva.example".into()))
    );
    for bad in [
        "",
        "*.1.2.3",
        "*",
        "*.",
        "a.*.com",
        "example.com/images",
        "user@example.com",
        "example.com:443",
        "https://example.com",
        "*.10.0.0.1",
        "exa mple.com",
    ] {
        let error = parse(bad).expect_err(bad);
        assert!(error.contains("remote_images.allowed_hosts"), "{error}");
    }
}

/// The whole image path: a fetched image is scored like an inline one and
/// metered by its bytes; fetched bytes that are no image are refused by the
/// same validation a data URL meets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_scores_a_fetched_image_and_counts_its_bytes() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    let engine = engine(crate::config::Config::embedded_defaults().engine_budget());
    let item = |path: &str| remote_item(&remote, &host.url(path));

    let moderation = engine
        .moderate(
            vec![item("/cat.png")],
            false,
            &crate::moderation::CategoryRules::default(),
        )
        .await
        .expect("scored");
    match &moderation.items[..] {
        [ItemOutcome::Image { bytes, .. }] => assert_eq!(*bytes, png().len()),
        other => panic!("{other:?}"),
    }

    let refused = engine
        .moderate(
            vec![item("/page.html")],
            false,
            &crate::moderation::CategoryRules::default(),
        )
        .await;
    match refused {
        Err(EngineError::Image {
            index: 0,
            error: ImageError::Invalid(message),
        }) => {
            assert!(message.contains("not an image"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let refused = engine
        .moderate(
            vec![Item::Text("hello".into()), item("/missing")],
            false,
            &crate::moderation::CategoryRules::default(),
        )
        .await;
    assert!(
        matches!(
            refused,
            Err(EngineError::Fetch {
                index: 1,
                error: FetchError::Status { status: 404 }
            })
        ),
        "{refused:?}"
    );
}

/// Scores every image the same, after checking it is the test PNG.
struct Fixed;

impl ImageClassifier for Fixed {
    fn model_id(&self) -> String {
        "fixed".into()
    }
    fn score(&self, image: &DecodedImage) -> anyhow::Result<ImageScores> {
        assert_eq!((image.width, image.height), (16, 12));
        Ok(ImageScores {
            scores: Default::default(),
            evaluated: vec![Category::Sexual],
        })
    }
    fn default_thresholds(&self) -> Thresholds {
        Thresholds::uniform(0.5)
    }
}

fn engine(budget: EngineBudget) -> Engine {
    Engine::new(EngineParts {
        text: Arc::new(NullClassifier),
        text_thresholds: Thresholds::uniform(0.5),
        fast_text: None,
        image: Some(Arc::new(Fixed)),
        image_thresholds: Thresholds::uniform(0.5),
        image_limits: crate::config::Config::embedded_defaults().limits.image,
        vision: None,
        ocr: None,
        budget,
    })
}

fn remote_item(remote: &RemoteImages, url: &str) -> Item {
    Item::Image(ImageSource::Remote(remote.check(url).expect("allowed")))
}

/// A fetch never holds a request past its deadline, even when the fetch's
/// own timeout is longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_stops_at_the_request_deadline() {
    let host = FakeHost::start(routes).await;
    let fetcher = Fetcher::new(
        &RemoteImageSettings {
            timeout_ms: 30_000,
            ..settings(&["localhost"])
        },
        &crate::config::Config::embedded_defaults().limits.image,
        AddressPolicy::LoopbackToo,
    )
    .unwrap();
    let remote = RemoteImages::Enabled(fetcher);
    let engine = engine(EngineBudget {
        deadline: Duration::from_millis(300),
        ..crate::config::Config::embedded_defaults().engine_budget()
    });
    let started = Instant::now();
    let result = engine
        .moderate(
            vec![remote_item(&remote, &host.url("/stall-body"))],
            false,
            &crate::moderation::CategoryRules::default(),
        )
        .await;
    assert!(
        matches!(result, Err(EngineError::DeadlineExceeded(_))),
        "{result:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// With every fetch slot taken, the next fetch waits at most the timeout for
/// one and is then refused as busy, without connecting: clients cannot pile
/// up sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_beyond_the_pool_are_refused_as_busy() {
    let host = FakeHost::start(routes).await;
    let fetcher = Fetcher::new(
        &RemoteImageSettings {
            max_concurrent_fetches: 1,
            ..settings(&["localhost"])
        },
        &crate::config::Config::embedded_defaults().limits.image,
        AddressPolicy::LoopbackToo,
    )
    .unwrap();
    let remote = RemoteImages::Enabled(fetcher.clone());
    let taken = fetcher.inner.slots.acquire().await.unwrap();
    let started = Instant::now();
    assert_eq!(
        fetch(&remote, &host.url("/cat.png")).await,
        Err(FetchError::Busy { ms: TIMEOUT_MS })
    );
    assert!(started.elapsed() >= Duration::from_millis(TIMEOUT_MS));
    assert_eq!(host.connections(), 0, "the refused fetch never connected");
    drop(taken);
    assert!(fetch(&remote, &host.url("/cat.png")).await.is_ok());
}

#[tokio::test]
async fn a_body_cut_short_is_refused() {
    let host = FakeHost::start(routes).await;
    let remote = loopback_fetcher();
    assert_eq!(
        fetch(&remote, &host.url("/cut-short")).await,
        Err(FetchError::Interrupted {
            host: "localhost".into()
        })
    );
}
