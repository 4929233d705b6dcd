//! The recogniser's pre- and post-processing (PaddleOCR's SVTR-LCNet CTC
//! model): each text box cut out along its slope, with a margin above and
//! below ([`LINE_MARGIN`]), and resampled to 48 pixels high, its width
//! following its aspect; the output decoded greedily (the likeliest class
//! per step, repeats merged, blanks dropped) with the model's own
//! dictionary.

use image::RgbImage;

use super::det::TextBox;

/// The recogniser's input height.
pub const HEIGHT: u32 = 48;
/// Widest line image: longer lines are squeezed (the model reads about 40
/// characters per 320 pixels, so this is about 300 characters).
pub const MAX_WIDTH: u32 = 2400;
/// Extra margin above and below a text box when its line is cut out, as a
/// fraction of the box's thickness (on each side).
///
/// The detector's boxes, even grown back by the unclip margin, are tight:
/// on rendered DejaVu Sans lines of 16 to 32 px they are 1.0 to 1.25 times
/// the font size thick, and sit low, about 0.07 of the font size above the
/// ink and 0.2 below it. (The unclip is DB's; PaddleOCR measures a region
/// to its pixels' centres, we to their edges, so ours are a map pixel
/// thicker, not thinner.) The recogniser was trained on looser crops: so
/// cut, it reads the words but often not the spaces between them
/// ("meetingMarch"). With the accuracy test's 120 lines, the character
/// error rate by margin: 0 → 3.21 %, 0.05 → 0.87 %, 0.1 → 0.23 %,
/// 0.125 → 0.21 %, 0.15 → 0.07 %, 0.175 → 0.02 %, 0.2 → 0.09 %,
/// 0.225 → 0.11 %, 0.25 → 0.05 %, 0.3 → 0.36 %, 0.4 → 1.19 % (too much
/// blank above and below loses spaces again). 0.2 is the middle
/// of the flat region 0.15–0.25, not the best single figure in it; it puts
/// about 0.3 of the font size between the ink and the crop's top edge and
/// 0.45 below, near the 0.4 at which a prototype (onnxruntime, the same
/// model) read best.
/// The length is not grown: a margin at the ends made no difference.
pub const LINE_MARGIN: f32 = 0.2;
/// Lines whose mean character confidence is below this are dropped
/// (config.yaml `text_score`).
pub const MIN_CONFIDENCE: f32 = 0.5;

/// The model's classes: 0 is CTC's blank, then the characters of its
/// metadata, then a space (PaddleOCR's `use_space_char`).
#[derive(Debug)]
pub struct Dictionary {
    classes: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("the recogniser's character list is empty")]
pub struct EmptyDictionary;

impl Dictionary {
    /// From the model's `character` metadata: one character per line.
    pub fn from_metadata(characters: &str) -> Result<Dictionary, EmptyDictionary> {
        let mut classes = vec![String::new()];
        classes.extend(
            characters
                .split('\n')
                .map(|c| c.trim_end_matches('\r'))
                .filter(|c| !c.is_empty())
                .map(str::to_string),
        );
        if classes.len() == 1 {
            return Err(EmptyDictionary);
        }
        classes.push(" ".to_string());
        Ok(Dictionary { classes })
    }

    /// Number of classes, blank included: the model's output width.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A line read, with its mean character confidence.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    pub text: String,
    pub confidence: f32,
}

/// Greedy CTC decoding of one line's `steps` × `dictionary.len()`
/// probabilities.
pub fn decode(probs: &[f32], dictionary: &Dictionary) -> Decoded {
    let classes = dictionary.len();
    let mut text = String::new();
    let (mut sum, mut count) = (0f32, 0usize);
    let mut previous = 0;
    for step in probs.chunks_exact(classes) {
        let (best, p) = step
            .iter()
            .copied()
            .enumerate()
            .fold(
                (0, f32::MIN),
                |acc, (i, p)| if p > acc.1 { (i, p) } else { acc },
            );
        if best != 0 && best != previous {
            text.push_str(&dictionary.classes[best]);
            sum += p;
            count += 1;
        }
        previous = best;
    }
    let text = text.trim().to_string();
    let confidence = if count == 0 { 0.0 } else { sum / count as f32 };
    Decoded { text, confidence }
}

/// The region cut out for box `b`: `b` with [`LINE_MARGIN`] above and below.
pub fn crop(b: &TextBox) -> TextBox {
    TextBox {
        thickness: b.thickness * (1.0 + 2.0 * LINE_MARGIN),
        ..*b
    }
}

/// Width of a box's line image: its [`crop`]'s aspect at 48 high, at least
/// 8 (one output step), at most [`MAX_WIDTH`].
pub fn line_width(b: &TextBox) -> u32 {
    let b = crop(b);
    let ratio = b.length / b.thickness.max(1.0);
    let width = (ratio * HEIGHT as f32).ceil().clamp(8.0, MAX_WIDTH as f32);
    // Clamped to [8, MAX_WIDTH] just above.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let width = width as u32;
    width
}

/// Samples box `b`'s [`crop`] from `image` (bilinear, edges repeated) into
/// a `width` × 48 BGR image normalised to [-1, 1], written as three planes
/// of `stride` columns (the batch's width; columns past `width` are left as
/// they are, 0: mid-grey, as PaddleOCR pads).
pub fn sample_line(image: &RgbImage, b: &TextBox, width: u32, stride: usize, out: &mut [f32]) {
    let b = crop(b);
    let plane = stride * HEIGHT as usize;
    let step_u = b.length / width as f32;
    let step_v = b.thickness / HEIGHT as f32;
    for row in 0..HEIGHT {
        let v = (row as f32 + 0.5) * step_v - b.thickness / 2.0;
        for col in 0..width {
            let u = (col as f32 + 0.5) * step_u - b.length / 2.0;
            let (x, y) = b.point(u, v);
            let rgb = bilinear(image, x - 0.5, y - 0.5);
            let at = row as usize * stride + col as usize;
            for (c, value) in [rgb[2], rgb[1], rgb[0]].into_iter().enumerate() {
                out[c * plane + at] = value / 127.5 - 1.0;
            }
        }
    }
}

fn bilinear(image: &RgbImage, x: f32, y: f32) -> [f32; 3] {
    let max_x = image.width().saturating_sub(1) as f32;
    let max_y = image.height().saturating_sub(1) as f32;
    let (x, y) = (x.clamp(0.0, max_x), y.clamp(0.0, max_y));
    let (x0, y0) = (x.floor(), y.floor());
    let (fx, fy) = (x - x0, y - y0);
    // In [0, max] after the clamp, so the casts are exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let (x0, y0) = (x0 as u32, y0 as u32);
    let (x1, y1) = (
        (x0 + 1).min(image.width() - 1),
        (y0 + 1).min(image.height() - 1),
    );
    let p = |x, y| image.get_pixel(x, y).0.map(f32::from);
    let (a, b, c, d) = (p(x0, y0), p(x1, y0), p(x0, y1), p(x1, y1));
    std::array::from_fn(|i| {
        let top = a[i] + (b[i] - a[i]) * fx;
        let bottom = c[i] + (d[i] - c[i]) * fx;
        top + (bottom - top) * fy
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dictionary() -> Dictionary {
        Dictionary::from_metadata("a\nb\nc\n").unwrap()
    }

    /// One step per class index, each certain.
    fn steps(indices: &[usize]) -> Vec<f32> {
        let mut probs = vec![0f32; indices.len() * 5];
        for (t, &i) in indices.iter().enumerate() {
            probs[t * 5 + i] = 0.9;
        }
        probs
    }

    #[test]
    fn the_dictionary_has_blank_first_and_space_last() {
        let d = dictionary();
        assert_eq!(d.len(), 5);
        assert_eq!(d.classes[0], "");
        assert_eq!(d.classes[4], " ");
        assert!(Dictionary::from_metadata("\n").is_err());
    }

    #[test]
    fn ctc_merges_repeats_and_drops_blanks() {
        let d = dictionary();
        // a a _ a b b _ _ c ␣ a
        let decoded = decode(&steps(&[1, 1, 0, 1, 2, 2, 0, 0, 3, 4, 1]), &d);
        assert_eq!(decoded.text, "aabc a");
        assert!((decoded.confidence - 0.9).abs() < 1e-6);
        let nothing = decode(&steps(&[0, 0, 4]), &d);
        assert_eq!(nothing.text, "");
        assert_eq!(nothing.confidence, 0.9, "the space was read, then trimmed");
        assert_eq!(decode(&steps(&[0, 0]), &d).confidence, 0.0);
    }

    #[test]
    fn line_width_follows_the_aspect_within_bounds() {
        let b = |length, thickness| TextBox {
            cx: 0.0,
            cy: 0.0,
            cos: 1.0,
            sin: 0.0,
            length,
            thickness,
            score: 1.0,
        };
        // 240 × 24 cut out 24 × 1.4 = 33.6 high: 342.9 wide at 48 high.
        assert_eq!(line_width(&b(240.0, 24.0)), 343);
        assert_eq!(line_width(&b(2.0, 24.0)), 8);
        assert_eq!(line_width(&b(1e6, 24.0)), MAX_WIDTH);
    }

    /// A white 100 × 100 image with a black band across rows `rows`.
    fn banded(rows: std::ops::Range<u32>) -> RgbImage {
        let mut image = RgbImage::from_pixel(100, 100, image::Rgb([255, 255, 255]));
        for y in rows {
            for x in 0..100 {
                image.put_pixel(x, y, image::Rgb([0, 0, 0]));
            }
        }
        image
    }

    /// A level 40 × 10 box centred on (50, 50).
    fn level_box() -> TextBox {
        TextBox {
            cx: 50.0,
            cy: 50.0,
            cos: 1.0,
            sin: 0.0,
            length: 40.0,
            thickness: 10.0,
            score: 1.0,
        }
    }

    #[test]
    fn sampling_an_axis_aligned_box_copies_its_pixels() {
        let image = banded(40..60);
        // Inside the dark band, 40 × 10 pixels, cut out 40 × 14 with the
        // margin (still inside the band): 138 × 48 at 48 high.
        let b = level_box();
        let width = line_width(&b);
        assert_eq!(width, 138);
        let stride = 160;
        let mut out = vec![0f32; 3 * stride * HEIGHT as usize];
        sample_line(&image, &b, width, stride, &mut out);
        let plane = stride * HEIGHT as usize;
        assert!(
            out[..plane]
                .chunks_exact(stride)
                .all(|row| row[..width as usize].iter().all(|v| *v == -1.0)),
            "black is -1, in every row"
        );
        assert!(
            out[width as usize..stride].iter().all(|v| *v == 0.0),
            "padding untouched"
        );
    }

    #[test]
    fn lines_are_cut_out_with_a_margin_above_and_below() {
        // A dark band exactly as thick as the box: the crop's first and last
        // rows fall on the white above and below it, its middle on the band.
        let image = banded(45..55);
        let b = level_box();
        let cut = crop(&b);
        assert_eq!((cut.cx, cut.cy, cut.length), (b.cx, b.cy, b.length));
        assert!((cut.thickness - 10.0 * (1.0 + 2.0 * LINE_MARGIN)).abs() < 1e-4);
        let width = line_width(&b);
        let stride = width as usize;
        let mut out = vec![0f32; 3 * stride * HEIGHT as usize];
        sample_line(&image, &b, width, stride, &mut out);
        let row = |r: usize| &out[r * stride..r * stride + stride];
        assert!(row(0).iter().all(|v| *v == 1.0), "white above");
        assert!(
            row(HEIGHT as usize - 1).iter().all(|v| *v == 1.0),
            "white below"
        );
        assert!(
            row(HEIGHT as usize / 2).iter().all(|v| *v == -1.0),
            "the band"
        );
    }
}
