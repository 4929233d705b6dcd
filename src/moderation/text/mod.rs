//! The text pipeline: one normaliser, the lexical layer (term lists), the
//! embedding model with its heads, and the null classifier that measures
//! the service around them.

pub(crate) mod evidence;
pub mod language;
pub mod lexical;
pub mod model;
pub mod ngrams;
pub(crate) mod normalize;
pub(crate) mod null;

/// The one normaliser, for the lexical benchmark and tools.
pub use normalize::normalize;
