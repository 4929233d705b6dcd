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

    /// The thresholds shipped with the model (configuration may override them).
    fn default_thresholds(&self) -> Thresholds;

    /// Counters of the classifier's embedding cache, if it has one.
    fn embedding_cache_stats(&self) -> Option<EmbeddingCacheStats> {
        None
    }
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
