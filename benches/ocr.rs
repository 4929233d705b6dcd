//! OCR costs: the detector alone on a 1024×768 picture without text (what
//! every image pays), and reading a 1024×768 screenshot with ten lines of
//! 18 px text (detector and recogniser), with one and with two threads per
//! model run (`ocr.threads`). Needs the models and the ONNX Runtime library
//! (scripts/setup.sh); skipped without them.

use std::hint::black_box;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use image::{Rgb, RgbImage};
use moderato::moderation::image::ocr::{Ocr, ReadLimits};
use moderato::moderation::Deadline;

#[path = "../tests/support/render_text.rs"]
mod render;
use render::SCREENSHOT_LINES;

fn limits() -> ReadLimits {
    ReadLimits {
        max_side: 1024,
        max_regions: 40,
        max_chars: 1000,
    }
}

fn bench(c: &mut Criterion) {
    let models = std::env::var_os("MODERATO_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"));
    let load = |threads| match Ocr::load(&models, threads) {
        Ok(ocr) => Some(ocr),
        Err(e) => {
            eprintln!("skipping the OCR benches: {e}");
            None
        }
    };
    let screenshot = render::screenshot(&SCREENSHOT_LINES);
    let blank = RgbImage::from_fn(1024, 768, |x, y| {
        Rgb([(x * 255 / 1024) as u8, (y * 255 / 768) as u8, 128])
    });
    let deadline = Deadline::distant();
    let mut group = c.benchmark_group("ocr");
    group.sample_size(20);
    for threads in [1, 2] {
        let Some(ocr) = load(threads) else { return };
        group.bench_function(
            format!("detect_only_1024x768_no_text/{threads}_threads"),
            |b| b.iter(|| black_box(ocr.read(&blank, &limits(), &deadline).unwrap())),
        );
        group.bench_function(format!("read_1024x768_ten_lines/{threads}_threads"), |b| {
            b.iter(|| black_box(ocr.read(&screenshot, &limits(), &deadline).unwrap()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
