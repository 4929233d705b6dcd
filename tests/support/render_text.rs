//! Text rendered into images at test time (DejaVu Sans from Debian's
//! fonts-dejavu-core), for the OCR tests and bench: shared by the unit
//! tests, the integration tests and the bench through `#[path]`.
#![allow(dead_code)]

use ab_glyph::{Font, FontVec, PxScale, ScaleFont};
use image::{Rgb, RgbImage};

pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

pub fn font() -> FontVec {
    let bytes = std::fs::read(FONT_PATH)
        .unwrap_or_else(|e| panic!("{FONT_PATH}: {e} (install fonts-dejavu-core)"));
    FontVec::try_from_vec(bytes).expect("DejaVu Sans parses")
}

/// Draws `text` with its top-left at (`x`, `y`), `px` pixels high, blending
/// `ink` over what is there.
pub fn draw(
    image: &mut RgbImage,
    font: &FontVec,
    text: &str,
    x: f32,
    y: f32,
    px: f32,
    ink: [u8; 3],
) {
    let scaled = font.as_scaled(PxScale::from(px));
    let mut caret = x;
    let baseline = y + scaled.ascent();
    let mut previous = None;
    for c in text.chars() {
        let id = font.glyph_id(c);
        if let Some(p) = previous {
            caret += scaled.kern(p, id);
        }
        let glyph = id.with_scale_and_position(px, ab_glyph::point(caret, baseline));
        caret += scaled.h_advance(id);
        previous = Some(id);
        let Some(outlined) = font.outline_glyph(glyph) else {
            continue;
        };
        let bounds = outlined.px_bounds();
        outlined.draw(|gx, gy, coverage| {
            let px = bounds.min.x as i64 + i64::from(gx);
            let py = bounds.min.y as i64 + i64::from(gy);
            if px < 0 || py < 0 || px >= i64::from(image.width()) || py >= i64::from(image.height())
            {
                return;
            }
            let pixel = image.get_pixel_mut(px as u32, py as u32);
            for c in 0..3 {
                let under = f32::from(pixel[c]);
                pixel[c] =
                    (under + (f32::from(ink[c]) - under) * coverage.clamp(0.0, 1.0)).round() as u8;
            }
        });
    }
}

/// Width in pixels of `text` at `px`.
pub fn text_width(font: &FontVec, text: &str, px: f32) -> f32 {
    let scaled = font.as_scaled(PxScale::from(px));
    text.chars()
        .map(|c| scaled.h_advance(font.glyph_id(c)))
        .sum()
}

/// The ten lines of the OCR bench's screenshot (`benches/ocr.rs`, and the
/// `ocr` workload of `benches/load.sh` through `examples/ocr_screenshot.rs`).
pub const SCREENSHOT_LINES: [&str; 10] = [
    "Re: invoice 4721 for the March order",
    "Hi Sam, thanks for sending the files over yesterday.",
    "The totals look right to me, except line 3 ($129.99).",
    "Could you check whether the discount was applied?",
    "We also need the delivery address for the Berlin office.",
    "The meeting is moved to Friday at 9:30 in room 2.",
    "Please bring your laptop and the charger this time.",
    "Let me know if anything is unclear.",
    "Best regards,",
    "Alex",
];

/// One line of dark text on a light background, with a margin.
pub fn line(text: &str, px: f32) -> RgbImage {
    let font = font();
    let margin = px;
    let width = (text_width(&font, text, px) + 2.0 * margin).ceil() as u32;
    let height = (px * 1.4 + 2.0 * margin).ceil() as u32;
    let mut image = RgbImage::from_pixel(width, height, Rgb([255, 255, 255]));
    draw(&mut image, &font, text, margin, margin, px, [0, 0, 0]);
    image
}

/// `image` turned by `degrees` about its centre onto a canvas of the same
/// size (bilinear; what falls outside is `fill`).
pub fn rotate(image: &RgbImage, degrees: f32, fill: [u8; 3]) -> RgbImage {
    let (sin, cos) = degrees.to_radians().sin_cos();
    let (w, h) = (image.width(), image.height());
    let (cx, cy) = (w as f32 / 2.0, h as f32 / 2.0);
    RgbImage::from_fn(w, h, |x, y| {
        let (dx, dy) = (x as f32 + 0.5 - cx, y as f32 + 0.5 - cy);
        let sx = cos * dx + sin * dy + cx - 0.5;
        let sy = -sin * dx + cos * dy + cy - 0.5;
        if sx < 0.0 || sy < 0.0 || sx > (w - 1) as f32 || sy > (h - 1) as f32 {
            return Rgb(fill);
        }
        let (x0, y0) = (sx.floor() as u32, sy.floor() as u32);
        let (x1, y1) = ((x0 + 1).min(w - 1), (y0 + 1).min(h - 1));
        let (fx, fy) = (sx - x0 as f32, sy - y0 as f32);
        let p = |x, y| image.get_pixel(x, y).0;
        let (a, b, c, d) = (p(x0, y0), p(x1, y0), p(x0, y1), p(x1, y1));
        Rgb(std::array::from_fn(|i| {
            let top = f32::from(a[i]) + (f32::from(b[i]) - f32::from(a[i])) * fx;
            let bottom = f32::from(c[i]) + (f32::from(d[i]) - f32::from(c[i])) * fx;
            (top + (bottom - top) * fy).round() as u8
        }))
    })
}

/// A deterministic noisy, colourful background (a small xorshift generator:
/// no dependency on `rand`'s streams).
pub fn noisy_background(width: u32, height: u32, seed: u64) -> RgbImage {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    RgbImage::from_fn(width, height, |x, y| {
        let n = next();
        let base = [
            200 + (x * 40 / width.max(1)) as u8,
            210 + (y * 30 / height.max(1)) as u8,
            190,
        ];
        Rgb(std::array::from_fn(|i| {
            base[i].saturating_sub(((n >> (8 * i)) & 0x3f) as u8)
        }))
    })
}

/// A 1024×768 screenshot: ten lines of 18 px text from `lines`.
pub fn screenshot(lines: &[&str]) -> RgbImage {
    let font = font();
    let mut image = RgbImage::from_pixel(1024, 768, Rgb([250, 250, 250]));
    for (i, text) in lines.iter().take(10).enumerate() {
        draw(
            &mut image,
            &font,
            text,
            40.0,
            40.0 + 60.0 * i as f32,
            18.0,
            [20, 20, 20],
        );
    }
    image
}

/// Encodes as PNG.
pub fn png(image: &RgbImage) -> Vec<u8> {
    let mut out = std::io::Cursor::new(Vec::new());
    image
        .write_to(&mut out, image::ImageFormat::Png)
        .expect("PNG encodes");
    out.into_inner()
}
