//! Text inside images (OCR) over HTTP: what is read is judged by the text
//! model, raises the image's scores, joins the combined text, and is shown
//! as `extracted_text`. Fixtures are rendered here, with DejaVu Sans.

use image::{Rgb, RgbImage};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::images::data_uri;
use moderato::access::Tier;

#[path = "../support/render_text.rs"]
mod render;

const THREAT: &str = "I will murder you and your whole family";

fn image_item(image: &RgbImage) -> Value {
    json!({"type": "image", "base64": data_uri("image/png", &render::png(image))})
}

async fn moderate(app: &TestApp, key: &str, input: Vec<Value>) -> Value {
    let (status, _, body) = parts(app.moderate(key, &json!({ "input": input })).await).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn words(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_lowercase()
}

/// The words of `expected` that the read text misses.
fn missing_words(read: &str, expected: &str) -> Vec<String> {
    let read = read.to_lowercase();
    expected
        .to_lowercase()
        .split_whitespace()
        .filter(|w| !read.contains(w))
        .map(str::to_string)
        .collect()
}

/// The text on `background`, `px` high, in `ink`, from x = 30, centred
/// vertically (so that a turned line stays inside the picture).
fn on(background: RgbImage, text: &str, px: f32, ink: [u8; 3]) -> RgbImage {
    let mut image = background;
    let y = (image.height() as f32 - px) / 2.0;
    render::draw(&mut image, &render::font(), text, 30.0, y, px, ink);
    image
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_threat_in_an_image_is_read_and_flagged() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let body = moderate(&app, &key, vec![image_item(&render::line(THREAT, 28.0))]).await;
    let image = &body["results"][0];
    assert_eq!(
        words(&image["extracted_text"]),
        THREAT.to_lowercase(),
        "{image}"
    );
    assert_eq!(image["flagged"], true, "{image}");
    assert_eq!(image["categories"]["violence"], true, "{image}");
    let raised = image["text_categories"]
        .as_array()
        .expect("text_categories");
    assert!(raised.contains(&json!("violence")), "{image}");
    assert!(
        image["evaluated_categories"].as_array().unwrap().len() > 1,
        "the text model judged every category: {image}"
    );
    assert_eq!(body["flagged"], true);
    assert!(
        body["model"].as_str().unwrap().contains("ppocrv4"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_renderings_are_still_read() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let white = || RgbImage::from_pixel(760, 260, Rgb([255, 255, 255]));
    let cases: Vec<(&str, RgbImage)> = vec![
        ("small, 14 px", on(white(), THREAT, 14.0, [0, 0, 0])),
        (
            "rotated +10°",
            render::rotate(&on(white(), THREAT, 24.0, [0, 0, 0]), 10.0, [255, 255, 255]),
        ),
        (
            "rotated -10°",
            render::rotate(
                &on(white(), THREAT, 24.0, [0, 0, 0]),
                -10.0,
                [255, 255, 255],
            ),
        ),
        (
            "white on dark",
            on(
                RgbImage::from_pixel(760, 140, Rgb([25, 30, 40])),
                THREAT,
                24.0,
                [255, 255, 255],
            ),
        ),
        (
            "noisy background",
            on(
                render::noisy_background(760, 140, 7),
                THREAT,
                24.0,
                [10, 10, 60],
            ),
        ),
    ];
    for (name, image) in cases {
        let body = moderate(&app, &key, vec![image_item(&image)]).await;
        let result = &body["results"][0];
        let read = words(&result["extracted_text"]);
        let missing = missing_words(&read, THREAT);
        assert!(
            missing.len() <= 1,
            "{name}: read {read:?}, missing {missing:?}"
        );
        assert_eq!(result["flagged"], true, "{name}: {result}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harmless_caption_and_a_picture_without_text_pass() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let caption = render::line("Sunset over the lake with my family", 28.0);
    let gradient = RgbImage::from_fn(320, 240, |x, y| {
        Rgb([(x * 255 / 320) as u8, (y * 255 / 240) as u8, 128])
    });
    let body = moderate(
        &app,
        &key,
        vec![image_item(&caption), image_item(&gradient)],
    )
    .await;
    let [caption, gradient] = [&body["results"][0], &body["results"][1]];
    assert!(
        words(&caption["extracted_text"]).contains("sunset"),
        "{caption}"
    );
    assert_eq!(caption["flagged"], false, "{caption}");
    assert_eq!(caption["text_categories"], json!([]), "{caption}");
    assert!(gradient.get("extracted_text").is_none(), "{gradient}");
    assert!(gradient.get("text_categories").is_none(), "{gradient}");
    assert_eq!(gradient["evaluated_categories"], json!(["sexual"]));
    assert_eq!(body["flagged"], false, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_threat_split_between_text_and_image_is_caught_in_the_combined_text() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let input = vec![
        json!({"type": "text", "text": "Tonight I am coming to your house."}),
        image_item(&render::line(
            "I will murder you and your whole family",
            28.0,
        )),
    ];
    let body = moderate(&app, &key, input).await;
    let combined = &body["combined_text"];
    assert_eq!(combined["items"], 2, "{body}");
    assert_eq!(combined["flagged"], true, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_endpoint_applies_image_to_what_its_text_raised() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let url = data_uri("image/png", &render::png(&render::line(THREAT, 28.0)));
    let body = json!({"input": [{"type": "image_url", "image_url": {"url": url}}]});
    let response = app
        .client
        .post(format!("{}/v1/moderations", app.base))
        .bearer_auth(&key)
        .json(&body)
        .send()
        .await
        .expect("request");
    let (status, _, body) = parts(response).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["results"][0];
    assert_eq!(result["flagged"], true, "{result}");
    assert_eq!(result["categories"]["violence"], true, "{result}");
    // The text read is also judged as text (it is the combined text), so
    // every category lists "text"; "image" goes to the image model's
    // category and to those the text raised, not to the others.
    let applied = &result["category_applied_input_types"];
    assert_eq!(applied["violence"], json!(["text", "image"]), "{result}");
    assert_eq!(applied["sexual"], json!(["text", "image"]), "{result}");
    assert_eq!(applied["self-harm"], json!(["text"]), "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ocr_can_be_switched_off() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = false).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let body = moderate(&app, &key, vec![image_item(&render::line(THREAT, 28.0))]).await;
    assert!(body["results"][0].get("extracted_text").is_none(), "{body}");
    assert!(
        !body["model"].as_str().unwrap().contains("ppocrv4"),
        "{body}"
    );
}

/// 1024×1024, 40 rows of short black bars: the detector finds a "line" in
/// each row, and the recogniser reads nothing it trusts (issue #58, B).
/// `seed` shifts the bars, so that images differ byte for byte.
fn bars(seed: u32) -> RgbImage {
    let mut image = RgbImage::from_pixel(1024, 1024, Rgb([255, 255, 255]));
    for row in 0..40 {
        let y = 12 + row * 25 + seed % 3;
        for x in (8 + seed % 5..1010).step_by(12) {
            for dy in 0..10 {
                for dx in 0..6 {
                    image.put_pixel(x + dx, y + dy, Rgb([0, 0, 0]));
                }
            }
        }
    }
    image
}

/// Characters of the allowance a request was charged: limit less remaining
/// (a fresh key, whose bucket was full).
async fn charged(app: &TestApp, key: &str, input: Vec<Value>) -> (u16, u64, Value) {
    let (status, headers, body) = parts(app.moderate(key, &json!({ "input": input })).await).await;
    let header = |name: &str| -> u64 {
        headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header ({status}): {body}"))
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let charge =
        header("x-ratelimit-limit-characters") - header("x-ratelimit-remaining-characters");
    (status, charge, body)
}

/// OCR is charged by its work, read or not: an image of bars that yields
/// no text still costs its detection and its 40 lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reading_is_charged_by_its_work_even_when_nothing_is_read() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let (status, charge, body) = charged(&app, &key, vec![image_item(&bars(0))]).await;
    assert_eq!(status, 200, "{body}");
    let read = body["results"][0]["extracted_text"]
        .as_str()
        .map_or(0, |t| t.chars().count() as u64);
    // At least the detector's 1024×1024 input at its default price.
    let detection = 1024 * 1024 * 2000 / 1_000_000;
    assert!(
        charge >= read + detection,
        "charged {charge} for {read} characters read"
    );
}

/// An image sent eight times in one request is read once: the request is
/// charged one reading's work (and the text read, per image), as its usage
/// record shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identical_image_is_read_once() {
    let app = spawn_app_with(Backend::Sqlite, |c| c.ocr.enabled = true).await;
    let image = image_item(&render::line(THREAT, 28.0));
    let (once_id, once) = app.create_key(Tier::Pro, None).await;
    let (eight_id, eight) = app.create_key(Tier::Pro, None).await;
    let body = moderate(&app, &once, vec![image.clone()]).await;
    let text = body["results"][0]["extracted_text"]
        .as_str()
        .expect("the threat is read")
        .chars()
        .count() as u64;
    let body = moderate(&app, &eight, vec![image; 8]).await;
    for result in body["results"].as_array().unwrap() {
        assert_eq!(words(&result["extracted_text"]), THREAT.to_lowercase());
    }
    let events = app.usage_events(2).await;
    let chars_of = |id| {
        events
            .iter()
            .find(|e| e.key_id == id)
            .expect("a usage record")
            .text_chars
    };
    let work = chars_of(once_id) - text;
    assert!(work > 0, "the reading's work is charged");
    assert_eq!(
        chars_of(eight_id),
        work + 8 * text,
        "one reading's work, eight texts"
    );
}

/// The lines read from all the images of a request are bounded: two
/// images of 40 bars read at most `max_regions_per_request` lines between
/// them, and a free key's flood is refused once its allowance would be
/// overdrawn, never charged past it. (Bounds small enough for a debug
/// build to read within the deadline.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lines_read_per_request_and_the_allowance_bound_a_flood() {
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.ocr.enabled = true;
        c.ocr.max_regions_per_request = 10;
        c.budget.chars_per_minute.free = 12_000;
        c.budget.request_deadline_ms = 120_000;
    })
    .await;
    let (_, pro) = app.create_key(Tier::Pro, None).await;
    let images: Vec<Value> = (0..2).map(|s| image_item(&bars(s))).collect();
    let (status, charge, body) = charged(&app, &pro, images).await;
    assert_eq!(status, 200, "{body}");
    // Two detections and at most 10 lines of the widest the recogniser
    // takes (2,400 × 48 pixels) at the default prices; the 80 lines of two
    // images cost about 96,000.
    let detections = 2 * (1024 * 1024 * 2000u64).div_ceil(1_000_000);
    let lines = 10 * (2400 * 48 * 13_000u64).div_ceil(1_000_000);
    assert!(charge <= detections + lines + 100, "charged {charge}");

    let (_, free) = app.create_key(Tier::Free, None).await;
    let eight: Vec<Value> = (0..8).map(|s| image_item(&bars(s))).collect();
    let mut last_remaining = u64::MAX;
    for _ in 0..3 {
        let (status, headers, body) = parts(
            app.moderate(&free, &json!({ "input": eight.clone() }))
                .await,
        )
        .await;
        assert!(status == 200 || status == 429, "{status}: {body}");
        if let Some(remaining) = headers.get("x-ratelimit-remaining-characters") {
            last_remaining = remaining.to_str().unwrap().parse().unwrap();
        }
        if status == 429 {
            assert_eq!(body["error"]["code"], "rate_limit_exceeded", "{body}");
            return;
        }
    }
    panic!("a free key read 24 images of 40 lines on 12,000 characters a minute (remaining {last_remaining})");
}
