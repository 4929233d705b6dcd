//! Text inside images: PaddleOCR's PP-OCRv4 detector and recogniser
//! (Apache-2.0, English and Chinese), as ONNX from the PyPI package
//! rapidocr-onnxruntime 1.4.4 (`scripts/fetch-ocr.sh`), run with tract, a
//! pure-Rust ONNX runtime (no native library to ship or load).
//!
//! Reading one image: the detector's probability map of text pixels (one
//! pass over the image, scaled to at most `max_side`), the text boxes drawn
//! from it ([`det`]), then each box cut out along its slope and read by the
//! recogniser in batches of similar widths ([`rec`]). An image without text
//! costs the detector's pass only.

pub mod det;
pub mod rec;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use image::RgbImage;
use sha2::{Digest, Sha256};
use tract_onnx::prelude::*;

use crate::moderation::deadline::{Deadline, DeadlineExceeded};
use det::TextBox;
use rec::Dictionary;

/// The installed files below the models directory, with their pinned
/// sha256 (the same as in scripts/fetch-ocr.sh).
pub const DETECTOR_FILE: &str = "ppocr/det.onnx";
pub const RECOGNISER_FILE: &str = "ppocr/rec.onnx";
const DETECTOR_SHA256: &str = "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9";
const RECOGNISER_SHA256: &str = "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b";

/// Reported beside the other models' ids.
pub const MODEL_ID: &str = "ppocrv4";

/// Lines read together. One at a time: every batch size would need plans
/// of its own (see [`WIDTH_STEP`]), and on two cores a batch is not faster.
const BATCH: usize = 1;

/// The recogniser's widths are rounded up to multiples of this: its graph
/// computes reshapes from its input's shape, which tract can only plan for
/// a known width, so each width gets a plan of its own (made on first use
/// and kept).
const WIDTH_STEP: u32 = 160;

type Plan = TypedSimplePlan<TypedModel>;

/// Images with a side shorter than this hold no readable line (and the
/// detector's convolutions need some room).
const MIN_IMAGE_SIDE: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum OcrError {
    #[error("the OCR model file {path} is missing; run scripts/setup.sh (or scripts/fetch-ocr.sh) to fetch it")]
    Missing { path: PathBuf },
    #[error("the OCR model file {path} is unreadable or not the expected model ({reason}); delete it and run scripts/setup.sh (or scripts/fetch-ocr.sh)")]
    Corrupt { path: PathBuf, reason: String },
    #[error("OCR inference failed: {0}")]
    Inference(String),
    #[error(transparent)]
    DeadlineExceeded(#[from] DeadlineExceeded),
}

/// How much one image's reading may cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// The detector's input is scaled to at most this many pixels a side.
    pub max_side: u32,
    /// Boxes read, the most confident first.
    pub max_regions: usize,
    /// Characters kept; reading stops once this many were read.
    pub max_chars: usize,
}

/// The lines read from one image, in reading order; never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadText {
    lines: Vec<String>,
}

impl ReadText {
    /// `None` without any line.
    pub fn new(lines: Vec<String>) -> Option<ReadText> {
        let lines: Vec<String> = lines.into_iter().filter(|l| !l.is_empty()).collect();
        (!lines.is_empty()).then_some(ReadText { lines })
    }

    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The lines joined by line breaks.
    pub fn text(&self) -> String {
        self.lines.join("\n")
    }

    pub fn chars(&self) -> usize {
        self.lines.iter().map(|l| l.chars().count()).sum::<usize>() + self.lines.len() - 1
    }
}

/// The detector and recogniser, loaded and optimised once.
pub struct Ocr {
    /// The detector as loaded, and its plans by input (height, width):
    /// tract runs a plan for known sides many times faster than one for
    /// symbolic sides.
    detector: InferenceModel,
    det_plans: Mutex<HashMap<(usize, usize), Arc<Plan>>>,
    det_path: PathBuf,
    /// The recogniser as loaded, before its input's shape is fixed.
    recogniser: InferenceModel,
    /// Its plans by (lines, width).
    plans: Mutex<HashMap<(usize, u32), Arc<Plan>>>,
    dictionary: Dictionary,
    rec_path: PathBuf,
}

impl Ocr {
    /// Loads `<models_dir>/ppocr/{det,rec}.onnx`, checking their pins.
    pub fn load(models_dir: &Path) -> Result<Ocr, OcrError> {
        let det_path = models_dir.join(DETECTOR_FILE);
        let rec_path = models_dir.join(RECOGNISER_FILE);
        let det_bytes = read_pinned(&det_path, DETECTOR_SHA256)?;
        let rec_bytes = read_pinned(&rec_path, RECOGNISER_SHA256)?;
        let corrupt = |path: &Path| {
            let path = path.to_path_buf();
            move |e: TractError| OcrError::Corrupt {
                path: path.clone(),
                reason: format!("{e:#}"),
            }
        };
        let onnx = tract_onnx::onnx();
        // Height and width stay symbolic: one optimised plan serves every
        // image size and line width.
        let detector = onnx
            .model_for_read(&mut det_bytes.as_slice())
            .map_err(corrupt(&det_path))?;
        let proto = onnx
            .proto_model_for_read(&mut rec_bytes.as_slice())
            .map_err(corrupt(&rec_path))?;
        let characters = proto
            .metadata_props
            .iter()
            .find(|p| p.key == "character")
            .map(|p| p.value.clone())
            .ok_or_else(|| OcrError::Corrupt {
                path: rec_path.clone(),
                reason: "no `character` metadata".into(),
            })?;
        let dictionary = Dictionary::from_metadata(&characters).map_err(|e| OcrError::Corrupt {
            path: rec_path.clone(),
            reason: e.to_string(),
        })?;
        let recogniser = onnx
            .model_for_proto_model(&proto)
            .map_err(corrupt(&rec_path))?;
        let ocr = Ocr {
            detector,
            det_plans: Mutex::default(),
            det_path,
            recogniser,
            plans: Mutex::default(),
            dictionary,
            rec_path,
        };
        // The commonest shape planned now, so that a broken model fails
        // the start rather than the first image.
        ocr.plan(1, WIDTH_STEP * 2)?;
        Ok(ocr)
    }

    /// The detector's plan for an input of `height` × `width`.
    fn det_plan(&self, height: usize, width: usize) -> Result<Arc<Plan>, OcrError> {
        let key = (height, width);
        if let Some(plan) = self
            .det_plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(plan.clone());
        }
        let plan = self
            .detector
            .clone()
            .with_input_fact(0, f32::fact([1, 3, height, width]).into())
            .and_then(|model| model.into_optimized()?.into_runnable())
            .map_err(|e| OcrError::Corrupt {
                path: self.det_path.clone(),
                reason: format!("{e:#}"),
            })?;
        let plan = Arc::new(plan);
        self.det_plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, plan.clone());
        Ok(plan)
    }

    /// The recogniser's plan for `lines` lines of `width` pixels.
    fn plan(&self, lines: usize, width: u32) -> Result<Arc<Plan>, OcrError> {
        let key = (lines, width);
        if let Some(plan) = self
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(plan.clone());
        }
        let shape = [lines, 3, rec::HEIGHT as usize, width as usize];
        let plan = self
            .recogniser
            .clone()
            .with_input_fact(0, f32::fact(shape).into())
            .and_then(|model| model.into_optimized()?.into_runnable())
            .map_err(|e| OcrError::Corrupt {
                path: self.rec_path.clone(),
                reason: format!("{e:#}"),
            })?;
        let plan = Arc::new(plan);
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, plan.clone());
        Ok(plan)
    }

    /// Reads the text of `image`, stopping at `deadline`. `None`: no text.
    /// A panic inside the runtime (tract checks its arithmetic in debug
    /// builds) is an `Inference` error, never the caller's panic.
    pub fn read(
        &self,
        image: &RgbImage,
        limits: &ReadLimits,
        deadline: &Deadline,
    ) -> Result<Option<ReadText>, OcrError> {
        if limits.max_chars == 0
            || limits.max_regions == 0
            || image.width().min(image.height()) < MIN_IMAGE_SIDE
        {
            return Ok(None);
        }
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.read_unguarded(image, limits, deadline)
        }))
        .unwrap_or_else(|_| Err(OcrError::Inference("the ONNX runtime panicked".into())))
    }

    fn read_unguarded(
        &self,
        image: &RgbImage,
        limits: &ReadLimits,
        deadline: &Deadline,
    ) -> Result<Option<ReadText>, OcrError> {
        let boxes = self.detect(image, limits)?;
        deadline.check()?;
        let mut lines = vec![String::new(); boxes.len()];
        let mut chars = 0;
        // Boxes of similar widths together, so that little of a batch is padding.
        let mut order: Vec<usize> = (0..boxes.len()).collect();
        order.sort_by_key(|&i| rec::line_width(&boxes[i]));
        for batch in order.chunks(BATCH) {
            deadline.check()?;
            let read = self.recognise(image, &boxes, batch)?;
            for (&i, decoded) in batch.iter().zip(read) {
                if decoded.confidence >= rec::MIN_CONFIDENCE {
                    chars += decoded.text.chars().count();
                    lines[i] = decoded.text;
                }
            }
            if chars >= limits.max_chars {
                break;
            }
        }
        Ok(ReadText::new(truncate_chars(lines, limits.max_chars)))
    }

    /// The text boxes, in reading order, at most `max_regions`.
    pub fn detect(&self, image: &RgbImage, limits: &ReadLimits) -> Result<Vec<TextBox>, OcrError> {
        let input = det::prepare(image, limits.max_side);
        let (w, h) = (input.width as usize, input.height as usize);
        let tensor = Tensor::from_shape(&[1, 3, h, w], &input.data).map_err(inference)?;
        let plan = self.det_plan(h, w)?;
        let output = plan.run(tvec!(tensor.into())).map_err(inference)?;
        let map = output[0].as_slice::<f32>().map_err(inference)?;
        if map.len() != w * h {
            return Err(OcrError::Inference(format!(
                "the detector's map has {} values for a {w}×{h} input",
                map.len()
            )));
        }
        Ok(det::boxes(
            map,
            w,
            h,
            input.scale_x,
            input.scale_y,
            limits.max_regions,
        ))
    }

    /// Reads the boxes `batch` indexes, in one padded batch.
    fn recognise(
        &self,
        image: &RgbImage,
        boxes: &[TextBox],
        batch: &[usize],
    ) -> Result<Vec<rec::Decoded>, OcrError> {
        let widths: Vec<u32> = batch.iter().map(|&i| rec::line_width(&boxes[i])).collect();
        let widest = widths.iter().copied().max().unwrap_or(8);
        let padded = widest.div_ceil(WIDTH_STEP) * WIDTH_STEP;
        let stride = padded as usize;
        let height = rec::HEIGHT as usize;
        let one = 3 * height * stride;
        let mut data = vec![0f32; batch.len() * one];
        for ((&i, &width), out) in batch.iter().zip(&widths).zip(data.chunks_exact_mut(one)) {
            rec::sample_line(image, &boxes[i], width, stride, out);
        }
        let tensor =
            Tensor::from_shape(&[batch.len(), 3, height, stride], &data).map_err(inference)?;
        let plan = self.plan(batch.len(), padded)?;
        let output = plan.run(tvec!(tensor.into())).map_err(inference)?;
        let probs = output[0].to_array_view::<f32>().map_err(inference)?;
        let shape = probs.shape();
        if shape.len() != 3 || shape[0] != batch.len() || shape[2] != self.dictionary.len() {
            return Err(OcrError::Inference(format!(
                "the recogniser returned shape {shape:?} for {} lines of {} classes",
                batch.len(),
                self.dictionary.len()
            )));
        }
        let per_line = shape[1] * shape[2];
        let flat = probs.as_slice().ok_or_else(|| {
            OcrError::Inference("the recogniser's output is not contiguous".into())
        })?;
        Ok(flat
            .chunks_exact(per_line)
            .map(|line| rec::decode(line, &self.dictionary))
            .collect())
    }
}

fn inference(e: TractError) -> OcrError {
    OcrError::Inference(format!("{e:#}"))
}

/// The file's bytes when its sha256 is `pinned`.
fn read_pinned(path: &Path, pinned: &str) -> Result<Vec<u8>, OcrError> {
    let bytes = std::fs::read(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => OcrError::Missing {
            path: path.to_path_buf(),
        },
        _ => OcrError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    })?;
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != pinned {
        return Err(OcrError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("sha256 {actual}, expected {pinned}"),
        });
    }
    Ok(bytes)
}

/// The lines with at most `max_chars` characters in all, in order: the
/// line that reaches the limit is cut, the ones after it dropped.
fn truncate_chars(lines: Vec<String>, max_chars: usize) -> Vec<String> {
    let mut left = max_chars;
    let mut kept = Vec::new();
    for line in lines.into_iter().filter(|l| !l.is_empty()) {
        if left == 0 {
            break;
        }
        let n = line.chars().count();
        if n <= left {
            left -= n;
            kept.push(line);
        } else {
            kept.push(line.chars().take(left).collect());
            left = 0;
        }
    }
    kept
}

#[cfg(test)]
mod tests;
