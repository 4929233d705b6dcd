//! A text classifier that scores everything 0. Only for measuring the
//! service's own overhead around the model (`text_classifier = "null"`).

use crate::moderation::category::{CategoryScores, Thresholds};
use crate::moderation::classifier::TextClassifier;

pub struct NullClassifier;

impl TextClassifier for NullClassifier {
    fn model_id(&self) -> String {
        "null".into()
    }

    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>> {
        Ok(vec![CategoryScores::default(); texts.len()])
    }

    fn default_thresholds(&self) -> Thresholds {
        Thresholds::uniform(0.5)
    }
}
