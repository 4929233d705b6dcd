//! Image items over HTTP: mixed requests, the decoding limits and bad input,
//! and the deep analysis by a (fake, local) vision provider.

use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use base64::Engine;
use serde_json::{json, Value};

use crate::api::assert_verdict_shape;
use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;

/// An ordinary synthetic picture: a colour gradient.
pub fn png(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([
            (x * 255 / width.max(1)) as u8,
            (y * 255 / height.max(1)) as u8,
            128,
        ])
    });
    let mut out = Vec::new();
    image::DynamicImage::ImageRgb8(img)
        .write_to(&mut Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

pub fn data_uri(media_type: &str, bytes: &[u8]) -> String {
    format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

async fn mixed_requests_keep_order_and_combine_only_text(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let body = json!({"input": [
        {"type": "text", "text": "Lovely weather"},
        {"type": "image", "base64": data_uri("image/png", &png(64, 48))},
        {"type": "text", "text": "for a walk"},
    ]});
    let (status, _, body) = parts(app.moderate(&key, &body).await).await;
    assert_eq!(status, 200, "{body}");
    let results = body["results"].as_array().unwrap();
    let kinds: Vec<&str> = results
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["text", "image", "text"]);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["index"], i);
        assert_verdict_shape(r);
    }
    let image = &results[1];
    assert_eq!(image["evaluated_categories"], json!(["sexual"]));
    assert_eq!(image["image_analysis"]["status"], "not_requested");
    assert!(
        image["category_scores"]["sexual"].as_f64().unwrap() < 0.5,
        "a gradient is not sexual: {image}"
    );
    assert_eq!(
        body["combined_text"]["items"], 2,
        "combined_text covers the text items only"
    );

    // Only images: no combined_text at all.
    let only = json!({"input": [{"type": "image", "base64": data_uri("image/png", &png(8, 8))}]});
    let (status, _, body) = parts(app.moderate(&key, &only).await).await;
    assert_eq!(status, 200);
    assert!(body.get("combined_text").is_none(), "{body}");
}

async fn bad_images_get_their_error_with_the_field(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let good = png(16, 16);
    let mut truncated = good.clone();
    truncated.truncate(good.len() / 2);
    // A valid PNG header that claims 50,000 × 50,000 pixels.
    let mut huge = good[..8].to_vec();
    let mut ihdr = b"IHDR".to_vec();
    ihdr.extend(50_000u32.to_be_bytes());
    ihdr.extend(50_000u32.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    huge.extend(13u32.to_be_bytes());
    huge.extend(&ihdr);
    huge.extend(crc32(&ihdr).to_be_bytes());
    for (kind, data) in [
        (
            &b"IDAT"[..],
            &[0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01][..],
        ),
        (b"IEND", &[]),
    ] {
        let mut chunk = kind.to_vec();
        chunk.extend(data);
        huge.extend((data.len() as u32).to_be_bytes());
        huge.extend(&chunk);
        huge.extend(crc32(&chunk).to_be_bytes());
    }

    let cases: Vec<(String, u16, &str)> = vec![
        (
            "data:image/png;base64,!!!not base64!!!".into(),
            400,
            "invalid_image",
        ),
        ("https://example.com/cat.png".into(), 400, "invalid_image"),
        (data_uri("text/plain", b"hello"), 400, "invalid_image"),
        (data_uri("image/jpeg", &good), 400, "invalid_image"),
        (data_uri("image/png", &truncated), 400, "invalid_image"),
        (
            data_uri("image/png", b"\x89PNG\r\n\x1a\ngarbage"),
            400,
            "invalid_image",
        ),
        (data_uri("image/png", &huge), 413, "payload_too_large"),
        (
            data_uri("image/png", &vec![0u8; 5 * 1024 * 1024]),
            413,
            "payload_too_large",
        ),
    ];
    for (uri, expected_status, code) in cases {
        let request =
            json!({"input": [{"type": "text", "text": "hi"}, {"type": "image", "base64": uri}]});
        let (status, _, body) = parts(app.moderate(&key, &request).await).await;
        assert_eq!(
            status,
            expected_status,
            "{}: {body}",
            &uri[..uri.len().min(40)]
        );
        let message = error_message(&body, code);
        assert!(message.contains("input[1].base64"), "{message}");
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

on_both_backends!(
    mixed_requests_keep_order_and_combine_only_text,
    bad_images_get_their_error_with_the_field
);

/// A local stand-in for an OpenAI-compatible vision endpoint.
struct FakeProvider {
    base_url: String,
    calls: Arc<AtomicUsize>,
}

async fn fake_provider(answer: Value, delay: Duration) -> FakeProvider {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let answer = answer.clone();
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                axum::Json(json!({"choices": [{"message": {"role": "assistant", "content": answer.to_string()}}]}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    FakeProvider { base_url, calls }
}

async fn app_with_provider(provider: Option<&FakeProvider>, timeout_ms: u64) -> TestApp {
    let base = provider.map(|p| p.base_url.clone());
    spawn_app_with(Backend::Sqlite, move |c| {
        c.vision.model = base.as_ref().map(|_| "fake-vision-1".to_string());
        c.vision.base_url = base;
        c.vision.timeout_ms = timeout_ms;
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_analysis_raises_scores_and_is_metered() {
    let answer = json!({"category_scores": {"violence": 0.93, "sexual": 0.0}, "rationale": "A weapon is shown."});
    let provider = fake_provider(answer, Duration::ZERO).await;
    let app = app_with_provider(Some(&provider), 5_000).await;
    let (id, key) = app.create_key(Tier::Pro, None).await;
    let request = json!({"analyze_images": true, "input": [{"type": "image", "base64": data_uri("image/png", &png(32, 32))}]});
    let (status, _, body) = parts(app.moderate(&key, &request).await).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["results"][0];
    assert_eq!(result["image_analysis"]["status"], "completed");
    assert_eq!(result["image_analysis"]["model"], "fake-vision-1");
    assert_eq!(result["category_scores"]["violence"], 0.93);
    assert_eq!(result["categories"]["violence"], true);
    assert_eq!(
        result["evaluated_categories"],
        json!(["sexual", "violence"])
    );
    assert_eq!(body["flagged"], true);
    // The provider's 0 for sexual cannot lower the standard model's score.
    assert!(result["category_scores"]["sexual"].as_f64().unwrap() >= 0.0);

    let events = app.usage_events(1).await;
    let event = events.iter().find(|e| e.key_id == id).unwrap();
    assert_eq!((event.image_items, event.deep_analyses), (1, 1));
    assert!(event.image_bytes > 0);

    // Not requested: the provider is not called.
    let calls = provider.calls.load(Ordering::SeqCst);
    let plain =
        json!({"input": [{"type": "image", "base64": data_uri("image/png", &png(33, 33))}]});
    let (_, _, body) = parts(app.moderate(&key, &plain).await).await;
    assert_eq!(
        body["results"][0]["image_analysis"]["status"],
        "not_requested"
    );
    assert_eq!(
        provider.calls.load(Ordering::SeqCst),
        calls,
        "images leave only when the request asks"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_analysis_without_a_provider_is_unavailable() {
    let app = app_with_provider(None, 5_000).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let request = json!({"analyze_images": true, "input": [{"type": "image", "base64": data_uri("image/png", &png(16, 16))}]});
    let (status, _, body) = parts(app.moderate(&key, &request).await).await;
    assert_eq!(status, 200);
    assert_eq!(
        body["results"][0]["image_analysis"]["status"],
        "unavailable"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_provider_cannot_hold_the_request_past_its_timeout() {
    let answer = json!({"category_scores": {"violence": 0.9}, "rationale": "late"});
    let provider = fake_provider(answer, Duration::from_secs(30)).await;
    let app = app_with_provider(Some(&provider), 800).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let request = json!({"analyze_images": true, "input": [
        {"type": "text", "text": "hello"},
        {"type": "image", "base64": data_uri("image/png", &png(16, 16))}]});
    let started = Instant::now();
    let (status, _, body) = parts(app.moderate(&key, &request).await).await;
    // Generous bound: the point is "not 30 s", not a latency figure.
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status, 200, "{body}");
    let analysis = &body["results"][1]["image_analysis"];
    assert_eq!(analysis["status"], "failed");
    assert_eq!(analysis["error"]["code"], "timeout");
    assert_eq!(
        body["results"][1]["category_scores"]["violence"], 0.0,
        "a failed analysis adds nothing"
    );
}
