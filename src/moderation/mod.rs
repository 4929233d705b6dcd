//! The moderation core: categories, classifiers, images and the engine that
//! runs them for one request. Knows nothing of HTTP.

pub mod category;
pub mod classifier;
pub mod deadline;
pub mod engine;
pub mod image;
// Beside the image pipeline in `image/`, but declared here: the fuzz target
// compiles image.rs alone, without an HTTP client.
pub mod lexical;
pub mod normalize;
pub mod nsfw;
pub mod null;
#[path = "image/remote.rs"]
pub mod remote_image;
pub mod text_model;
pub mod vision;

pub use category::{Category, CategoryScores, Thresholds, NUM_CATEGORIES};
pub use classifier::{ImageClassifier, ImageScores, TextClassifier};
pub use deadline::{Deadline, DeadlineExceeded};
pub use lexical::LexicalClassifier;
