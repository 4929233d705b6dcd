//! The image pipeline: bounded decoding of an item's bytes, remote URLs
//! fetched when the operator allows them, the local NSFW classifier and the
//! third-party vision model's deep look, and the text read inside images.

// `decode` must not use anything outside itself and `budget`: the fuzz
// target compiles it alone, without the rest of the crate.
pub mod decode;
pub mod nsfw;
pub mod ocr;
pub(crate) mod remote;
pub mod vision;
