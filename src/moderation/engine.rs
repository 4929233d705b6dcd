//! Moderates one request: scores every text item, the text items taken
//! together, and every image, off the async executor, and merges the deep
//! image analysis when it was asked for.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::category::{Category, CategoryScores, Thresholds, NUM_CATEGORIES};
use super::classifier::{ImageClassifier, TextClassifier};
use super::image::{self, DecodedImage, ImageError, ImageLimits};
use super::vision::{AnalysisStatus, ImageAnalysis, VisionClient, VisionImage};

/// One input item as the engine receives it.
#[derive(Clone, Debug)]
pub enum Item {
    Text(String),
    /// A `data:` URI, parsed and decoded by the engine off the executor.
    Image(String),
}

/// Scores and the decisions drawn from them.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub scores: CategoryScores,
    pub categories: [bool; NUM_CATEGORIES],
    pub flagged: bool,
}

impl Verdict {
    fn new(scores: CategoryScores, thresholds: &Thresholds) -> Verdict {
        let categories = thresholds.decide(&scores);
        Verdict {
            scores,
            categories,
            flagged: categories.iter().any(|c| *c),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemOutcome {
    Text(Verdict),
    Image {
        verdict: Verdict,
        /// Categories some model actually judged for this image.
        evaluated: Vec<Category>,
        analysis: ImageAnalysis,
        bytes: usize,
    },
}

impl ItemOutcome {
    pub fn verdict(&self) -> &Verdict {
        match self {
            ItemOutcome::Text(v) | ItemOutcome::Image { verdict: v, .. } => v,
        }
    }
}

/// The moderation of a whole request.
#[derive(Clone, Debug, PartialEq)]
pub struct Moderation {
    pub items: Vec<ItemOutcome>,
    /// All text items taken as one text, with how many there were.
    pub combined_text: Option<(Verdict, usize)>,
    pub flagged: bool,
    /// Deep analyses that completed.
    pub deep_analyses: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An image item is bad: the client's mistake.
    #[error("input[{index}].base64: {error}")]
    Image { index: usize, error: ImageError },
    #[error("no image classifier is configured, so image items cannot be moderated")]
    ImagesDisabled { index: usize },
    #[error("classifier failed: {0}")]
    Classifier(#[from] anyhow::Error),
}

pub struct Engine {
    text: Arc<dyn TextClassifier>,
    text_thresholds: Thresholds,
    image: Option<Arc<dyn ImageClassifier>>,
    image_thresholds: Thresholds,
    image_limits: ImageLimits,
    vision: Option<VisionClient>,
    /// Bounds CPU-bound jobs in flight so that a burst queues instead of
    /// oversubscribing the cores.
    cpu: Arc<Semaphore>,
}

pub struct EngineParts {
    pub text: Arc<dyn TextClassifier>,
    pub text_thresholds: Thresholds,
    pub image: Option<Arc<dyn ImageClassifier>>,
    pub image_thresholds: Thresholds,
    pub image_limits: ImageLimits,
    pub vision: Option<VisionClient>,
}

impl Engine {
    pub fn new(parts: EngineParts) -> Engine {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2);
        Engine {
            text: parts.text,
            text_thresholds: parts.text_thresholds,
            image: parts.image,
            image_thresholds: parts.image_thresholds,
            image_limits: parts.image_limits,
            vision: parts.vision,
            cpu: Arc::new(Semaphore::new(cores * 2)),
        }
    }

    /// Classifier ids and versions, for the response's `model` field.
    pub fn model_id(&self) -> String {
        let mut parts = vec![self.text.model_id()];
        if let Some(image) = &self.image {
            parts.push(image.model_id());
        }
        parts.join("+")
    }

    pub async fn moderate(
        &self,
        items: Vec<Item>,
        analyze_images: bool,
    ) -> Result<Moderation, EngineError> {
        let texts: Vec<(usize, String)> = items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Item::Text(t) => Some((i, t.clone())),
                Item::Image(_) => None,
            })
            .collect();
        let images: Vec<(usize, String)> = items
            .into_iter()
            .enumerate()
            .filter_map(|(i, item)| match item {
                Item::Image(uri) => Some((i, uri)),
                Item::Text(_) => None,
            })
            .collect();
        if let (Some((index, _)), None) = (images.first(), &self.image) {
            return Err(EngineError::ImagesDisabled { index: *index });
        }

        let decoded = self.decode_images(images).await?;
        let vision_job = self.deep_analysis(&decoded, analyze_images);
        let (text_scores, image_scores, analyses) = tokio::join!(
            self.score_texts(&texts),
            self.score_images(&decoded),
            vision_job
        );
        let (item_scores, combined) = text_scores?;
        let image_scores = image_scores?;

        let total = texts.len() + decoded.len();
        let mut outcomes: Vec<Option<ItemOutcome>> = vec![None; total];
        for ((index, _), scores) in texts.iter().zip(item_scores) {
            outcomes[*index] = Some(ItemOutcome::Text(Verdict::new(
                scores,
                &self.text_thresholds,
            )));
        }
        let mut deep_analyses = 0;
        for (((index, image), standard), analysis) in decoded.iter().zip(image_scores).zip(analyses)
        {
            if analysis.status == AnalysisStatus::Completed {
                deep_analyses += 1;
            }
            let (scores, evaluated) =
                merge_image_scores(&standard.scores, &standard.evaluated, &analysis);
            outcomes[*index] = Some(ItemOutcome::Image {
                verdict: Verdict::new(scores, &self.image_thresholds),
                evaluated,
                analysis,
                bytes: image.encoded.len(),
            });
        }
        let items: Vec<ItemOutcome> = outcomes.into_iter().flatten().collect();
        let combined_text =
            combined.map(|scores| (Verdict::new(scores, &self.text_thresholds), texts.len()));
        let flagged = items.iter().any(|o| o.verdict().flagged)
            || combined_text.as_ref().is_some_and(|(v, _)| v.flagged);
        Ok(Moderation {
            items,
            combined_text,
            flagged,
            deep_analyses,
        })
    }

    /// Runs `job` on a blocking thread once a CPU slot is free.
    async fn on_cpu<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, EngineError> {
        let _slot = self
            .cpu
            .acquire()
            .await
            .map_err(|e| EngineError::Classifier(e.into()))?;
        tokio::task::spawn_blocking(job)
            .await
            .map_err(|e| EngineError::Classifier(e.into()))
    }

    async fn decode_images(
        &self,
        images: Vec<(usize, String)>,
    ) -> Result<Vec<(usize, DecodedImage)>, EngineError> {
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let limits = self.image_limits.clone();
        self.on_cpu(move || {
            images
                .into_iter()
                .map(|(index, uri)| {
                    let (format, bytes) = image::parse_data_uri(&uri, &limits)
                        .map_err(|error| EngineError::Image { index, error })?;
                    let decoded = image::decode(format, bytes, &limits)
                        .map_err(|error| EngineError::Image { index, error })?;
                    Ok((index, decoded))
                })
                .collect()
        })
        .await?
    }

    /// Each text and (see [`TextClassifier::score_items`]) all of them as one.
    async fn score_texts(
        &self,
        texts: &[(usize, String)],
    ) -> Result<(Vec<CategoryScores>, Option<CategoryScores>), EngineError> {
        if texts.is_empty() {
            return Ok((Vec::new(), None));
        }
        let batch: Vec<String> = texts.iter().map(|(_, t)| t.clone()).collect();
        let classifier = self.text.clone();
        let (scores, combined) = self
            .on_cpu(move || {
                let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                classifier.score_items(&refs)
            })
            .await??;
        if scores.len() != texts.len() {
            return Err(EngineError::Classifier(anyhow::anyhow!(
                "text classifier returned {} results",
                scores.len()
            )));
        }
        Ok((scores, combined))
    }

    async fn score_images(
        &self,
        images: &[(usize, DecodedImage)],
    ) -> Result<Vec<super::ImageScores>, EngineError> {
        let Some(classifier) = self.image.clone() else {
            return Ok(Vec::new());
        };
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let images: Vec<DecodedImage> = images.iter().map(|(_, i)| i.clone()).collect();
        self.on_cpu(move || {
            images
                .iter()
                .map(|i| classifier.score(i))
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .await?
        .map_err(EngineError::Classifier)
    }

    async fn deep_analysis(
        &self,
        images: &[(usize, DecodedImage)],
        requested: bool,
    ) -> Vec<ImageAnalysis> {
        let status = match (&self.vision, requested) {
            (_, false) => AnalysisStatus::NotRequested,
            (None, true) => AnalysisStatus::Unavailable,
            (Some(vision), true) => {
                let sent = images
                    .iter()
                    .map(|(_, i)| VisionImage {
                        format: i.format,
                        bytes: i.encoded.clone(),
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
