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
