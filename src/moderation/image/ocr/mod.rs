//! Text inside images: PaddleOCR's PP-OCRv4 detector and recogniser
//! (Apache-2.0, English and Chinese), as ONNX from the PyPI package
//! rapidocr-onnxruntime 1.4.4 (`scripts/fetch-ocr.sh`), run with ONNX
//! Runtime 1.32 through the `ort` crate. The runtime is a shared library
//! from the PyPI wheel of onnxruntime (`scripts/fetch-onnxruntime.sh`),
//! installed beside the models, checked against its pin and loaded at run
//! time from there (nothing is linked at build time); on two cores it runs
//! the detector more than ten times faster than tract did (docs/models.md, OCR).
//!
//! Reading one image: the detector's probability map of text pixels (one
//! pass over the image, scaled to at most `max_side`), the text boxes drawn
//! from it ([`det`]), then each box cut out along its slope and read by the
//! recogniser ([`rec`]), the lines shared out among `threads` workers. An
//! image without text costs the detector's pass only.

pub mod cache;
pub mod det;
pub mod rec;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, TryLockError};

use image::RgbImage;
use ort::environment::Environment;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::TensorRef;
use sha2::{Digest, Sha256};

use crate::moderation::deadline::{Deadline, DeadlineExceeded};
use det::TextBox;
use rec::Dictionary;

/// The installed files below the models directory, with their pinned
/// sha256 (the same as in scripts/fetch-ocr.sh).
pub const DETECTOR_FILE: &str = "ppocr/det.onnx";
pub const RECOGNISER_FILE: &str = "ppocr/rec.onnx";
const DETECTOR_SHA256: &str = "73c1e265a77131df4851356811d09e21f53765dd1faf19f299463de7d50bb57c";
const RECOGNISER_SHA256: &str = "a72181818db1a0656453a6c1244696955b5ac72474dd791a1397085c809df700";

/// The ONNX Runtime library below the models directory, with its pinned
/// sha256 (the same as in scripts/fetch-onnxruntime.sh).
pub const RUNTIME_FILE: &str = "onnxruntime/libonnxruntime.so.1.32.0";
const RUNTIME_SHA256: &str = "6c1585d1bbf45b0712ea4a21b705c5fcb4ba04ff2e30f1fbf81a49faf658638f";

/// Reported beside the other models' ids.
pub const MODEL_ID: &str = "ppocrv4";

/// The recogniser's widths are rounded up to multiples of this, the black
/// padding after the line that its reading accuracy was measured with (a
/// few widths also let ONNX Runtime reuse its buffers).
const WIDTH_STEP: u32 = 160;

/// Images with a side shorter than this hold no readable line (and the
/// detector's convolutions need some room).
const MIN_IMAGE_SIDE: u32 = 16;

#[derive(Debug, thiserror::Error)]
pub enum OcrError {
    #[error("the OCR model file {path} is missing; run scripts/setup.sh (or scripts/fetch-ocr.sh) to fetch it")]
    Missing { path: PathBuf },
    #[error("the OCR model file {path} is unreadable or not the expected model ({reason}); delete it and run scripts/setup.sh (or scripts/fetch-ocr.sh)")]
    Corrupt { path: PathBuf, reason: String },
    #[error("the ONNX Runtime library {path} is missing; run scripts/setup.sh (or scripts/fetch-onnxruntime.sh) to fetch it")]
    RuntimeMissing { path: PathBuf },
    #[error("the ONNX Runtime library {path} could not be loaded ({reason}); delete it and run scripts/setup.sh (or scripts/fetch-onnxruntime.sh)")]
    RuntimeLoad { path: PathBuf, reason: String },
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

    /// At most `max_chars` characters of it; `None` for none.
    pub fn truncated(self, max_chars: usize) -> Option<ReadText> {
        ReadText::new(truncate_chars(self.lines, max_chars))
    }

    pub fn chars(&self) -> usize {
        self.lines.iter().map(|l| l.chars().count()).sum::<usize>() + self.lines.len() - 1
    }
}

/// The work of reading, read or not: what OCR is charged by (issue #58,
/// B: 40 lines read with low confidence cost seconds and were charged
/// nothing when only the characters read counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OcrWork {
    /// Images run through the detector.
    pub images: u32,
    /// Pixels of the detector's inputs.
    pub detector_pixels: u64,
    /// Lines handed to the recogniser.
    pub regions: u32,
    /// Pixels of the recogniser's inputs ([`rec::HEIGHT`] high, the padded
    /// width): its cost grows with them.
    pub line_pixels: u64,
}

/// What reading costs, in characters of the key's allowance per million
/// pixels (`ocr.charge_per_megapixel_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OcrPrices {
    pub per_megapixel_detected: u64,
    pub per_megapixel_read: u64,
}

impl OcrWork {
    /// The work's price in characters of the allowance, rounded up.
    pub fn charge(&self, prices: &OcrPrices) -> u64 {
        let priced = |pixels: u64, per_megapixel: u64| {
            pixels.saturating_mul(per_megapixel).div_ceil(1_000_000)
        };
        priced(self.detector_pixels, prices.per_megapixel_detected)
            .saturating_add(priced(self.line_pixels, prices.per_megapixel_read))
    }

    pub fn add(&mut self, other: &OcrWork) {
        self.images += other.images;
        self.detector_pixels += other.detector_pixels;
        self.regions += other.regions;
        self.line_pixels += other.line_pixels;
    }
}

/// What the detector found, and what finding it cost.
#[derive(Clone, Debug, Default)]
pub struct Detected {
    pub boxes: Vec<TextBox>,
    pub work: OcrWork,
}

/// Lines read with confidence, by box index, and the work of reading.
#[derive(Clone, Debug, Default)]
pub struct Lines {
    pub lines: Vec<(usize, String)>,
    pub work: OcrWork,
}

/// The boxes' indices, widest first, so that the workers finish together.
pub fn reading_order(boxes: &[TextBox]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..boxes.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(rec::line_width(&boxes[i])));
    order
}

/// The recogniser's input pixels for box `b` (its padded width).
pub fn line_input_pixels(b: &TextBox) -> usize {
    let stride = rec::line_width(b).div_ceil(WIDTH_STEP) * WIDTH_STEP;
    stride as usize * rec::HEIGHT as usize
}

/// The lines read (by box index, out of `boxes` boxes) in reading order,
/// at most `max_chars` characters in all; `None` without any.
pub fn assemble(boxes: usize, read: Vec<(usize, String)>, max_chars: usize) -> Option<ReadText> {
    let mut lines = vec![String::new(); boxes];
    for (i, text) in read {
        if let Some(line) = lines.get_mut(i) {
            *line = text;
        }
    }
    ReadText::new(truncate_chars(lines, max_chars))
}

/// The detector and recogniser, loaded and optimised once.
pub struct Ocr {
    /// A run needs the session to itself (`ort` takes it mutably): one image
    /// at a time through the detector, its `threads` threads sharing each
    /// pass.
    detector: Mutex<Session>,
    /// `threads` single-threaded sessions: an image's lines are read side by
    /// side, one a session, which uses the cores better than one session
    /// splitting each small line's convolutions between threads (see
    /// docs/performance.md, OCR speed).
    recognisers: Vec<Mutex<Session>>,
    dictionary: Dictionary,
}

impl Ocr {
    /// Loads `<models_dir>/ppocr/{det,rec}.onnx` with the ONNX Runtime
    /// library `<models_dir>/onnxruntime/`, checking their pins.
    ///
    /// The library is loaded once per process: later loads check the pin of
    /// their own copy but run on the library loaded first. An image is read
    /// by `threads` threads (`ocr.threads`).
    pub fn load(models_dir: &Path, threads: usize) -> Result<Ocr, OcrError> {
        let det_path = models_dir.join(DETECTOR_FILE);
        let rec_path = models_dir.join(RECOGNISER_FILE);
        let det_bytes = read_pinned(&det_path, DETECTOR_SHA256)?;
        let rec_bytes = read_pinned(&rec_path, RECOGNISER_SHA256)?;
        let environment = environment(&models_dir.join(RUNTIME_FILE))?;
        let detector = session(&environment, &det_path, &det_bytes, threads)?;
        let recognisers = (0..threads.max(1))
            .map(|_| session(&environment, &rec_path, &rec_bytes, 1))
            .collect::<Result<Vec<_>, _>>()?;
        let corrupt = |reason: String| OcrError::Corrupt {
            path: rec_path.clone(),
            reason,
        };
        let characters = recognisers[0]
            .metadata()
            .map_err(|e| corrupt(e.to_string()))?
            .custom("character")
            .ok_or_else(|| corrupt("no `character` metadata".into()))?;
        let dictionary =
            Dictionary::from_metadata(&characters).map_err(|e| corrupt(e.to_string()))?;
        Ok(Ocr {
            detector: Mutex::new(detector),
            recognisers: recognisers.into_iter().map(Mutex::new).collect(),
            dictionary,
        })
    }

    /// Reads the text of `image`, stopping at `deadline`. `None`: no text.
    /// A panic in the wrapper around the runtime is an `Inference` error,
    /// never the caller's panic.
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
        let detected = self.detect_counted(image, limits)?;
        deadline.check()?;
        let order = reading_order(&detected.boxes);
        let lines =
            self.recognise_lines(image, &detected.boxes, &order, limits.max_chars, deadline)?;
        Ok(assemble(
            detected.boxes.len(),
            lines.lines,
            limits.max_chars,
        ))
    }

    /// The text boxes, in reading order, at most `max_regions`.
    pub fn detect(&self, image: &RgbImage, limits: &ReadLimits) -> Result<Vec<TextBox>, OcrError> {
        Ok(self.detect_counted(image, limits)?.boxes)
    }

    /// The text boxes and the work of finding them. A panic in the wrapper
    /// around the runtime is an `Inference` error.
    pub fn detect_counted(
        &self,
        image: &RgbImage,
        limits: &ReadLimits,
    ) -> Result<Detected, OcrError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.detect_unguarded(image, limits)
        }))
        .unwrap_or_else(|_| Err(OcrError::Inference("the ONNX runtime panicked".into())))
    }

    fn detect_unguarded(
        &self,
        image: &RgbImage,
        limits: &ReadLimits,
    ) -> Result<Detected, OcrError> {
        if limits.max_regions == 0 || image.width().min(image.height()) < MIN_IMAGE_SIDE {
            return Ok(Detected::default());
        }
        let input = det::prepare(image, limits.max_side);
        let (w, h) = (input.width as usize, input.height as usize);
        let tensor =
            TensorRef::from_array_view(([1, 3, h, w], input.data.as_slice())).map_err(inference)?;
        let mut detector = lock(&self.detector);
        let output = detector.run(ort::inputs![tensor]).map_err(inference)?;
        let (_, map) = output[0].try_extract_tensor::<f32>().map_err(inference)?;
        if map.len() != w * h {
            return Err(OcrError::Inference(format!(
                "the detector's map has {} values for a {w}×{h} input",
                map.len()
            )));
        }
        let boxes = det::boxes(map, w, h, input.scale_x, input.scale_y, limits.max_regions);
        Ok(Detected {
            boxes,
            work: OcrWork {
                images: 1,
                detector_pixels: (w * h) as u64,
                ..OcrWork::default()
            },
        })
    }

    /// Reads the boxes `which` (indices into `boxes`, in the order given),
    /// shared out among the recogniser sessions, until `max_chars` were
    /// read or none is left; stops at `deadline`. Every line handed to the
    /// recogniser counts as work, read with confidence or not.
    pub fn recognise_lines(
        &self,
        image: &RgbImage,
        boxes: &[TextBox],
        which: &[usize],
        max_chars: usize,
        deadline: &Deadline,
    ) -> Result<Lines, OcrError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.recognise_unguarded(image, boxes, which, max_chars, deadline)
        }))
        .unwrap_or_else(|_| Err(OcrError::Inference("the ONNX runtime panicked".into())))
    }

    fn recognise_unguarded(
        &self,
        image: &RgbImage,
        boxes: &[TextBox],
        which: &[usize],
        max_chars: usize,
        deadline: &Deadline,
    ) -> Result<Lines, OcrError> {
        let next = AtomicUsize::new(0);
        let chars = AtomicUsize::new(0);
        let regions = AtomicUsize::new(0);
        let line_pixels = AtomicUsize::new(0);
        // One worker's share: the next line nobody has taken, until none is
        // left or enough characters were read.
        let work = |worker: usize| -> Result<Vec<(usize, String)>, OcrError> {
            let mut read = Vec::new();
            while chars.load(Ordering::Relaxed) < max_chars {
                let Some(&i) = which.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    break;
                };
                let Some(b) = boxes.get(i) else {
                    continue;
                };
                deadline.check()?;
                regions.fetch_add(1, Ordering::Relaxed);
                line_pixels.fetch_add(line_input_pixels(b), Ordering::Relaxed);
                let decoded = self.recognise(worker, image, b)?;
                if decoded.confidence >= rec::MIN_CONFIDENCE {
                    chars.fetch_add(decoded.text.chars().count(), Ordering::Relaxed);
                    read.push((i, decoded.text));
                }
            }
            Ok(read)
        };
        let workers = self.recognisers.len().min(which.len()).max(1);
        let shares = std::thread::scope(|scope| {
            let helpers: Vec<_> = (1..workers).map(|w| scope.spawn(move || work(w))).collect();
            let mut shares = vec![work(0)];
            shares.extend(helpers.into_iter().map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(OcrError::Inference("the ONNX runtime panicked".into()))
                })
            }));
            shares
        });
        let mut lines = Vec::new();
        for share in shares {
            lines.extend(share?);
        }
        Ok(Lines {
            lines,
            work: OcrWork {
                regions: regions.into_inner() as u32,
                line_pixels: line_pixels.into_inner() as u64,
                ..OcrWork::default()
            },
        })
    }

    /// Recogniser sessions: lines read side by side.
    pub fn workers(&self) -> usize {
        self.recognisers.len()
    }

    /// Reads the line of box `b`, on `worker`'s recogniser session when it
    /// is free (another request's worker may hold it), else on any free one,
    /// else waiting for `worker`'s.
    fn recognise(
        &self,
        worker: usize,
        image: &RgbImage,
        b: &TextBox,
    ) -> Result<rec::Decoded, OcrError> {
        let width = rec::line_width(b);
        // Padded to a few widths: ONNX Runtime then reuses its buffers.
        let stride = (width.div_ceil(WIDTH_STEP) * WIDTH_STEP) as usize;
        let height = rec::HEIGHT as usize;
        let mut data = vec![0f32; 3 * height * stride];
        rec::sample_line(image, b, width, stride, &mut data);
        let tensor = TensorRef::from_array_view(([1, 3, height, stride], data.as_slice()))
            .map_err(inference)?;
        let mut recogniser = self.free_recogniser(worker);
        let output = recogniser.run(ort::inputs![tensor]).map_err(inference)?;
        let (shape, probs) = output[0].try_extract_tensor::<f32>().map_err(inference)?;
        let shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
        if shape.len() != 3 || shape[0] != 1 || shape[2] != self.dictionary.len() {
            return Err(OcrError::Inference(format!(
                "the recogniser returned shape {shape:?} for a line of {} classes",
                self.dictionary.len()
            )));
        }
        Ok(rec::decode(probs, &self.dictionary))
    }

    fn free_recogniser(&self, worker: usize) -> std::sync::MutexGuard<'_, Session> {
        let n = self.recognisers.len();
        for k in 0..n {
            match self.recognisers[(worker + k) % n].try_lock() {
                Ok(session) => return session,
                Err(TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(TryLockError::WouldBlock) => {}
            }
        }
        lock(&self.recognisers[worker % n])
    }
}

fn inference(e: ort::Error) -> OcrError {
    OcrError::Inference(e.to_string())
}

/// The session, also after a panic while another thread held it (a run
/// leaves nothing half-done in it).
fn lock(session: &Mutex<Session>) -> std::sync::MutexGuard<'_, Session> {
    session.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's ONNX Runtime environment, on the library at `library`
/// (checked against its pin first). Made by the first load that succeeds;
/// a failed one leaves nothing behind, so that a later load may succeed.
fn environment(library: &Path) -> Result<Environment, OcrError> {
    static ENVIRONMENT: Mutex<Option<Environment>> = Mutex::new(None);
    // Read in full to check the pin, then loaded by path: a 35 MB read once
    // at start, so that a truncated or swapped library is refused before
    // the process maps it.
    read_pinned(library, RUNTIME_SHA256).map_err(|e| match e {
        OcrError::Missing { path } => OcrError::RuntimeMissing { path },
        OcrError::Corrupt { path, reason } => OcrError::RuntimeLoad { path, reason },
        other => other,
    })?;
    let mut environment = ENVIRONMENT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(environment) = environment.as_ref() {
        return Ok(environment.clone());
    }
    let load_error = |reason: String| OcrError::RuntimeLoad {
        path: library.to_path_buf(),
        reason,
    };
    // Absolute: `ort` would look for a relative path beside the executable.
    let absolute = std::path::absolute(library).map_err(|e| load_error(e.to_string()))?;
    let built = std::panic::catch_unwind(|| {
        ort::init_from(&absolute)
            .map_err(|e| e.to_string())?
            .with_name("moderato-ocr")
            .with_telemetry(false)
            .build()
            .map_err(|e| e.to_string())
    })
    .unwrap_or_else(|_| Err("the ONNX Runtime wrapper panicked".into()))
    .map_err(load_error)?;
    *environment = Some(built.clone());
    Ok(built)
}

/// A session on the model `bytes`, read from `path`, whose runs use
/// `threads` threads that sleep rather than spin between runs: the other
/// model, another request's run and the text model need the cores then.
fn session(
    environment: &Environment,
    path: &Path,
    bytes: &[u8],
    threads: usize,
) -> Result<Session, OcrError> {
    let corrupt = |e: ort::Error| OcrError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    Session::builder(environment)
        .map_err(corrupt)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| corrupt(e.into()))?
        .with_intra_threads(threads)
        .map_err(|e| corrupt(e.into()))?
        .with_intra_op_spinning(false)
        .map_err(|e| corrupt(e.into()))?
        .commit_from_memory(bytes)
        .map_err(corrupt)
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
