//! Writes the OCR bench's screenshot (1024×768, ten lines of 18 px text;
//! `benches/ocr.rs`) as a PNG, for the `ocr` workload of `benches/load.sh`.
//!
//! Usage: cargo run --example ocr_screenshot -- OUT.png

#[path = "../tests/support/render_text.rs"]
mod render;

fn main() {
    let Some(out) = std::env::args_os().nth(1) else {
        eprintln!("usage: ocr_screenshot OUT.png");
        std::process::exit(2);
    };
    let png = render::png(&render::screenshot(&render::SCREENSHOT_LINES));
    if let Err(e) = std::fs::write(&out, png) {
        eprintln!("{}: {e}", out.to_string_lossy());
        std::process::exit(1);
    }
}
