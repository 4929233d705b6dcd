//! Image items: data-URI parsing and bounded decoding.
//!
//! INTERFACE STUB — the images work (issue 5) replaces the bodies; the
//! signatures are what the engine and the HTTP layer call.

use bytes::Bytes;

/// The image formats the service accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageFormat {
    Jpeg,
    Png,
    Gif,
    Webp,
}

impl ImageFormat {
    pub fn media_type(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "image/jpeg",
            ImageFormat::Png => "image/png",
            ImageFormat::Gif => "image/gif",
            ImageFormat::Webp => "image/webp",
        }
    }
}

/// Hard limits applied before and while decoding.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ImageLimits {
    /// Decoded (binary) bytes of one image.
    pub max_bytes: usize,
    pub max_width: u32,
    pub max_height: u32,
    /// width × height.
    pub max_pixels: u64,
    /// Memory the decoder may allocate for one image.
    pub max_alloc_bytes: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            max_bytes: 4 * 1024 * 1024,
            max_width: 8192,
            max_height: 8192,
            max_pixels: 40_000_000,
            max_alloc_bytes: 256 * 1024 * 1024,
        }
    }
}

/// A decoded image, ready for a classifier.
#[derive(Clone, Debug)]
pub struct DecodedImage {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
    /// First frame, 8-bit RGB.
    pub rgb: image::RgbImage,
    /// The original encoded bytes (what the deep analysis sends on).
    pub encoded: Bytes,
}

/// Why an image item was refused. The HTTP layer prefixes the message with
/// the item's field path (`input[2].base64`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ImageError {
    /// Over a configured size limit: maps to 413 `payload_too_large`.
    #[error("{0}")]
    TooLarge(String),
    /// Anything else wrong with the data: maps to 400 `invalid_image`.
    #[error("{0}")]
    Invalid(String),
}

/// Parses `data:<media type>;base64,<data>` into the declared format and the
/// binary bytes, refusing more than `limits.max_bytes` of binary data.
pub fn parse_data_uri(_uri: &str, _limits: &ImageLimits) -> Result<(ImageFormat, Bytes), ImageError> {
    Err(ImageError::Invalid("image input is not supported yet".into()))
}

/// Checks that `bytes` really are `declared`, then decodes the first frame
/// within `limits`. Blocking CPU work.
pub fn decode(_declared: ImageFormat, _bytes: Bytes, _limits: &ImageLimits) -> Result<DecodedImage, ImageError> {
    Err(ImageError::Invalid("image input is not supported yet".into()))
}
