//! The deep image analysis client against a fake OpenAI-compatible provider
//! served in the test.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine as _;
use bytes::Bytes;
use moderato::moderation::image::decode::ImageFormat;
use moderato::moderation::image::vision::{
    AnalysisStatus, ImageAnalysis, VisionClient, VisionImage, VisionSettings,
};
use serde_json::{json, Value};
use tokio::time::{sleep, Instant};

const MODEL: &str = "fake-vision-1";

/// Generous bound on top of `timeout_ms` for "returns in time": long enough
/// never to flake on a loaded machine, short enough to catch a hang.
const SLACK: Duration = Duration::from_secs(2);

/// What the fake answers to one call.
enum Reply {
    /// A completion whose message content is this text.
    Content(String),
    /// The content, after a pause.
    SlowContent(Duration, String),
    /// Any status and raw body.
    Raw(StatusCode, String),
}

type Responder = dyn Fn(usize, &Value) -> Reply + Send + Sync;

#[derive(Clone)]
struct Fake {
    calls: Arc<AtomicUsize>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
    last_request: Arc<Mutex<Option<(HeaderMap, Value)>>>,
    respond: Arc<Responder>,
}

impl Fake {
    /// Serves `respond` (given the call's index and JSON body) on 127.0.0.1.
    async fn start(
        respond: impl Fn(usize, &Value) -> Reply + Send + Sync + 'static,
    ) -> (Fake, SocketAddr) {
        let fake = Fake {
            calls: Arc::default(),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
            last_request: Arc::default(),
            respond: Arc::new(respond),
        };
        let app = Router::new()
            .route("/v1/chat/completions", post(handle))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (fake, addr)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

async fn handle(State(fake): State<Fake>, headers: HeaderMap, Json(body): Json<Value>) -> Response {
    let index = fake.calls.fetch_add(1, Ordering::SeqCst);
    let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    fake.max_in_flight.fetch_max(now, Ordering::SeqCst);
    *fake.last_request.lock().unwrap() = Some((headers, body.clone()));
    let reply = (fake.respond)(index, &body);
    let response = match reply {
        Reply::Content(content) => Json(completion(&content)).into_response(),
        Reply::SlowContent(pause, content) => {
            sleep(pause).await;
            Json(completion(&content)).into_response()
        }
        Reply::Raw(status, body) => (status, body).into_response(),
    };
    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

fn completion(content: &str) -> Value {
    json!({
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": MODEL,
        "choices": [{ "index": 0, "finish_reason": "stop",
                      "message": { "role": "assistant", "content": content } }],
    })
}

fn good_answer() -> String {
    json!({
        "category_scores": {
            "harassment": 0.01, "harassment/threatening": 0.0, "hate": 0.02, "hate/threatening": 0.0,
            "self-harm": 0.0, "self-harm/intent": 0.0, "self-harm/instructions": 0.0,
            "sexual": 0.0, "sexual/minors": 0.0, "violence": 0.9, "violence/graphic": 0.35,
        },
        "rationale": "Two cartoon knights fight with swords.",
    })
    .to_string()
}

/// The image bytes the client sent, decoded from the data URI.
fn sent_image(body: &Value) -> Option<Vec<u8>> {
    let url = body["messages"][1]["content"][1]["image_url"]["url"].as_str()?;
    let data = url.split_once(";base64,")?.1;
    base64::engine::general_purpose::STANDARD.decode(data).ok()
}

fn settings(addr: SocketAddr) -> VisionSettings {
    VisionSettings {
        base_url: Some(format!("http://{addr}/v1/")),
        model: Some(MODEL.into()),
        api_key: Some("test-key-123".into()),
        timeout_ms: 2_000,
        ..moderato::config::Config::embedded_defaults().vision
    }
}

fn client(settings: &VisionSettings) -> VisionClient {
    VisionClient::from_settings(settings)
        .unwrap()
        .expect("a provider is configured")
}

fn image(bytes: &'static [u8]) -> VisionImage {
    VisionImage {
        format: ImageFormat::Png,
        bytes: Bytes::from_static(bytes),
    }
}

async fn analyze_one(client: &VisionClient, bytes: &'static [u8]) -> ImageAnalysis {
    client.analyze(vec![image(bytes)]).await.pop().unwrap()
}

fn error_code(analysis: &ImageAnalysis) -> &str {
    assert_eq!(analysis.status, AnalysisStatus::Failed, "{analysis:?}");
    &analysis
        .error
        .as_ref()
        .expect("a failure has an error")
        .code
}

#[tokio::test]
async fn good_answer_is_parsed_and_reports_the_model() {
    let (_fake, addr) = Fake::start(|_, _| Reply::Content(good_answer())).await;
    let analysis = analyze_one(&client(&settings(addr)), b"knights").await;
    assert_eq!(analysis.status, AnalysisStatus::Completed, "{analysis:?}");
    assert_eq!(analysis.model.as_deref(), Some(MODEL));
    assert_eq!(analysis.category_scores.len(), 11);
    assert_eq!(analysis.category_scores["violence"], 0.9);
    assert_eq!(analysis.category_scores["violence/graphic"], 0.35);
    assert_eq!(
        analysis.rationale.as_deref(),
        Some("Two cartoon knights fight with swords.")
    );
    assert_eq!(analysis.error, None);
}

#[tokio::test]
async fn request_carries_key_image_and_schema() {
    let (fake, addr) = Fake::start(|_, _| Reply::Content(good_answer())).await;
    analyze_one(&client(&settings(addr)), b"\x89PNG fake bytes").await;
    let (headers, body) = fake.last_request.lock().unwrap().clone().unwrap();
    assert_eq!(headers["authorization"], "Bearer test-key-123");
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["temperature"], 0);
    let url = body["messages"][1]["content"][1]["image_url"]["url"]
        .as_str()
        .unwrap();
    assert!(url.starts_with("data:image/png;base64,"), "{url}");
    assert_eq!(sent_image(&body).unwrap(), b"\x89PNG fake bytes");
    assert_eq!(body["response_format"]["type"], "json_schema");
    assert_eq!(body["response_format"]["json_schema"]["strict"], true);
}

#[tokio::test]
async fn without_key_or_structured_output_neither_is_sent() {
    let (fake, addr) = Fake::start(|_, _| Reply::Content(good_answer())).await;
    let settings = VisionSettings {
        api_key: None,
        structured_output: false,
        ..settings(addr)
    };
    let analysis = analyze_one(&client(&settings), b"plain").await;
    assert_eq!(analysis.status, AnalysisStatus::Completed);
    let (headers, body) = fake.last_request.lock().unwrap().clone().unwrap();
    assert!(headers.get("authorization").is_none());
    assert!(body.get("response_format").is_none());
}

#[tokio::test]
async fn fenced_json_answer_is_accepted() {
    let (_fake, addr) =
        Fake::start(|_, _| Reply::Content(format!("```json\n{}\n```", good_answer()))).await;
    let analysis = analyze_one(&client(&settings(addr)), b"fenced").await;
    assert_eq!(analysis.status, AnalysisStatus::Completed, "{analysis:?}");
    assert_eq!(analysis.category_scores["violence"], 0.9);
}

#[tokio::test]
async fn malformed_answers_fail_as_invalid_response() {
    let answers = [
        "{\"category_scores\": {\"violence\": 0.9",
        "Sorry, I can't help with that.",
        "{\"scores\": {\"violence\": 0.9}}",
    ];
    for answer in answers {
        let (_fake, addr) = Fake::start(move |_, _| Reply::Content(answer.to_owned())).await;
        let analysis = analyze_one(&client(&settings(addr)), b"malformed").await;
        assert_eq!(error_code(&analysis), "invalid_response", "{answer}");
        assert_eq!(analysis.model.as_deref(), Some(MODEL));
        assert!(analysis.category_scores.is_empty());
    }
    let (_fake, addr) =
        Fake::start(|_, _| Reply::Raw(StatusCode::OK, "<html>gateway</html>".into())).await;
    assert_eq!(
        error_code(&analyze_one(&client(&settings(addr)), b"html").await),
        "invalid_response"
    );
}

#[tokio::test]
async fn out_of_range_score_fails_the_analysis() {
    for score in ["1.5", "-0.2"] {
        let content = format!(
            r#"{{"category_scores": {{"hate": 0.1, "violence": {score}}}, "rationale": "x"}}"#
        );
        let (_fake, addr) = Fake::start(move |_, _| Reply::Content(content.clone())).await;
        let analysis = analyze_one(&client(&settings(addr)), b"range").await;
        assert_eq!(error_code(&analysis), "invalid_response", "{score}");
        assert!(analysis.error.unwrap().message.contains("violence"));
    }
}

#[tokio::test]
async fn unknown_categories_are_ignored_and_missing_ones_absent() {
    let content = r#"{"category_scores": {"violence": 0.4, "spam": 0.99, "gore": 1.0}, "rationale": "ok", "confidence": 3}"#;
    let (_fake, addr) = Fake::start(move |_, _| Reply::Content(content.to_owned())).await;
    let analysis = analyze_one(&client(&settings(addr)), b"partial").await;
    assert_eq!(analysis.status, AnalysisStatus::Completed, "{analysis:?}");
    assert_eq!(
        analysis.category_scores.keys().collect::<Vec<_>>(),
        vec!["violence"]
    );
    assert!(
        !analysis.category_scores.contains_key("hate"),
        "not evaluated must not read as 0"
    );
}

#[tokio::test]
async fn http_500_fails_with_status_and_without_the_raw_body() {
    let body =
        r#"{"error": {"message": "upstream overloaded, key sk-live-abcdef0123456789 rejected"}}"#;
    let (fake, addr) =
        Fake::start(move |_, _| Reply::Raw(StatusCode::INTERNAL_SERVER_ERROR, body.into())).await;
    let settings = VisionSettings {
        retries: 0,
        ..settings(addr)
    };
    let analysis = analyze_one(&client(&settings), b"five hundred").await;
    assert_eq!(error_code(&analysis), "provider_error");
    let message = analysis.error.unwrap().message;
    assert!(message.contains("500"), "{message}");
    assert!(!message.contains("sk-live"), "{message}");
    assert!(!message.contains("{\"error\""), "{message}");
    assert_eq!(fake.calls(), 1);
}

#[tokio::test]
async fn transient_500_is_retried_then_succeeds() {
    let (fake, addr) = Fake::start(|index, _| match index {
        0 => Reply::Raw(StatusCode::SERVICE_UNAVAILABLE, "busy".into()),
        _ => Reply::Content(good_answer()),
    })
    .await;
    let analysis = analyze_one(&client(&settings(addr)), b"retry").await;
    assert_eq!(analysis.status, AnalysisStatus::Completed, "{analysis:?}");
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let (fake, addr) = Fake::start(|_, _| Reply::Raw(StatusCode::BAD_REQUEST, "bad".into())).await;
    let settings = VisionSettings {
        retries: 3,
        ..settings(addr)
    };
    let analysis = analyze_one(&client(&settings), b"four hundred").await;
    assert_eq!(error_code(&analysis), "provider_error");
    assert!(analysis.error.unwrap().message.contains("400"));
    assert_eq!(fake.calls(), 1);
}

#[tokio::test]
async fn slow_provider_times_out_within_the_bound() {
    let (_fake, addr) =
        Fake::start(|_, _| Reply::SlowContent(Duration::from_secs(30), good_answer())).await;
    let settings = VisionSettings {
        timeout_ms: 300,
        ..settings(addr)
    };
    let client = client(&settings);
    let started = Instant::now();
    let results = client
        .analyze(vec![image(b"slow one"), image(b"slow two")])
        .await;
    assert!(
        started.elapsed() < Duration::from_millis(300) + SLACK,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(results.len(), 2);
    for analysis in &results {
        assert_eq!(error_code(analysis), "timeout");
    }
}

#[tokio::test]
async fn hung_connection_times_out_within_the_bound() {
    // Accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let settings = VisionSettings {
        timeout_ms: 300,
        ..settings(addr)
    };
    let started = Instant::now();
    let analysis = analyze_one(&client(&settings), b"hung").await;
    assert!(
        started.elapsed() < Duration::from_millis(300) + SLACK,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(error_code(&analysis), "timeout");
}

#[tokio::test]
async fn closed_port_fails_as_connection_failed() {
    let addr = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let settings = VisionSettings {
        timeout_ms: 1_000,
        ..settings(addr)
    };
    let started = Instant::now();
    let analysis = analyze_one(&client(&settings), b"closed").await;
    assert!(
        started.elapsed() < Duration::from_millis(1_000) + SLACK,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(error_code(&analysis), "connection_failed");
    assert!(!analysis
        .error
        .unwrap()
        .message
        .contains(&addr.port().to_string()));
}

#[tokio::test]
async fn each_image_gets_its_own_status() {
    let (_fake, addr) = Fake::start(|_, body| match sent_image(body).as_deref() {
        Some(b"good") => Reply::Content(good_answer()),
        _ => Reply::Content("not json".into()),
    })
    .await;
    let results = client(&settings(addr))
        .analyze(vec![image(b"good"), image(b"bad"), image(b"good")])
        .await;
    let statuses: Vec<_> = results.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses,
        vec![
            AnalysisStatus::Completed,
            AnalysisStatus::Failed,
            AnalysisStatus::Completed
        ]
    );
    assert_eq!(error_code(&results[1]), "invalid_response");
}

#[tokio::test]
async fn circuit_opens_after_failures_and_closes_after_cooldown() {
    let failing = Arc::new(AtomicBool::new(true));
    let switch = Arc::clone(&failing);
    let (fake, addr) = Fake::start(move |_, _| {
        if switch.load(Ordering::SeqCst) {
            Reply::Raw(StatusCode::BAD_GATEWAY, "down".into())
        } else {
            Reply::Content(good_answer())
        }
    })
    .await;
    let settings = VisionSettings {
        retries: 0,
        breaker_failures: 3,
        breaker_cooldown_ms: 300,
        cache_entries: 0,
        ..settings(addr)
    };
    let client = client(&settings);
    for bytes in [&b"one"[..], b"two", b"three"] {
        assert_eq!(
            error_code(&analyze_one(&client, bytes).await),
            "provider_error"
        );
    }
    assert_eq!(fake.calls(), 3);

    let refused = analyze_one(&client, b"four").await;
    assert_eq!(error_code(&refused), "circuit_open");
    assert_eq!(
        fake.calls(),
        3,
        "an open circuit must not call the provider"
    );

    failing.store(false, Ordering::SeqCst);
    sleep(Duration::from_millis(600)).await;
    assert_eq!(
        analyze_one(&client, b"five").await.status,
        AnalysisStatus::Completed
    );
    assert_eq!(
        analyze_one(&client, b"six").await.status,
        AnalysisStatus::Completed
    );
    assert_eq!(fake.calls(), 5);
}

#[tokio::test]
async fn failed_trial_reopens_the_circuit() {
    let (fake, addr) =
        Fake::start(|_, _| Reply::Raw(StatusCode::INTERNAL_SERVER_ERROR, "down".into())).await;
    let settings = VisionSettings {
        retries: 0,
        breaker_failures: 1,
        breaker_cooldown_ms: 300,
        ..settings(addr)
    };
    let client = client(&settings);
    assert_eq!(
        error_code(&analyze_one(&client, b"a").await),
        "provider_error"
    );
    assert_eq!(
        error_code(&analyze_one(&client, b"b").await),
        "circuit_open"
    );
    sleep(Duration::from_millis(600)).await;
    assert_eq!(
        error_code(&analyze_one(&client, b"c").await),
        "provider_error"
    );
    assert_eq!(
        error_code(&analyze_one(&client, b"d").await),
        "circuit_open"
    );
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn identical_images_are_analysed_once_within_the_window() {
    let (fake, addr) = Fake::start(|_, _| Reply::Content(good_answer())).await;
    let client = client(&settings(addr));
    let first = analyze_one(&client, b"same image").await;
    let second = analyze_one(&client, b"same image").await;
    assert_eq!(fake.calls(), 1);
    assert_eq!(first, second);
    analyze_one(&client, b"another image").await;
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn cache_entries_expire() {
    let (fake, addr) = Fake::start(|_, _| Reply::Content(good_answer())).await;
    let client = client(&VisionSettings {
        cache_ttl_ms: 100,
        ..settings(addr)
    });
    analyze_one(&client, b"short lived").await;
    sleep(Duration::from_millis(300)).await;
    analyze_one(&client, b"short lived").await;
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn failures_are_not_cached() {
    let (fake, addr) = Fake::start(|index, _| match index {
        0 => Reply::Content("garbage".into()),
        _ => Reply::Content(good_answer()),
    })
    .await;
    let client = client(&settings(addr));
    assert_eq!(
        error_code(&analyze_one(&client, b"flaky").await),
        "invalid_response"
    );
    assert_eq!(
        analyze_one(&client, b"flaky").await.status,
        AnalysisStatus::Completed
    );
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn concurrent_requests_for_one_image_share_a_single_call() {
    let (fake, addr) =
        Fake::start(|_, _| Reply::SlowContent(Duration::from_millis(300), good_answer())).await;
    let client = client(&settings(addr));
    let (a, b) = tokio::join!(
        analyze_one(&client, b"popular"),
        analyze_one(&client, b"popular")
    );
    let within_one_request = client.analyze(vec![image(b"twice"), image(b"twice")]).await;
    assert_eq!(a.status, AnalysisStatus::Completed);
    assert_eq!(a, b);
    assert!(within_one_request
        .iter()
        .all(|r| r.status == AnalysisStatus::Completed));
    assert_eq!(fake.calls(), 2);
}

#[tokio::test]
async fn provider_calls_are_bounded_by_max_concurrency() {
    let (fake, addr) =
        Fake::start(|_, _| Reply::SlowContent(Duration::from_millis(100), good_answer())).await;
    let client = client(&VisionSettings {
        max_concurrency: 2,
        timeout_ms: 5_000,
        ..settings(addr)
    });
    let images = [&b"i1"[..], b"i2", b"i3", b"i4", b"i5", b"i6"]
        .into_iter()
        .map(image)
        .collect();
    let results = client.analyze(images).await;
    assert!(
        results
            .iter()
            .all(|r| r.status == AnalysisStatus::Completed),
        "{results:?}"
    );
    assert_eq!(fake.calls(), 6);
    assert!(fake.max_in_flight.load(Ordering::SeqCst) <= 2);
}
