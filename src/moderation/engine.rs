//! Moderates one request: scores every text item, the text items taken
//! together, and every image, off the async executor, and merges the deep
//! image analysis when it was asked for.
//!
//! What one request may cost is bounded: its work stops at its deadline;
//! its images reserve their decoding memory from a process-wide budget and
//! are decoded, scored and dropped one at a time; and CPU jobs run in two
//! lanes, so a short text never queues behind heavy jobs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Semaphore;

use super::category::{
    Category, CategoryRules, CategoryScores, EffectiveThresholds, Thresholds, NUM_CATEGORIES,
};
use super::classifier::{ImageClassifier, ImageScores, TextClassifier, TextEvidence};
use super::deadline::{Deadline, DeadlineExceeded};
use super::explain::{self, Evidence, Explanation, ItemRange, ItemRanges, ItemSpan, Span};
use super::fair::{FairLane, Tenant};
use super::image::decode::{
    self as image, DecodeBudget, ImageError, ImageFormat, ImageHeader, ImageLimits,
};
use super::image::ocr::cache::{ImageDigest, ReadCache};
use super::image::ocr::det::TextBox;
use super::image::ocr::{
    assemble, line_input_pixels, reading_order, Detected, Ocr, OcrError, OcrPrices, OcrWork,
    ReadLimits, ReadText,
};
use super::image::remote::{FetchError, RemoteImageUrl};
use super::image::vision::{AnalysisStatus, ImageAnalysis, VisionClient, VisionImage};
use super::speed::Speed;
use super::text::language::{self, Language};

/// Images up to this many pixels (a 2560×1600 screen) are light jobs.
const LIGHT_IMAGE_PIXELS: u64 = 4_096_000;

/// One input item as the engine receives it.
#[derive(Clone, Debug)]
pub enum Item {
    Text(String),
    Image(ImageSource),
}

/// Where an image item's bytes come from.
#[derive(Clone, Debug)]
pub enum ImageSource {
    /// A `data:` URI, parsed and decoded by the engine off the executor.
    DataUri(String),
    /// A URL the operator's rules allowed, fetched by the engine.
    Remote(RemoteImageUrl),
}

/// An image item's bytes in hand: still to parse, or fetched.
enum LoadedImage {
    DataUri(String),
    Fetched(Bytes),
}

/// Scores and the decisions drawn from them.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub scores: CategoryScores,
    pub categories: [bool; NUM_CATEGORIES],
    pub flagged: bool,
}

impl Verdict {
    /// Judges `scores` by the request's effective thresholds (shipped,
    /// with the key's policy over them): the one place a flag is decided.
    pub fn judge(scores: CategoryScores, thresholds: &EffectiveThresholds) -> Verdict {
        let categories = thresholds.decide(&scores);
        Verdict {
            scores,
            categories,
            flagged: categories.iter().any(|c| *c),
        }
    }
}

impl Verdict {
    /// Per category the higher score and either decision: an image's own
    /// verdict with its text's.
    fn either(&self, other: &Verdict) -> Verdict {
        let categories = std::array::from_fn(|i| self.categories[i] || other.categories[i]);
        Verdict {
            scores: self.scores.max_with(&other.scores),
            categories,
            flagged: self.flagged || other.flagged,
        }
    }
}

/// The text read from an image, as the text model judged it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageText {
    /// The lines read, joined by line breaks; never empty.
    pub text: String,
    /// The text model's verdict on it alone (by the text thresholds).
    pub verdict: Verdict,
}

impl ImageText {
    /// The categories the text flagged: those it raised the image's flags by.
    pub fn categories(&self) -> Vec<Category> {
        Category::ALL
            .into_iter()
            .filter(|c| self.verdict.categories[c.index()])
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemOutcome {
    Text {
        verdict: Verdict,
        /// The language the text is surely in (ISO 639-1), `None` when the
        /// detector is unsure.
        language: Option<Language>,
    },
    Image {
        /// The image models' verdict and its text's together: per category
        /// the higher score, flagged when either flags it.
        verdict: Verdict,
        /// Categories the image models judged for this image (the text
        /// model, when text was read, judged every category).
        evaluated: Vec<Category>,
        analysis: ImageAnalysis,
        bytes: usize,
        /// Text read in the image, when OCR is on and found some (boxed:
        /// most images have none).
        text: Option<Box<ImageText>>,
    },
}

impl ItemOutcome {
    pub fn verdict(&self) -> &Verdict {
        match self {
            ItemOutcome::Text { verdict: v, .. } | ItemOutcome::Image { verdict: v, .. } => v,
        }
    }
}

/// The moderation of a whole request.
#[derive(Clone, Debug, PartialEq)]
pub struct Moderation {
    pub items: Vec<ItemOutcome>,
    /// All texts taken as one text, in item order (the text items and the
    /// text read from images), with how many there were.
    pub combined_text: Option<(Verdict, usize)>,
    pub flagged: bool,
    /// Deep analyses that completed.
    pub deep_analyses: u32,
    /// Where the text verdicts came from, when the request asked.
    pub explanations: Option<Explanations>,
}

/// Whether a request wants to know where its text verdicts came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Explain {
    #[default]
    No,
    Yes,
}

/// The explanations of a request's text verdicts: for each flagged
/// category, the pieces of text that gave its score.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanations {
    /// Per input item, in order: a text item's explanations (empty when
    /// nothing is flagged), `None` for an image (its scores come from
    /// image models, which point at no text).
    pub items: Vec<Option<Vec<Explanation<Span>>>>,
    /// The combined text's, each placed in the input items it lies in.
    pub combined: Vec<Explanation<Vec<ItemSpan>>>,
}

impl Moderation {
    /// Characters read from the images (line breaks included).
    pub fn image_text_chars(&self) -> u64 {
        self.items
            .iter()
            .filter_map(|o| match o {
                ItemOutcome::Image { text: Some(t), .. } => Some(t.text.chars().count() as u64),
                _ => None,
            })
            .sum()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An image item is bad: the client's mistake.
    #[error("input[{index}].base64: {error}")]
    Image { index: usize, error: ImageError },
    /// A remote image could not be fetched.
    #[error("input[{index}]: {error}")]
    Fetch { index: usize, error: FetchError },
    /// The images of one request have more pixels than a request may decode.
    #[error("the images have {pixels} pixels in all; the limit per request is {limit}")]
    TooManyPixels { pixels: u64, limit: u64 },
    #[error("no image classifier is configured, so image items cannot be moderated")]
    ImagesDisabled { index: usize },
    /// The request's deadline passed; its remaining work was cancelled.
    #[error("the request took longer than its deadline of {0:?}")]
    DeadlineExceeded(Duration),
    /// Decoding memory stayed short for the whole wait.
    #[error("no memory to decode the images became free within {0:?}")]
    Busy(Duration),
    #[error("classifier failed: {0}")]
    Classifier(#[from] anyhow::Error),
    /// Reading the images' text would cost more than the character
    /// allowance has left.
    #[error("reading the text in the images needs {needed} more characters of the allowance than it has left")]
    OcrAllowanceSpent { needed: u64 },
}

/// The bounds of one request's work.
#[derive(Clone, Debug)]
pub struct EngineBudget {
    /// Decoded pixels of all images of one request.
    pub max_request_pixels: u64,
    /// Memory all requests together may hold for decoding images.
    pub decode_memory_bytes: u64,
    pub decode_wait: Duration,
    /// After this, the request's remaining work is cancelled.
    pub deadline: Duration,
    /// Text jobs up to this many characters run in the light lane.
    pub light_job_chars: usize,
}

/// Reading the text in images, and how much of it.
#[derive(Clone)]
pub struct OcrParts {
    pub reader: Arc<Ocr>,
    /// Per image: detector size, regions and characters.
    pub limits: ReadLimits,
    /// Characters read from all the images of one request together.
    pub max_chars_per_request: usize,
    /// Lines read from all the images of one request together.
    pub max_regions_per_request: usize,
    /// What the reading work costs in characters of the allowance.
    pub prices: OcrPrices,
    /// Whole reads, per account, by the image's bytes.
    pub cache: Arc<ReadCache>,
}

/// Lines read in one job of the heavy lane: one per recogniser session, so
/// that the lane turns over every tenth of a second or so and another
/// account's image waits for one short job, not for a whole image of forty
/// lines (measured in benches/ocr_flood.py: 2 a session let another
/// account's small image wait up to 0.85 s more on a debug build).
const LINES_PER_JOB_PER_WORKER: usize = 1;

/// Where a request's OCR work is paid for, in characters of its
/// allowance, before it is done: concurrent requests of one account draw
/// on one bucket, so together they cannot read more than it holds.
#[async_trait::async_trait]
pub trait OcrPayer: Send + Sync {
    /// Takes `chars` from the allowance; `false` (nothing taken) when it
    /// has not that much left.
    async fn pay(&self, chars: u64) -> bool;
}

/// Who a request is for, and what pays for its reading of images.
#[derive(Clone)]
pub struct Requester {
    /// Its account (the heavy lane's turns are per tenant, and the OCR
    /// cache is kept per tenant).
    pub tenant: Tenant,
    /// `None`: unmetered (benchmarks and tests of the core).
    payer: Option<Arc<dyn OcrPayer>>,
    /// The OCR work paid for (before it was done; done, read or not,
    /// unless the request ended first).
    ocr_work: Arc<Mutex<OcrWork>>,
}

impl Requester {
    pub fn new(tenant: Tenant, payer: Arc<dyn OcrPayer>) -> Requester {
        Requester {
            tenant,
            payer: Some(payer),
            ocr_work: Arc::default(),
        }
    }

    /// Nobody in particular, unbounded: benchmarks and tests of the core.
    pub fn unmetered() -> Requester {
        Requester {
            tenant: Tenant::default(),
            payer: None,
            ocr_work: Arc::default(),
        }
    }

    /// The OCR work done so far.
    pub fn work(&self) -> OcrWork {
        *self.ocr_work.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn add_work(&self, work: &OcrWork) {
        self.ocr_work
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(work);
    }

    /// Pays for `work` before it is done: `OcrAllowanceSpent` when the
    /// allowance has not that much left.
    async fn pay_for(&self, work: &OcrWork, prices: &OcrPrices) -> Result<(), EngineError> {
        let chars = work.charge(prices);
        match &self.payer {
            Some(payer) if chars > 0 && !payer.pay(chars).await => {
                Err(EngineError::OcrAllowanceSpent { needed: chars })
            }
            _ => {
                self.add_work(work);
                Ok(())
            }
        }
    }
}

/// Which CPU lane a job runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lane {
    Light,
    Heavy,
}

pub struct Engine {
    text: Arc<dyn TextClassifier>,
    text_thresholds: Thresholds,
    fast_text: Option<FastText>,
    image: Option<Arc<dyn ImageClassifier>>,
    image_thresholds: Thresholds,
    image_limits: ImageLimits,
    vision: Option<VisionClient>,
    ocr: Option<OcrParts>,
    budget: EngineBudget,
    decode_memory: DecodeBudget,
    /// CPU jobs in flight, per lane, so that a burst queues instead of
    /// oversubscribing the cores, and heavy jobs (long texts, large images)
    /// hold at most half the cores while light ones keep their own slots.
    light: Arc<Semaphore>,
    /// Served in turns per tenant: one account's queued images never hold
    /// another's behind all of them.
    heavy: Arc<FairLane>,
}

pub struct EngineParts {
    /// The default text path, and its thresholds (shipped, with the
    /// operator's overrides).
    pub text: Arc<dyn TextClassifier>,
    pub text_thresholds: Thresholds,
    /// The path of the policies that choose `speed = "fast"`, when it is
    /// not the default one; `None`: every request takes `text`.
    pub fast_text: Option<FastText>,
    pub image: Option<Arc<dyn ImageClassifier>>,
    pub image_thresholds: Thresholds,
    pub image_limits: ImageLimits,
    pub vision: Option<VisionClient>,
    /// `None`: images are judged by the image models only.
    pub ocr: Option<OcrParts>,
    pub budget: EngineBudget,
}

/// The fast text path (the first stage alone), with its own thresholds:
/// its heads are not the accurate path's first stage, so neither are its
/// thresholds.
pub struct FastText {
    pub classifier: Arc<dyn TextClassifier>,
    pub thresholds: Thresholds,
}

/// An image item checked and sized, not decoded yet.
struct PendingImage {
    index: usize,
    format: ImageFormat,
    bytes: Bytes,
    header: ImageHeader,
}

/// An image scored by the embedded classifier; its pixels are gone.
struct ScoredImage {
    index: usize,
    format: ImageFormat,
    bytes: Bytes,
    scores: ImageScores,
    text: Option<ReadText>,
}

impl Engine {
    pub fn new(parts: EngineParts) -> Engine {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        Engine {
            text: parts.text,
            text_thresholds: parts.text_thresholds,
            fast_text: parts.fast_text,
            image: parts.image,
            image_thresholds: parts.image_thresholds,
            image_limits: parts.image_limits,
            vision: parts.vision,
            ocr: parts.ocr,
            decode_memory: DecodeBudget::new(
                parts.budget.decode_memory_bytes,
                parts.budget.decode_wait,
            ),
            budget: parts.budget,
            light: Arc::new(Semaphore::new(cores * 2)),
            heavy: FairLane::new((cores / 2).max(1)),
        }
    }

    /// The text model's shipped thresholds (configuration overrides
    /// included), which a policy's rules replace: shown beside a policy's form.
    pub fn shipped_text_thresholds(&self) -> Thresholds {
        self.text_thresholds
    }

    /// Whether image items have their text read (OCR on and loaded).
    pub fn reads_images(&self) -> bool {
        self.image.is_some() && self.ocr.is_some()
    }

    /// What `work` costs in characters of the allowance; `None` without OCR.
    pub fn ocr_charge(&self, work: &OcrWork) -> Option<u64> {
        self.ocr.as_ref().map(|ocr| work.charge(&ocr.prices))
    }

    /// The text model that judges requests at `speed`, and its thresholds.
    fn text_path(&self, speed: Speed) -> (&Arc<dyn TextClassifier>, Thresholds) {
        match (speed, &self.fast_text) {
            (Speed::Fast, Some(fast)) => (&fast.classifier, fast.thresholds),
            _ => (&self.text, self.text_thresholds),
        }
    }

    /// Classifier ids and versions of the path that judges at `speed`, for
    /// the response's `model` field.
    pub fn model_id(&self, speed: Speed) -> String {
        let mut parts = vec![self.text_path(speed).0.model_id()];
        if let Some(image) = &self.image {
            parts.push(image.model_id());
        }
        if self.ocr.is_some() {
            parts.push(super::image::ocr::MODEL_ID.to_string());
        }
        parts.join("+")
    }

    /// Moderates within the configured deadline, counted from now, judging
    /// by the shipped thresholds with `rules` (the key's policy) over them.
    pub async fn moderate(
        &self,
        items: Vec<Item>,
        analyze_images: bool,
        rules: &CategoryRules,
    ) -> Result<Moderation, EngineError> {
        self.moderate_with(
            items,
            analyze_images,
            rules,
            Speed::default(),
            Explain::No,
            &Requester::unmetered(),
        )
        .await
    }

    /// [`Engine::moderate`] on the text path of `speed`, with the
    /// explanations of the text verdicts when `explain` asks for them.
    pub async fn moderate_with(
        &self,
        items: Vec<Item>,
        analyze_images: bool,
        rules: &CategoryRules,
        speed: Speed,
        explain: Explain,
        requester: &Requester,
    ) -> Result<Moderation, EngineError> {
        // Once the deadline is over the remaining work is cancelled and
        // `DeadlineExceeded` returned. A policy changes only the decisions,
        // never the scores: the same rules apply to text items, images and
        // the combined text.
        let deadline = &Deadline::after(self.budget.deadline);
        let (text_model, text_thresholds) = self.text_path(speed);
        let text_model = text_model.clone();
        let text_thresholds = text_thresholds.under(rules);
        let image_thresholds = self.image_thresholds.under(rules);
        let texts: Vec<(usize, String)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Item::Text(t) => Some((i, t.clone())),
                Item::Image(_) => None,
            })
            .collect();
        let images: Vec<(usize, ImageSource)> = items
            .into_iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Item::Image(source) => Some((i, source)),
                Item::Text(_) => None,
            })
            .collect();
        if let (Some((index, _)), None) = (images.first(), &self.image) {
            return Err(EngineError::ImagesDisabled { index: *index });
        }

        let total = texts.len() + images.len();
        let pending = self.inspect_images(images, requester, deadline).await?;
        let reads_images = self.ocr.is_some() && !pending.is_empty();
        let images_job = async {
            let scored = self.score_images(pending, requester, deadline).await?;
            let analyses = self.deep_analysis(&scored, analyze_images).await;
            Ok::<_, EngineError>((scored, analyses))
        };
        let (parts, scored_texts, scored, analyses) = if reads_images {
            // The images' text is judged with the text items (a threat split
            // between a text and an image is caught in the combined text), so
            // the images are read first.
            let (scored, analyses) = images_job.await?;
            let parts = text_parts(&texts, &scored);
            let scored_texts = self
                .score_texts(&text_model, &parts, explain, requester, deadline)
                .await?;
            (parts, scored_texts, scored, analyses)
        } else {
            let (text_scores, images) = tokio::join!(
                self.score_texts(&text_model, &texts, explain, requester, deadline),
                images_job
            );
            let (scored, analyses) = images?;
            (texts, text_scores?, scored, analyses)
        };
        let ScoredTexts {
            items: part_scores,
            combined,
            evidence,
        } = scored_texts;

        let mut outcomes: Vec<Option<ItemOutcome>> = vec![None; total];
        let mut image_texts: Vec<Option<ImageText>> = vec![None; total];
        for ((index, text), scores) in parts.iter().zip(part_scores) {
            let verdict = Verdict::judge(scores, &text_thresholds);
            if scored.iter().any(|i| i.index == *index) {
                image_texts[*index] = Some(ImageText {
                    text: text.clone(),
                    verdict,
                });
            } else {
                outcomes[*index] = Some(ItemOutcome::Text {
                    verdict,
                    language: language::detect(text).language(),
                });
            }
        }
        let mut deep_analyses = 0;
        for (image, analysis) in scored.iter().zip(analyses) {
            if analysis.status == AnalysisStatus::Completed {
                deep_analyses += 1;
            }
            let (scores, evaluated) =
                merge_image_scores(&image.scores.scores, &image.scores.evaluated, &analysis);
            let own = Verdict::judge(scores, &image_thresholds);
            let text = image_texts[image.index].take().map(Box::new);
            let verdict = match &text {
                Some(text) => own.either(&text.verdict),
                None => own,
            };
            outcomes[image.index] = Some(ItemOutcome::Image {
                verdict,
                evaluated,
                analysis,
                bytes: image.bytes.len(),
                text,
            });
        }
        let items: Vec<ItemOutcome> = outcomes.into_iter().flatten().collect();
        let combined_text =
            combined.map(|scores| (Verdict::judge(scores, &text_thresholds), parts.len()));
        let flagged = items.iter().any(|o| o.verdict().flagged)
            || combined_text.as_ref().is_some_and(|(v, _)| v.flagged);
        // The texts read from images are explained too: a combined-text
        // explanation can lie in an image's `extracted_text`.
        let explanations = evidence.map(|evidence| {
            explain_texts(
                &parts,
                &items,
                combined_text.as_ref().map(|(v, _)| v),
                evidence,
                &text_thresholds,
            )
        });
        Ok(Moderation {
            items,
            combined_text,
            flagged,
            deep_analyses,
            explanations,
        })
    }

    /// Runs `job` on a blocking thread once a slot of `lane` is free, until
    /// `deadline`: past it the caller gets `DeadlineExceeded` at once and the
    /// job is told to stop (it keeps its slot until it has stopped, so the
    /// lanes always count the CPU really in use).
    async fn on_cpu<T: Send + 'static>(
        &self,
        lane: Lane,
        tenant: &Tenant,
        deadline: &Deadline,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, EngineError> {
        let until = tokio::time::Instant::from_std(deadline.instant());
        // The job's place in its lane, held while it runs.
        let acquired = async {
            let slot: Box<dyn Send> = match lane {
                Lane::Light => Box::new(
                    self.light
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|e| EngineError::Classifier(e.into()))?,
                ),
                Lane::Heavy => Box::new(
                    self.heavy
                        .acquire(tenant)
                        .await
                        .map_err(|e| EngineError::Classifier(e.into()))?,
                ),
            };
            Ok::<_, EngineError>(slot)
        };
        let slot = match tokio::time::timeout_at(until, acquired).await {
            Ok(slot) => slot?,
            Err(_) => return Err(self.deadline_exceeded()),
        };
        let running = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            job()
        });
        match tokio::time::timeout_at(until, running).await {
            Ok(joined) => joined.map_err(|e| EngineError::Classifier(e.into())),
            Err(_) => {
                deadline.cancel();
                Err(self.deadline_exceeded())
            }
        }
    }

    fn deadline_exceeded(&self) -> EngineError {
        EngineError::DeadlineExceeded(self.budget.deadline)
    }

    /// Fetches the remote images, parses every image item and reads its
    /// header (no pixels yet), and refuses a request whose images have more
    /// pixels in all than allowed.
    async fn inspect_images(
        &self,
        images: Vec<(usize, ImageSource)>,
        requester: &Requester,
        deadline: &Deadline,
    ) -> Result<Vec<PendingImage>, EngineError> {
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let loaded = self.load_images(images, deadline).await?;
        let limits = self.image_limits.clone();
        let pending = self
            .on_cpu(Lane::Light, &requester.tenant, deadline, move || {
                loaded
                    .into_iter()
                    .map(|(index, loaded)| {
                        // A fetched image has no declared type: its bytes
                        // say what it is. From here on both sources meet
                        // exactly the same checks.
                        let inspected = match loaded {
                            LoadedImage::DataUri(uri) => image::parse_data_uri(&uri, &limits),
                            LoadedImage::Fetched(bytes) => {
                                image::sniff_format(&bytes).map(|format| (format, bytes))
                            }
                        }
                        .and_then(|(format, bytes)| {
                            let header = image::inspect(format, &bytes, &limits)?;
                            Ok(PendingImage {
                                index,
                                format,
                                bytes,
                                header,
                            })
                        });
                        inspected.map_err(|error| EngineError::Image { index, error })
                    })
                    .collect::<Result<Vec<_>, EngineError>>()
            })
            .await??;
        let pixels: u64 = pending.iter().map(|p| p.header.pixels()).sum();
        if pixels > self.budget.max_request_pixels {
            return Err(EngineError::TooManyPixels {
                pixels,
                limit: self.budget.max_request_pixels,
            });
        }
        Ok(pending)
    }

    /// The bytes of every image item: remote ones fetched, all at once
    /// (each fetch bounded by the fetcher's limits) and within the request's
    /// deadline; the first failure cancels the other fetches.
    async fn load_images(
        &self,
        images: Vec<(usize, ImageSource)>,
        deadline: &Deadline,
    ) -> Result<Vec<(usize, LoadedImage)>, EngineError> {
        let loads = images.into_iter().map(|(index, source)| async move {
            let loaded = match source {
                ImageSource::DataUri(uri) => LoadedImage::DataUri(uri),
                ImageSource::Remote(url) => LoadedImage::Fetched(
                    url.fetch()
                        .await
                        .map_err(|error| EngineError::Fetch { index, error })?,
                ),
            };
            Ok::<_, EngineError>((index, loaded))
        });
        let until = tokio::time::Instant::from_std(deadline.instant());
        tokio::time::timeout_at(until, futures::future::try_join_all(loads))
            .await
            .unwrap_or_else(|_| Err(self.deadline_exceeded()))
    }

    /// Each image in turn: reserve its decoding memory, decode, score, and
    /// drop the pixels, so a request never holds more than one decoded image.
    /// With OCR, its text is read too: found by the detector in the job
    /// that scores it, then read a few lines a job (see
    /// [`LINES_PER_JOB_PER_WORKER`]), within the request's bounds on
    /// characters, lines and allowance; an image this account had read
    /// before is not read again.
    async fn score_images(
        &self,
        pending: Vec<PendingImage>,
        requester: &Requester,
        deadline: &Deadline,
    ) -> Result<Vec<ScoredImage>, EngineError> {
        let Some(classifier) = self.image.clone() else {
            return Ok(Vec::new());
        };
        let mut scored = Vec::with_capacity(pending.len());
        let mut reading = self.ocr.as_ref().map(|ocr| ReadingBudget {
            chars_left: ocr.max_chars_per_request,
            regions_left: ocr.max_regions_per_request,
        });
        for image in pending {
            deadline.check().map_err(|_| self.deadline_exceeded())?;
            let reservation = self
                .decode_memory
                .reserve(image.header.decode_bytes)
                .await
                .map_err(|e| EngineError::Busy(e.0))?;
            let (classifier, limits) = (classifier.clone(), self.image_limits.clone());
            let (index, format, bytes) = (image.index, image.format, image.bytes);
            let encoded = bytes.clone();
            let digest = self.ocr.as_ref().map(|_| ImageDigest::of(&bytes));
            let cached = match (&self.ocr, digest) {
                (Some(ocr), Some(digest)) => ocr.cache.get(&requester.tenant, digest),
                _ => None,
            };
            let detect = match (&self.ocr, &reading) {
                (Some(ocr), Some(budget)) if cached.is_none() && budget.open() => {
                    requester
                        .pay_for(&detection_work(ocr, image.header.pixels()), &ocr.prices)
                        .await?;
                    Some((ocr.reader.clone(), ocr.limits))
                }
                _ => None,
            };
            // Reading an image takes every core for a while: never in the
            // lane that keeps short texts quick.
            let lane = if detect.is_none() && image.header.pixels() <= LIGHT_IMAGE_PIXELS {
                Lane::Light
            } else {
                Lane::Heavy
            };
            let (scores, found) = self
                .on_cpu(lane, &requester.tenant, deadline, move || {
                    let started = std::time::Instant::now();
                    let decoded = image::decode(format, encoded, &limits)
                        .map_err(|error| EngineError::Image { index, error })?;
                    let scores = classifier
                        .score(&decoded)
                        .map_err(EngineError::Classifier)?;
                    record_model_time("image", started);
                    let Some((reader, limits)) = detect else {
                        return Ok((scores, None));
                    };
                    let started = std::time::Instant::now();
                    let detected = reader.detect_counted(&decoded.rgb, &limits);
                    record_model_time("ocr", started);
                    // The pixels and their memory go on to the reading.
                    let pixels = Arc::new(decoded.rgb);
                    Ok::<_, EngineError>((scores, Some((detected, pixels, reservation))))
                })
                .await??;
            let text = match (found, reading.as_mut()) {
                (Some((detected, pixels, _reservation)), Some(budget)) => match detected {
                    Ok(detected) => self
                        .read_lines(index, detected, pixels, budget, requester, deadline)
                        .await?
                        .and_then(|(text, whole)| {
                            if let (Some(ocr), Some(digest), true) = (&self.ocr, digest, whole) {
                                ocr.cache.insert(&requester.tenant, digest, text.clone());
                            }
                            text
                        }),
                    Err(error) => ocr_failed(error, index).map_err(|_| self.deadline_exceeded())?,
                },
                // Read before for this account: nothing to do but keep to the
                // request's characters.
                _ => cached
                    .flatten()
                    .and_then(|text| text.truncated(reading.as_ref().map_or(0, |b| b.chars_left))),
            };
            if let (Some(text), Some(budget)) = (&text, reading.as_mut()) {
                budget.chars_left = budget.chars_left.saturating_sub(text.chars());
            }
            scored.push(ScoredImage {
                index,
                format,
                bytes,
                scores,
                text,
            });
        }
        Ok(scored)
    }

    /// Reads the detected lines a few at a time in the heavy lane, widest
    /// first, until the image's or the request's characters are read, the
    /// request's lines are used up, or the allowance would be overdrawn.
    /// `Some((text, whole))`: `whole` when nothing but the image's own
    /// limits cut the reading (a read worth keeping). `None` when reading
    /// failed (logged; the image is judged without its text).
    async fn read_lines(
        &self,
        index: usize,
        detected: Detected,
        pixels: Arc<::image::RgbImage>,
        budget: &mut ReadingBudget,
        requester: &Requester,
        deadline: &Deadline,
    ) -> Result<Option<(Option<ReadText>, bool)>, EngineError> {
        let Some(ocr) = &self.ocr else {
            return Ok(Some((None, false)));
        };
        let boxes: Arc<Vec<TextBox>> = Arc::new(detected.boxes);
        let mut order = reading_order(&boxes);
        let max_chars = ocr.limits.max_chars.min(budget.chars_left);
        let mut whole = max_chars == ocr.limits.max_chars;
        if order.len() > budget.regions_left {
            order.truncate(budget.regions_left);
            whole = false;
        }
        let per_job = LINES_PER_JOB_PER_WORKER * ocr.reader.workers().max(1);
        let mut read: Vec<(usize, String)> = Vec::new();
        let mut chars = 0;
        for chunk in order.chunks(per_job) {
            if chars >= max_chars {
                break;
            }
            let cost = OcrWork {
                line_pixels: chunk
                    .iter()
                    .map(|&i| line_input_pixels(&boxes[i]) as u64)
                    .sum(),
                ..OcrWork::default()
            };
            requester.pay_for(&cost, &ocr.prices).await?;
            let (reader, boxes, pixels) = (ocr.reader.clone(), boxes.clone(), pixels.clone());
            let (which, job_deadline, left) = (chunk.to_vec(), deadline.clone(), max_chars - chars);
            let lines = self
                .on_cpu(Lane::Heavy, &requester.tenant, deadline, move || {
                    let started = std::time::Instant::now();
                    let lines =
                        reader.recognise_lines(&pixels, &boxes, &which, left, &job_deadline);
                    record_model_time("ocr", started);
                    lines
                })
                .await?;
            let lines = match lines {
                Ok(lines) => lines,
                Err(error) => {
                    return ocr_failed(error, index)
                        .map(|_| None)
                        .map_err(|_| self.deadline_exceeded());
                }
            };
            budget.regions_left = budget
                .regions_left
                .saturating_sub(lines.work.regions as usize);
            chars += lines
                .lines
                .iter()
                .map(|(_, t)| t.chars().count())
                .sum::<usize>();
            read.extend(lines.lines);
        }
        Ok(Some((assemble(boxes.len(), read, max_chars), whole)))
    }

    /// Each text and (see [`TextClassifier::score_items`]) all of them as one.
    /// With `explain`, also the evidence behind the scores.
    async fn score_texts(
        &self,
        classifier: &Arc<dyn TextClassifier>,
        texts: &[(usize, String)],
        explain: Explain,
        requester: &Requester,
        deadline: &Deadline,
    ) -> Result<ScoredTexts, EngineError> {
        if texts.is_empty() {
            return Ok(ScoredTexts {
                items: Vec::new(),
                combined: None,
                evidence: (explain == Explain::Yes)
                    .then(|| TextEvidence::none(0, explain::Source::Model)),
            });
        }
        let batch: Vec<String> = texts.iter().map(|(_, t)| t.clone()).collect();
        // Each chunk is encoded once whether it serves an item or the
        // combined text, so the items' characters measure the job.
        let chars: usize = batch.iter().map(|t| t.chars().count()).sum();
        let lane = if chars <= self.budget.light_job_chars {
            Lane::Light
        } else {
            Lane::Heavy
        };
        let classifier = classifier.clone();
        let job_deadline = deadline.clone();
        let scored = self
            .on_cpu(lane, &requester.tenant, deadline, move || {
                let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                let started = std::time::Instant::now();
                let scored = match explain {
                    Explain::No => {
                        classifier
                            .score_items(&refs, &job_deadline)
                            .map(|(items, combined)| ScoredTexts {
                                items,
                                combined,
                                evidence: None,
                            })
                    }
                    Explain::Yes => {
                        classifier
                            .score_items_explained(&refs, &job_deadline)
                            .map(|e| ScoredTexts {
                                items: e.items,
                                combined: e.combined,
                                evidence: Some(e.evidence),
                            })
                    }
                };
                record_model_time("text", started);
                scored
            })
            .await?;
        let scored = match scored {
            Ok(scored) => scored,
            Err(e) if e.is::<DeadlineExceeded>() => return Err(self.deadline_exceeded()),
            Err(e) => return Err(EngineError::Classifier(e)),
        };
        let evidence_items = scored
            .evidence
            .as_ref()
            .map_or(texts.len(), |e| e.items.len());
        if scored.items.len() != texts.len() || evidence_items != texts.len() {
            return Err(EngineError::Classifier(anyhow::anyhow!(
                "text classifier returned {} results",
                scored.items.len()
            )));
        }
        Ok(scored)
    }

    async fn deep_analysis(&self, images: &[ScoredImage], requested: bool) -> Vec<ImageAnalysis> {
        let status = match (&self.vision, requested) {
            (_, false) => AnalysisStatus::NotRequested,
            (None, true) => AnalysisStatus::Unavailable,
            (Some(vision), true) => {
                let sent = images
                    .iter()
                    .map(|i| VisionImage {
                        format: i.format,
                        bytes: i.bytes.clone(),
                    })
                    .collect();
                return vision.analyze(sent).await;
            }
        };
        images
            .iter()
            .map(|_| ImageAnalysis::with_status(status))
            .collect()
    }
}

/// The detector's work on an image of `pixels`, as paid for before it
/// runs: its input is the image scaled to at most `max_side` a side.
fn detection_work(ocr: &OcrParts, pixels: u64) -> OcrWork {
    let side = u64::from(ocr.limits.max_side);
    OcrWork {
        images: 1,
        detector_pixels: pixels.min(side * side),
        ..OcrWork::default()
    }
}

/// What the rest of a request's images may still be read for.
struct ReadingBudget {
    chars_left: usize,
    regions_left: usize,
}

impl ReadingBudget {
    fn open(&self) -> bool {
        self.chars_left > 0 && self.regions_left > 0
    }
}

/// A failed reading: `Err` for the deadline (the request ends), else
/// logged and `Ok(None)`: the image models judged the image, so a reading
/// that failed leaves it judged by them alone rather than failing it.
fn ocr_failed(error: OcrError, index: usize) -> Result<Option<ReadText>, DeadlineExceeded> {
    match error {
        OcrError::DeadlineExceeded(e) => Err(e),
        error => {
            tracing::warn!(%error, item = index, "OCR failed; the image is judged without its text");
            Ok(None)
        }
    }
}

/// A request's text items scored: each, all of them together, and the
/// evidence behind the scores when it was asked for.
struct ScoredTexts {
    items: Vec<CategoryScores>,
    combined: Option<CategoryScores>,
    evidence: Option<TextEvidence>,
}

/// The explanations of the text verdicts: for the categories each verdict
/// flags, the pieces of `evidence` that account for them, placed in the
/// input's items in Unicode scalar values. Which categories are flagged is
/// the verdicts' (whatever thresholds decided them); `thresholds` only
/// admits further chunks beside the strongest.
fn explain_texts(
    texts: &[(usize, String)],
    outcomes: &[ItemOutcome],
    combined: Option<&Verdict>,
    evidence: TextEvidence,
    thresholds: &EffectiveThresholds,
) -> Explanations {
    let mut items: Vec<Option<Vec<Explanation<Span>>>> = vec![None; outcomes.len()];
    let source = evidence.fallback;
    for ((index, text), pieces) in texts.iter().zip(&evidence.items) {
        let verdict = outcomes[*index].verdict();
        let whole = Evidence {
            place: 0..text.len(),
            scores: verdict.scores,
            source,
        };
        let explained = explain::explain(pieces, &verdict.categories, thresholds, &whole);
        items[*index] = Some(
            explained
                .into_iter()
                .map(|e| Explanation {
                    category: e.category,
                    place: Span::of(text, e.place),
                    score: e.score,
                    source: e.source,
                })
                .collect(),
        );
    }
    let combined = match combined {
        None => Vec::new(),
        Some(verdict) => {
            // One item: the combined text is the item.
            let pieces = if texts.len() == 1 {
                lift(&evidence.items[0])
            } else {
                evidence.combined
            };
            let whole = Evidence {
                place: ItemRanges::covering(texts.iter().map(|(_, t)| t.len())),
                scores: verdict.scores,
                source,
            };
            explain::explain(&pieces, &verdict.categories, thresholds, &whole)
                .into_iter()
                .map(|e| Explanation {
                    category: e.category,
                    place: item_spans(texts, e.place),
                    score: e.score,
                    source: e.source,
                })
                .collect()
        }
    };
    Explanations { items, combined }
}

/// The evidence of the only text item as the combined text's.
fn lift(pieces: &[Evidence<std::ops::Range<usize>>]) -> Vec<Evidence<ItemRanges>> {
    pieces
        .iter()
        .filter_map(|p| {
            Some(Evidence {
                place: ItemRanges::new([ItemRange {
                    item: 0,
                    bytes: p.place.clone(),
                }])?,
                scores: p.scores,
                source: p.source,
            })
        })
        .collect()
}

/// Ranges of the text items (by their position among the text items) as
/// spans of the input's items.
fn item_spans(texts: &[(usize, String)], place: ItemRanges) -> Vec<ItemSpan> {
    place
        .into_ranges()
        .into_iter()
        .filter_map(|r| {
            let (index, text) = texts.get(r.item)?;
            Some(ItemSpan {
                item: *index,
                span: Span::of(text, r.bytes),
            })
        })
        .collect()
}

/// The texts to judge in item order: the text items and the text read
/// from images.
fn text_parts(texts: &[(usize, String)], images: &[ScoredImage]) -> Vec<(usize, String)> {
    let mut parts: Vec<(usize, String)> = texts.to_vec();
    parts.extend(
        images
            .iter()
            .filter_map(|i| Some((i.index, i.text.as_ref()?.text()))),
    );
    parts.sort_by_key(|(index, _)| *index);
    parts
}

/// The time one job spent in a classifier (decoding included for images).
fn record_model_time(classifier: &'static str, started: std::time::Instant) {
    metrics::histogram!(crate::metrics::names::MODEL_DURATION, "classifier" => classifier)
        .record(started.elapsed().as_secs_f64());
}

/// The deep analysis can raise a score, never lower it: per category the
/// stronger of the two, over the categories either evaluated.
fn merge_image_scores(
    standard: &CategoryScores,
    standard_evaluated: &[Category],
    analysis: &ImageAnalysis,
) -> (CategoryScores, Vec<Category>) {
    let mut scores = *standard;
    let mut evaluated: Vec<Category> = standard_evaluated.to_vec();
    if analysis.status == AnalysisStatus::Completed {
        for (name, value) in &analysis.category_scores {
            if let Some(category) = Category::parse(name) {
                scores.set(category, scores.get(category).max(*value));
                if !evaluated.contains(&category) {
                    evaluated.push(category);
                }
            }
        }
    }
    evaluated.sort();
    (scores, evaluated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Condvar, Mutex};

    /// Texts starting with "heavy" wait until the gate opens; every call
    /// takes `delay` and is counted.
    struct TestClassifier {
        gate: Arc<(Mutex<bool>, Condvar)>,
        delay: Duration,
        calls: Arc<AtomicUsize>,
    }

    impl TextClassifier for TestClassifier {
        fn model_id(&self) -> String {
            "test".into()
        }
        fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if texts.iter().any(|t| t.starts_with("heavy")) {
                let (open, changed) = &*self.gate;
                let mut open = open.lock().unwrap();
                while !*open {
                    open = changed.wait(open).unwrap();
                }
            }
            std::thread::sleep(self.delay);
            Ok(vec![CategoryScores::default(); texts.len()])
        }
        fn default_thresholds(&self) -> Thresholds {
            Thresholds::uniform(0.5)
        }
    }

    fn test_engine(classifier: TestClassifier, budget: EngineBudget) -> Engine {
        Engine::new(EngineParts {
            text: Arc::new(classifier),
            text_thresholds: Thresholds::uniform(0.5),
            fast_text: None,
            image: None,
            image_thresholds: Thresholds::uniform(0.5),
            image_limits: crate::config::Config::embedded_defaults().limits.image,
            vision: None,
            ocr: None,
            budget,
        })
    }

    fn classifier(open: bool, delay: Duration) -> (TestClassifier, Arc<(Mutex<bool>, Condvar)>) {
        let gate = Arc::new((Mutex::new(open), Condvar::new()));
        let classifier = TestClassifier {
            gate: gate.clone(),
            delay,
            calls: Arc::new(AtomicUsize::new(0)),
        };
        (classifier, gate)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_short_text_is_not_queued_behind_heavy_jobs() {
        let (classifier, gate) = classifier(false, Duration::ZERO);
        let budget = EngineBudget {
            light_job_chars: 100,
            ..crate::config::Config::embedded_defaults().engine_budget()
        };
        let engine = Arc::new(test_engine(classifier, budget));
        // More heavy requests than there are CPU slots in all.
        let heavy: Vec<_> = (0..16)
            .map(|_| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let text = format!("heavy {}", "x".repeat(200));
                    engine
                        .moderate(vec![Item::Text(text)], false, &CategoryRules::default())
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let light = tokio::time::timeout(
            Duration::from_secs(10),
            engine.moderate(
                vec![Item::Text("hello".into())],
                false,
                &CategoryRules::default(),
            ),
        )
        .await;
        let (open, changed) = &*gate;
        *open.lock().unwrap() = true;
        changed.notify_all();
        assert!(
            light.is_ok_and(|r| r.is_ok()),
            "a short text waited behind heavy jobs"
        );
        for job in heavy {
            job.await
                .unwrap()
                .expect("heavy jobs finish once the gate opens");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn work_stops_at_the_deadline() {
        let (classifier, _gate) = classifier(true, Duration::from_millis(20));
        let calls = classifier.calls.clone();
        let budget = EngineBudget {
            deadline: Duration::from_millis(200),
            ..crate::config::Config::embedded_defaults().engine_budget()
        };
        let engine = test_engine(classifier, budget);
        // 64 items of about 2,000 bytes: 66 mini-batches of 20 ms each.
        let items = (0..64)
            .map(|i| Item::Text(format!("{i:02} {}", "y".repeat(1_990))))
            .collect();
        let started = std::time::Instant::now();
        let result = engine
            .moderate(items, false, &CategoryRules::default())
            .await;
        assert!(
            matches!(result, Err(EngineError::DeadlineExceeded(_))),
            "{result:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered at the deadline"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stopped_at = calls.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            stopped_at,
            "the work was cancelled"
        );
        assert!(stopped_at < 66, "{stopped_at} mini-batches ran");
    }

    #[test]
    fn deep_analysis_raises_but_never_lowers() {
        let mut standard = CategoryScores::default();
        standard.set(Category::Sexual, 0.9);
        let mut analysis = ImageAnalysis::with_status(AnalysisStatus::Completed);
        analysis.category_scores =
            BTreeMap::from([("sexual".to_string(), 0.1), ("violence".to_string(), 0.8)]);
        let (scores, evaluated) = merge_image_scores(&standard, &[Category::Sexual], &analysis);
        assert_eq!(scores.get(Category::Sexual), 0.9);
        assert_eq!(scores.get(Category::Violence), 0.8);
        assert_eq!(evaluated, vec![Category::Sexual, Category::Violence]);

        let failed = ImageAnalysis::with_status(AnalysisStatus::Failed);
        let (scores, evaluated) = merge_image_scores(&standard, &[Category::Sexual], &failed);
        assert_eq!(scores, standard);
        assert_eq!(evaluated, vec![Category::Sexual]);
    }
}
