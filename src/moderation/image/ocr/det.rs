//! The text detector's pre- and post-processing (PaddleOCR's DB, as set in
//! rapidocr 1.4.4's config.yaml): the image resized to sides that are
//! multiples of 32 and normalised to [-1, 1]; the probability map thresholded,
//! its connected regions boxed, kept when their mean probability is high
//! enough, and grown back ("unclipped") by the margin DB shrank text by when
//! it was trained.
//!
//! Boxes are oriented rectangles (from the region's second moments), so a
//! line turned by a few degrees is cropped along its slope instead of as an
//! axis-aligned box that takes in its neighbours.

use image::RgbImage;

/// Pixels of the probability map above this are text (config.yaml `thresh`).
pub const PIXEL_THRESHOLD: f32 = 0.3;
/// A region is kept when its mean probability reaches this (`box_thresh`).
pub const BOX_THRESHOLD: f32 = 0.5;
/// How far a region is grown back: area × ratio / perimeter (`unclip_ratio`).
pub const UNCLIP_RATIO: f32 = 1.6;
/// Regions whose short side is under this many map pixels are noise.
const MIN_SIDE: f32 = 3.0;
/// The detector's downsampling: its input sides must be multiples of this.
const STRIDE: u32 = 32;
/// Images are scaled up until their short side has this many pixels
/// (config.yaml `limit_side_len` with `limit_type: min`): small text in a
/// small image is read better larger.
pub const MIN_SHORT_SIDE: u32 = 736;
/// ... but by at most this factor: not at all. rapidocr scales small images
/// up to a short side of 736. It was turned off here because a 24 px line in
/// a 450 × 80 image scaled up came out as "Iwillmurderyou..."; the cause
/// was crops too tight to show the gaps between words, since fixed by
/// [`super::rec::LINE_MARGIN`]. Scaling up has not been measured again (it
/// costs detector time on every small image); kept as a named factor so
/// that the choice is visible.
const MAX_UPSCALE: f64 = 1.0;

/// The detector's input: `[1, 3, height, width]`, BGR, values in [-1, 1].
#[derive(Debug)]
pub struct DetectorInput {
    pub data: Vec<f32>,
    pub width: u32,
    pub height: u32,
    /// Input pixels per original pixel, horizontally and vertically.
    pub scale_x: f32,
    pub scale_y: f32,
}

/// The detector's input size for an image: short side scaled up to
/// [`MIN_SHORT_SIDE`] unless the long side would pass `max_side`, long side
/// scaled down to `max_side`, each side then rounded to a multiple of 32.
pub fn input_size(width: u32, height: u32, max_side: u32) -> (u32, u32) {
    let (w, h) = (f64::from(width.max(1)), f64::from(height.max(1)));
    let long = w.max(h);
    let short = w.min(h);
    let up = f64::from(MIN_SHORT_SIDE) / short;
    let down = f64::from(max_side) / long;
    let scale = up.clamp(1.0, MAX_UPSCALE).min(down);
    let round = |side: f64| -> u32 {
        let side = (side * scale).round().clamp(1.0, f64::from(u32::MAX));
        // Clamped to u32's range just above, so the cast cannot truncate.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let side = side as u32;
        // At least 64: the detector's deepest maps are 1/32 of the input,
        // and convolutions underflow on maps of a single pixel (tract's did).
        (side.div_ceil(STRIDE) * STRIDE).max(2 * STRIDE)
    };
    (round(w), round(h))
}

/// Resizes and normalises `image` for the detector.
pub fn prepare(image: &RgbImage, max_side: u32) -> DetectorInput {
    let (width, height) = input_size(image.width(), image.height(), max_side);
    let resized =
        image::imageops::resize(image, width, height, image::imageops::FilterType::Triangle);
    let plane = (width as usize) * (height as usize);
    let mut data = vec![0f32; 3 * plane];
    for (i, pixel) in resized.pixels().enumerate() {
        // BGR: the model was trained on OpenCV's channel order.
        for (c, value) in [pixel[2], pixel[1], pixel[0]].into_iter().enumerate() {
            data[c * plane + i] = f32::from(value) / 127.5 - 1.0;
        }
    }
    DetectorInput {
        data,
        width,
        height,
        scale_x: width as f32 / image.width().max(1) as f32,
        scale_y: height as f32 / image.height().max(1) as f32,
    }
}

/// A text region: a rectangle of `length` × `thickness` centred on
/// (`cx`, `cy`), its length along (`cos`, `sin`) (reading direction, within
/// 45° of horizontal, left to right), in original image pixels.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TextBox {
    pub cx: f32,
    pub cy: f32,
    pub cos: f32,
    pub sin: f32,
    pub length: f32,
    pub thickness: f32,
    /// Mean text probability over the region.
    pub score: f32,
}

impl TextBox {
    /// The point at `u` along the reading direction and `v` across it, from
    /// the centre.
    pub fn point(&self, u: f32, v: f32) -> (f32, f32) {
        (
            self.cx + u * self.cos - v * self.sin,
            self.cy + u * self.sin + v * self.cos,
        )
    }

    /// Top edge's y, for reading order.
    fn top(&self) -> f32 {
        self.cy - self.thickness / 2.0
    }
}

/// The text boxes of a probability map of `width` × `height`, in original
/// image pixels (the map's pixels divided by `scale_x`/`scale_y`), in
/// reading order, at most `max_boxes` (the highest-scoring ones).
pub fn boxes(
    map: &[f32],
    width: usize,
    height: usize,
    scale_x: f32,
    scale_y: f32,
    max_boxes: usize,
) -> Vec<TextBox> {
    let bitmap = dilated_bitmap(map, width, height);
    let mut boxes: Vec<TextBox> = regions(&bitmap, width, height)
        .into_iter()
        .filter_map(|pixels| region_box(&pixels, map, width))
        .map(|b| to_original(b, scale_x, scale_y))
        .collect();
    if boxes.len() > max_boxes {
        boxes.sort_by(|a, b| b.score.total_cmp(&a.score));
        boxes.truncate(max_boxes);
    }
    reading_order(&mut boxes);
    boxes
}

/// Map pixels above [`PIXEL_THRESHOLD`], grown by one pixel right and down
/// (config.yaml's `use_dilation`: OpenCV's 2×2 dilation), which joins the
/// letters of small text and widens thin regions.
fn dilated_bitmap(map: &[f32], width: usize, height: usize) -> Vec<bool> {
    let on = |x: usize, y: usize| map[y * width + x] > PIXEL_THRESHOLD;
    let mut bitmap = vec![false; map.len()];
    for y in 0..height {
        for x in 0..width {
            bitmap[y * width + x] = on(x, y)
                || (x > 0 && on(x - 1, y))
                || (y > 0 && on(x, y - 1))
                || (x > 0 && y > 0 && on(x - 1, y - 1));
        }
    }
    bitmap
}

/// The 8-connected regions of a bitmap, each as its pixels' (x, y).
fn regions(bitmap: &[bool], width: usize, height: usize) -> Vec<Vec<(u32, u32)>> {
    let map = bitmap;
    let mut seen = vec![false; map.len()];
    let mut regions = Vec::new();
    let mut stack = Vec::new();
    for start in 0..map.len() {
        if seen[start] || !map[start] {
            continue;
        }
        seen[start] = true;
        stack.push(start);
        let mut pixels = Vec::new();
        while let Some(i) = stack.pop() {
            let (x, y) = (i % width, i / width);
            // Indices are below the map's length, which fits u32 for any
            // detector input (its sides are bounded by the configured size).
            #[allow(clippy::cast_possible_truncation)]
            pixels.push((x as u32, y as u32));
            for dy in -1isize..=1 {
                for dx in -1isize..=1 {
                    let (nx, ny) = (x.wrapping_add_signed(dx), y.wrapping_add_signed(dy));
                    if nx >= width || ny >= height {
                        continue;
                    }
                    let n = ny * width + nx;
                    if !seen[n] && map[n] {
                        seen[n] = true;
                        stack.push(n);
                    }
                }
            }
        }
        regions.push(pixels);
    }
    regions
}

/// The oriented rectangle around a region, grown back by the unclip margin,
/// in map pixels; `None` when too thin or not confident enough.
fn region_box(pixels: &[(u32, u32)], map: &[f32], width: usize) -> Option<TextBox> {
    let n = pixels.len() as f32;
    let score = pixels
        .iter()
        .map(|&(x, y)| map[y as usize * width + x as usize])
        .sum::<f32>()
        / n;
    if score < BOX_THRESHOLD {
        return None;
    }
    // Pixel centres.
    let (mx, my) = pixels.iter().fold((0f32, 0f32), |(sx, sy), &(x, y)| {
        (sx + x as f32 + 0.5, sy + y as f32 + 0.5)
    });
    let (mx, my) = (mx / n, my / n);
    let (mut sxx, mut syy, mut sxy) = (0f32, 0f32, 0f32);
    for &(x, y) in pixels {
        let (dx, dy) = (x as f32 + 0.5 - mx, y as f32 + 0.5 - my);
        sxx += dx * dx;
        syy += dy * dy;
        sxy += dx * dy;
    }
    let mut angle = 0.5 * (2.0 * sxy).atan2(sxx - syy);
    // Read along the axis nearer horizontal, left to right: a single glyph's
    // long axis may be vertical, but its line still runs across.
    let quarter = std::f32::consts::FRAC_PI_4;
    if angle > quarter {
        angle -= std::f32::consts::FRAC_PI_2;
    } else if angle < -quarter {
        angle += std::f32::consts::FRAC_PI_2;
    }
    let (sin, cos) = angle.sin_cos();
    let (mut u_min, mut u_max, mut v_min, mut v_max) = (f32::MAX, f32::MIN, f32::MAX, f32::MIN);
    for &(x, y) in pixels {
        let (dx, dy) = (x as f32 + 0.5 - mx, y as f32 + 0.5 - my);
        let (u, v) = (dx * cos + dy * sin, -dx * sin + dy * cos);
        u_min = u_min.min(u - 0.5);
        u_max = u_max.max(u + 0.5);
        v_min = v_min.min(v - 0.5);
        v_max = v_max.max(v + 0.5);
    }
    let (length, thickness) = (u_max - u_min, v_max - v_min);
    if length.min(thickness) < MIN_SIDE {
        return None;
    }
    let margin = unclip_margin(length, thickness);
    let (uc, vc) = ((u_min + u_max) / 2.0, (v_min + v_max) / 2.0);
    Some(TextBox {
        cx: mx + uc * cos - vc * sin,
        cy: my + uc * sin + vc * cos,
        cos,
        sin,
        length: length + 2.0 * margin,
        thickness: thickness + 2.0 * margin,
        score,
    })
}

/// DB's unclip distance for a rectangle: area × ratio / perimeter.
pub fn unclip_margin(length: f32, thickness: f32) -> f32 {
    length * thickness * UNCLIP_RATIO / (2.0 * (length + thickness))
}

/// A map-pixel box in original image pixels. The two scales differ only by
/// the rounding to multiples of 32, so the box's angle is kept.
fn to_original(b: TextBox, scale_x: f32, scale_y: f32) -> TextBox {
    let along = ((b.cos / scale_x).powi(2) + (b.sin / scale_y).powi(2)).sqrt();
    let across = ((b.sin / scale_x).powi(2) + (b.cos / scale_y).powi(2)).sqrt();
    TextBox {
        cx: b.cx / scale_x,
        cy: b.cy / scale_y,
        length: b.length * along,
        thickness: b.thickness * across,
        ..b
    }
}

/// Top to bottom; boxes on one line (tops within half a line) left to right.
fn reading_order(boxes: &mut [TextBox]) {
    boxes.sort_by(|a, b| a.top().total_cmp(&b.top()));
    // An insertion pass: lines are few and almost sorted.
    for i in 1..boxes.len() {
        let mut j = i;
        while j > 0 {
            let (prev, cur) = (&boxes[j - 1], &boxes[j]);
            let same_line =
                (cur.top() - prev.top()).abs() < cur.thickness.min(prev.thickness) / 2.0;
            if same_line && cur.cx < prev.cx {
                boxes.swap(j - 1, j);
                j -= 1;
            } else {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_sides_are_multiples_of_32_within_the_limit() {
        // A screenshot: the short side already above 736, nothing to scale.
        assert_eq!(input_size(1024, 768, 1024), (1024, 768));
        // Small images are not scaled up (see MAX_UPSCALE).
        assert_eq!(input_size(500, 400, 2000), (512, 416));
        assert_eq!(input_size(200, 100, 2000), (224, 128));
        // ... and never past the largest side.
        assert_eq!(input_size(600, 400, 960), (608, 416));
        // Large ones scaled down.
        assert_eq!(input_size(4000, 3000, 960), (960, 736));
        assert_eq!(input_size(1, 1, 960), (64, 64));
    }

    #[test]
    fn preparation_normalises_bgr_planes() {
        let image = RgbImage::from_pixel(64, 64, image::Rgb([255, 0, 0]));
        let input = prepare(&image, 64);
        assert_eq!((input.width, input.height), (64, 64));
        let plane = 64 * 64;
        assert_eq!(input.data[0], -1.0, "blue plane first");
        assert_eq!(input.data[2 * plane], 1.0, "red plane last");
    }

    /// A map with a filled rectangle of probability `p`.
    fn map_with(
        width: usize,
        height: usize,
        rects: &[(usize, usize, usize, usize, f32)],
    ) -> Vec<f32> {
        let mut map = vec![0f32; width * height];
        for &(x0, y0, w, h, p) in rects {
            for y in y0..y0 + h {
                for x in x0..x0 + w {
                    map[y * width + x] = p;
                }
            }
        }
        map
    }

    #[test]
    fn a_region_is_boxed_and_grown_back() {
        let map = map_with(100, 50, &[(10, 20, 60, 10, 0.9)]);
        let boxes = boxes(&map, 100, 50, 1.0, 1.0, 10);
        assert_eq!(boxes.len(), 1);
        let b = boxes[0];
        assert!(
            // Dilation grows the region by a pixel right and down.
            (b.cx - 40.5).abs() < 0.01 && (b.cy - 25.5).abs() < 0.01,
            "{b:?}"
        );
        assert!(b.sin.abs() < 1e-4, "horizontal: {b:?}");
        let margin = unclip_margin(61.0, 11.0);
        assert!((b.length - (61.0 + 2.0 * margin)).abs() < 0.01, "{b:?}");
        assert!((b.thickness - (11.0 + 2.0 * margin)).abs() < 0.01, "{b:?}");
        // The mean over the region, its dilated rim (0) included.
        let expected = 0.9 * 600.0 / (61.0 * 11.0);
        assert!((b.score - expected).abs() < 1e-4, "{b:?}");
    }

    #[test]
    fn faint_and_thin_regions_are_dropped() {
        let map = map_with(100, 50, &[(10, 5, 60, 10, 0.4), (10, 30, 60, 1, 0.9)]);
        assert!(boxes(&map, 100, 50, 1.0, 1.0, 10).is_empty());
    }

    #[test]
    fn boxes_come_in_reading_order_and_in_image_pixels() {
        let map = map_with(
            200,
            100,
            &[
                (120, 10, 50, 10, 0.9),
                (10, 12, 50, 10, 0.8),
                (10, 60, 50, 10, 0.95),
            ],
        );
        let found = boxes(&map, 200, 100, 2.0, 2.0, 10);
        let centres: Vec<(f32, f32)> = found.iter().map(|b| (b.cx, b.cy)).collect();
        assert_eq!(centres, vec![(17.75, 8.75), (72.75, 7.75), (17.75, 32.75)]);
        // The most confident two when capped, still in reading order.
        let capped = boxes(&map, 200, 100, 2.0, 2.0, 2);
        let centres: Vec<(f32, f32)> = capped.iter().map(|b| (b.cx, b.cy)).collect();
        assert_eq!(centres, vec![(72.75, 7.75), (17.75, 32.75)]);
    }

    #[test]
    fn a_sloped_line_gets_a_sloped_box() {
        let (width, height) = (200, 100);
        let mut map = vec![0f32; width * height];
        let slope = 10f32.to_radians().tan();
        for x in 20..180 {
            let centre = 50.0 + (x as f32 - 100.0) * slope;
            for y in 0..height {
                if (y as f32 - centre).abs() < 5.0 {
                    map[y * width + x] = 0.9;
                }
            }
        }
        let found = boxes(&map, width, height, 1.0, 1.0, 10);
        assert_eq!(found.len(), 1);
        let angle = found[0].sin.atan2(found[0].cos).to_degrees();
        assert!((angle - 10.0).abs() < 1.0, "{angle}");
        let thickness_before_unclip = found[0].thickness - 2.0 * unclip_margin(160.0, 10.0);
        assert!(thickness_before_unclip < 16.0, "{:?}", found[0]);
    }
}
