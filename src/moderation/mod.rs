//! The moderation core: categories, classifiers and the engine that runs
//! them for one request, with the text and image pipelines beneath. Knows
//! nothing of HTTP.

mod category;
mod classifier;
mod deadline;
pub(crate) mod engine;
pub mod explain;
pub mod fair;
pub mod image;
mod speed;
pub mod text;

pub use category::{
    Category, CategoryRule, CategoryRules, CategoryScores, EffectiveThresholds, Threshold,
    ThresholdOutOfRange, Thresholds, NUM_CATEGORIES,
};
pub use classifier::{ExplainedScores, ImageClassifier, ImageScores, TextClassifier, TextEvidence};
pub use deadline::{Deadline, DeadlineExceeded};
pub use speed::{Speed, UnknownSpeed};
pub use text::lexical::LexicalClassifier;
