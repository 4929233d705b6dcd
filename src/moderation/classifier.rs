//! The interfaces the moderation engine calls. Implementations are CPU-bound
//! and blocking: the engine runs them on blocking threads, never on the async
//! executor.

use super::category::{Category, CategoryScores, Thresholds};
use super::image::DecodedImage;

/// Scores texts for every category.
pub trait TextClassifier: Send + Sync + 'static {
    /// Identifier and version, reported in the response's `model` field.
    fn model_id(&self) -> String;

    /// Scores each text. Must return exactly one entry per input, in order.
    /// Texts may be of any length; implementations window long texts themselves.
    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>>;

    /// Scores each item and, with two or more, all of them taken as one
    /// text: joined by a line break (a threat split over messages) and run
    /// together (a word split across them), the stronger of the two. With
    /// one item the combined score is the item's. Classifiers that can
    /// reuse the items' work for the combined text override this.
    fn score_items(
        &self,
        items: &[&str],
    ) -> anyhow::Result<(Vec<CategoryScores>, Option<CategoryScores>)> {
        let joined = combined_texts(items);
        let mut batch = items.to_vec();
        batch.extend(joined.iter().map(String::as_str));
        let mut scores = self.score_batch(&batch)?;
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

    /// The thresholds shipped with the model (configuration may override them).
    fn default_thresholds(&self) -> Thresholds;

    /// Counters of the classifier's embedding cache, if it has one.
    fn embedding_cache_stats(&self) -> Option<EmbeddingCacheStats> {
        None
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
    use super::combined_texts;

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
}
