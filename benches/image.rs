//! Image path costs: data-URI parse + decode, one nsfwjs inference on a
//! 224×224 image, and the whole path for a 1024×768 JPEG (parse, decode,
//! resize, inference). Inference benches need the converted weights
//! (scripts/fetch-nsfwjs.sh) and are skipped without them.

use std::hint::black_box;
use std::path::PathBuf;

use base64::Engine as _;
use criterion::{criterion_group, criterion_main, Criterion};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder, Rgb, RgbImage};
use moderato::moderation::image::decode::{decode, parse_data_uri};
use moderato::moderation::image::nsfw::NsfwClassifier;

/// A photo-like synthetic scene: smooth gradients plus some texture, so the
/// encoders do realistic work.
fn scene(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        let texture = ((x * 7 + y * 13) % 17) as u8;
        Rgb([
            (x * 255 / width) as u8 ^ texture,
            (y * 255 / height) as u8,
            ((x + y) % 256) as u8,
        ])
    })
}

fn data_uri(media_type: &str, bytes: &[u8]) -> String {
    format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn png_uri(img: &RgbImage) -> String {
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            ExtendedColorType::Rgb8,
        )
        .unwrap();
    data_uri("image/png", &out)
}

fn jpeg_uri(img: &RgbImage) -> String {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 85)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            ExtendedColorType::Rgb8,
        )
        .unwrap();
    data_uri("image/jpeg", &out)
}

fn models_dir() -> PathBuf {
    moderato::config::repository_models_dir()
}

fn benches(c: &mut Criterion) {
    let limits = moderato::config::Config::embedded_defaults().limits.image;
    let small = png_uri(&scene(224, 224));
    let large = jpeg_uri(&scene(1024, 768));

    c.bench_function("decode png 224x224", |b| {
        b.iter(|| {
            let (format, bytes) = parse_data_uri(black_box(&small), &limits).unwrap();
            decode(format, bytes, &limits).unwrap()
        })
    });
    c.bench_function("decode jpeg 1024x768", |b| {
        b.iter(|| {
            let (format, bytes) = parse_data_uri(black_box(&large), &limits).unwrap();
            decode(format, bytes, &limits).unwrap()
        })
    });

    let model = match NsfwClassifier::load(&models_dir()) {
        Ok(model) => model,
        Err(e) => {
            eprintln!("skipping inference benches: {e}");
            return;
        }
    };
    let (format, bytes) = parse_data_uri(&small, &limits).unwrap();
    let decoded = decode(format, bytes, &limits).unwrap();
    c.bench_function("nsfwjs inference 224x224", |b| {
        b.iter(|| model.class_probabilities(black_box(&decoded)).unwrap())
    });
    c.bench_function("jpeg 1024x768 decode+resize+inference", |b| {
        b.iter(|| {
            let (format, bytes) = parse_data_uri(black_box(&large), &limits).unwrap();
            let image = decode(format, bytes, &limits).unwrap();
            model.class_probabilities(&image).unwrap()
        })
    });
}

criterion_group! {
    name = image_benches;
    config = Criterion::default().sample_size(20);
    targets = benches
}
criterion_main!(image_benches);
