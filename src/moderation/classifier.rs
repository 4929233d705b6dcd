//! The interfaces the moderation engine calls. Implementations are CPU-bound
//! and blocking: the engine runs them on blocking threads, never on the async
//! executor.

use std::ops::Range;

use super::category::{Category, CategoryScores, Thresholds};
use super::deadline::Deadline;
use super::explain::{Evidence, ItemRanges, Source};
use super::image::decode::DecodedImage;

/// Texts of about this many bytes are scored together between two deadline
/// checks by the default [`TextClassifier::score_batch_within`].
pub const MINI_BATCH_BYTES: usize = 2_000;

/// Scores texts for every category.
pub trait TextClassifier: Send + Sync + 'static {
    /// Identifier and version, reported in the response's `model` field.
    fn model_id(&self) -> String;

    /// Scores each text. Must return exactly one entry per input, in order.
    /// Texts may be of any length; implementations window long texts themselves.
    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>>;

    /// [`score_batch`](Self::score_batch) that stops once `deadline` is over,
    /// returning an error that wraps [`super::DeadlineExceeded`]. The default
    /// checks the deadline between mini-batches of about [`MINI_BATCH_BYTES`];
    /// a classifier that cuts long texts itself should override it and check
    /// between its own passes too, so that one long text cannot run past the
    /// deadline.
    fn score_batch_within(
        &self,
        texts: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<Vec<CategoryScores>> {
        let mut scores = Vec::with_capacity(texts.len());
        for batch in mini_batches(texts, MINI_BATCH_BYTES) {
            deadline.check()?;
            scores.extend(self.score_batch(batch)?);
        }
        Ok(scores)
    }

    /// Scores each item and, with two or more, all of them taken as one
    /// text: joined by a line break (a threat split over messages) and run
    /// together (a word split across them), the stronger of the two. With
    /// one item the combined score is the item's. Stops at `deadline` as
    /// [`score_batch_within`](Self::score_batch_within) does. The engine
    /// calls this one; classifiers that can reuse the items' work for the
    /// combined text override it.
    fn score_items(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<(Vec<CategoryScores>, Option<CategoryScores>)> {
        let joined = combined_texts(items);
        let mut batch = items.to_vec();
        batch.extend(joined.iter().map(String::as_str));
        let mut scores = self.score_batch_within(&batch, deadline)?;
        if scores.len() != batch.len() {
            anyhow::bail!("text classifier returned {} results", scores.len());
        }
        let combined_parts = scores.split_off(items.len());
        let combined = if items.len() == 1 {
            scores.first().copied()
        } else {
            combined_parts.into_iter().reduce(|a, b| a.max_with(&b))
        };
        Ok((scores, combined))
    }

    /// [`score_items`](Self::score_items) with the evidence behind the
    /// scores: every piece of each text that was scored (chunks, matched
    /// terms), for explanations. Called only when a client asks for them,
    /// so that ordinary requests keep nothing per chunk. The scores must be
    /// exactly those of `score_items`. The default reports no pieces, so
    /// every flag is explained by its whole text.
    fn score_items_explained(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<ExplainedScores> {
        let (scores, combined) = self.score_items(items, deadline)?;
        Ok(ExplainedScores {
            evidence: TextEvidence::none(scores.len(), Source::Model),
            items: scores,
            combined,
        })
    }

    /// The thresholds shipped with the model (configuration may override them).
    fn default_thresholds(&self) -> Thresholds;

    /// Counters of the classifier's embedding cache, if it has one.
    fn embedding_cache_stats(&self) -> Option<EmbeddingCacheStats> {
        None
    }
}

/// What [`TextClassifier::score_items_explained`] returns.
#[derive(Clone, Debug)]
pub struct ExplainedScores {
    pub items: Vec<CategoryScores>,
    pub combined: Option<CategoryScores>,
    pub evidence: TextEvidence,
}

/// The scored pieces of each text item (byte ranges of the item) and of
/// the items taken together.
#[derive(Clone, Debug)]
pub struct TextEvidence {
    pub items: Vec<Vec<Evidence<Range<usize>>>>,
    /// With one item, empty: the combined text is the item.
    pub combined: Vec<Evidence<ItemRanges>>,
    /// What gave the scores when no piece accounts for a flag.
    pub fallback: Source,
}

impl TextEvidence {
    /// No pieces for `items` texts.
    pub fn none(items: usize, fallback: Source) -> TextEvidence {
        TextEvidence {
            items: vec![Vec::new(); items],
            combined: Vec::new(),
            fallback,
        }
    }
}

/// Texts that stand for "all text items as one": joined by a line break and
/// run together.
pub fn combined_texts(texts: &[&str]) -> Vec<String> {
    if texts.len() < 2 {
        return Vec::new();
    }
    vec![texts.join("\n"), texts.concat()]
}

/// Counters of an embedding cache since the classifier was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmbeddingCacheStats {
    /// Windows found in the cache.
    pub hits: u64,
    /// Windows that had to be encoded.
    pub misses: u64,
    pub entries: usize,
    pub capacity: usize,
}

/// Consecutive runs of `texts` of at most `max_bytes` together (a longer
/// text is a run of its own), in order.
pub fn mini_batches<'a, 'b>(texts: &'b [&'a str], max_bytes: usize) -> Vec<&'b [&'a str]> {
    let mut runs = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, text) in texts.iter().enumerate() {
        if i > start && bytes + text.len() > max_bytes {
            runs.push(&texts[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += text.len();
    }
    if start < texts.len() {
        runs.push(&texts[start..]);
    }
    runs
}

/// What an image model could say about one image.
#[derive(Clone, Debug, PartialEq)]
pub struct ImageScores {
    pub scores: CategoryScores,
    /// The categories this model actually judges; the others are 0 and mean
    /// "not evaluated", not "safe".
    pub evaluated: Vec<Category>,
}

/// Scores one decoded image.
pub trait ImageClassifier: Send + Sync + 'static {
    fn model_id(&self) -> String;
    fn score(&self, image: &DecodedImage) -> anyhow::Result<ImageScores>;
    fn default_thresholds(&self) -> Thresholds;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_texts_join_and_run_together() {
        let texts = ["I will ki", "ll you"];
        assert_eq!(
            combined_texts(&texts),
            vec![
                "I will ki\nll you".to_string(),
                "I will kill you".to_string()
            ]
        );
        assert!(combined_texts(&texts[..1]).is_empty());
    }

    #[test]
    fn mini_batches_keep_order_and_bound_their_size() {
        let texts = ["aaaa", "bb", "cccccccc", "d", "e"];
        let runs = mini_batches(&texts, 6);
        assert_eq!(
            runs,
            vec![&texts[0..2], &texts[2..3], &texts[3..5]],
            "a text over the bound is a run of its own"
        );
        assert!(mini_batches(&[], 6).is_empty());
    }
}
