//! Image items: data-URI parsing and bounded decoding.
//!
//! Every size is checked before the memory for it is allocated: the base64
//! length before the base64 is decoded, the header's dimensions before the
//! pixels are decoded, and the decoder itself runs under [`image::Limits`] so
//! that a header that lies about its size cannot make it allocate more than
//! `max_alloc_bytes`.
//!
//! Transparent images are composited on white: that is how most viewers show
//! them on a light page, so the classifier sees what a person would see, and
//! pixels hidden under alpha 0 (which nobody sees) do not count.

use std::io::Cursor;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use bytes::Bytes;
use image::{DynamicImage, ImageDecoder, ImageReader, Limits, RgbImage, RgbaImage};

// The path is spelt out so that the fuzz target, which compiles this file
// as a module of its own, finds it too.
#[path = "budget.rs"]
mod budget;
pub use budget::{DecodeBudget, DecodeReservation, NoMemoryInTime};

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

    /// Short human name used in error messages.
    fn name(self) -> &'static str {
        match self {
            ImageFormat::Jpeg => "JPEG",
            ImageFormat::Png => "PNG",
            ImageFormat::Gif => "GIF",
            ImageFormat::Webp => "WebP",
        }
    }

    /// The media types accepted for each format (`image/jpg` is a common
    /// misspelling that clients send, so it is taken as an alias).
    fn from_media_type(media_type: &str) -> Option<ImageFormat> {
        match media_type.to_ascii_lowercase().as_str() {
            "image/jpeg" | "image/jpg" => Some(ImageFormat::Jpeg),
            "image/png" => Some(ImageFormat::Png),
            "image/gif" => Some(ImageFormat::Gif),
            "image/webp" => Some(ImageFormat::Webp),
            _ => None,
        }
    }

    /// The format the leading bytes announce, if any we accept.
    fn sniff(bytes: &[u8]) -> Option<ImageFormat> {
        const PNG: &[u8] = b"\x89PNG\r\n\x1a\n";
        if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
            Some(ImageFormat::Jpeg)
        } else if bytes.starts_with(PNG) {
            Some(ImageFormat::Png)
        } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
            Some(ImageFormat::Gif)
        } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
            Some(ImageFormat::Webp)
        } else {
            None
        }
    }

    fn to_image_crate(self) -> image::ImageFormat {
        match self {
            ImageFormat::Jpeg => image::ImageFormat::Jpeg,
            ImageFormat::Png => image::ImageFormat::Png,
            ImageFormat::Gif => image::ImageFormat::Gif,
            ImageFormat::Webp => image::ImageFormat::WebP,
        }
    }
}

/// Hard limits applied before and while decoding. Their defaults are in
/// `config/default.toml` (`[limits.image]`).
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
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

const ACCEPTED_TYPES: &str = "image/jpeg, image/png, image/gif or image/webp";

/// Standard alphabet; padding optional because several client libraries
/// strip it and the length is unambiguous without it.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Parses `data:<media type>;base64,<data>` into the declared format and the
/// binary bytes, refusing more than `limits.max_bytes` of binary data.
pub fn parse_data_uri(uri: &str, limits: &ImageLimits) -> Result<(ImageFormat, Bytes), ImageError> {
    let rest = strip_prefix_ignore_case(uri, "data:").ok_or_else(|| {
        ImageError::Invalid(
            "expected a data URI of the form data:<media type>;base64,<data>".into(),
        )
    })?;
    let (meta, data) = rest.split_once(',').ok_or_else(|| {
        ImageError::Invalid("the data URI has no ',' between the media type and the data".into())
    })?;
    let format = parse_meta(meta)?;
    let bytes = decode_base64(data, limits.max_bytes)?;
    Ok((format, bytes))
}

/// `<media type>[;param=value]*;base64` → the declared format.
fn parse_meta(meta: &str) -> Result<ImageFormat, ImageError> {
    let mut parts = meta.split(';').map(str::trim);
    let media_type = parts.next().unwrap_or_default();
    let is_base64 = meta
        .split(';')
        .next_back()
        .is_some_and(|p| p.trim().eq_ignore_ascii_case("base64"));
    if !is_base64 {
        return Err(ImageError::Invalid(
            "only base64 data URIs are accepted (data:<media type>;base64,<data>)".into(),
        ));
    }
    if media_type.is_empty() {
        return Err(ImageError::Invalid(format!(
            "the data URI has no media type; expected {ACCEPTED_TYPES}"
        )));
    }
    ImageFormat::from_media_type(media_type).ok_or_else(|| {
        ImageError::Invalid(format!(
            "unsupported media type '{}'; expected {ACCEPTED_TYPES}",
            truncate_for_message(media_type)
        ))
    })
}

/// Decodes base64, refusing by length before anything is allocated.
fn decode_base64(data: &str, max_bytes: usize) -> Result<Bytes, ImageError> {
    if data.is_empty() {
        return Err(ImageError::Invalid("the image data is empty".into()));
    }
    // Four base64 characters carry three bytes, so this is the longest
    // encoding of `max_bytes` bytes (padded).
    let max_encoded = max_bytes.div_ceil(3).saturating_mul(4);
    if data.len() > max_encoded {
        return Err(too_large_bytes(base64_decoded_len(data.len()), max_bytes));
    }
    let decoded = BASE64
        .decode(data.as_bytes())
        .map_err(|e| ImageError::Invalid(describe_base64_error(&e)))?;
    if decoded.len() > max_bytes {
        return Err(too_large_bytes(decoded.len(), max_bytes));
    }
    if decoded.is_empty() {
        return Err(ImageError::Invalid("the image data is empty".into()));
    }
    Ok(Bytes::from(decoded))
}

fn base64_decoded_len(encoded_len: usize) -> usize {
    encoded_len / 4 * 3
}

fn too_large_bytes(actual: usize, max: usize) -> ImageError {
    ImageError::TooLarge(format!(
        "the image is about {actual} bytes; the limit is {max} bytes"
    ))
}

fn describe_base64_error(e: &base64::DecodeError) -> String {
    match e {
        base64::DecodeError::InvalidByte(offset, byte) => {
            format!(
                "invalid base64: unexpected character {:?} at offset {offset}",
                char::from(*byte)
            )
        }
        base64::DecodeError::InvalidLength(_) => {
            "invalid base64: the data has an impossible length".into()
        }
        base64::DecodeError::InvalidLastSymbol(offset, _) => {
            format!("invalid base64: bad final character at offset {offset}")
        }
        base64::DecodeError::InvalidPadding => "invalid base64: bad padding".into(),
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// Client text echoed in an error, kept short.
fn truncate_for_message(s: &str) -> String {
    const MAX: usize = 64;
    if s.chars().count() <= MAX {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(MAX).collect();
        out.push('…');
        out
    }
}

/// The format of an image nobody declared a media type for (a fetched
/// one), read from its leading bytes: a server's `Content-Type` is not
/// trusted, the bytes are what gets decoded.
pub fn sniff_format(bytes: &[u8]) -> Result<ImageFormat, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Invalid("the image data is empty".into()));
    }
    ImageFormat::sniff(bytes).ok_or_else(|| {
        ImageError::Invalid(format!(
            "the data is not an image: it does not start with the signature of {ACCEPTED_TYPES}"
        ))
    })
}

/// What the header says about an image, before any pixel is decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    pub width: u32,
    pub height: u32,
    /// Memory decoding it may hold at its peak (see [`peak_decode_bytes`]).
    pub decode_bytes: u64,
}

impl ImageHeader {
    pub fn pixels(&self) -> u64 {
        u64::from(self.width) * u64::from(self.height)
    }
}

/// Checks the signature and reads the header within `limits`, allocating no
/// pixels: what a request must reserve before [`decode`] is called.
pub fn inspect(
    declared: ImageFormat,
    bytes: &[u8],
    limits: &ImageLimits,
) -> Result<ImageHeader, ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(too_large_bytes(bytes.len(), limits.max_bytes));
    }
    check_container(declared, bytes)?;
    let (width, height, buffer_bytes) = guard_panics(|| {
        let decoder = reader(declared, bytes, decoder_limits(limits, false)).into_decoder()?;
        let (width, height) = decoder.dimensions();
        Ok::<_, image::ImageError>((width, height, decoder.total_bytes()))
    })
    .and_then(|r| r.map_err(|e| map_image_error(declared, e)))?;
    check_dimensions(width, height, limits)?;
    Ok(ImageHeader {
        width,
        height,
        decode_bytes: peak_decode_bytes(width, height, buffer_bytes, limits),
    })
}

/// The most a decode of this image holds at once: the decoder's buffer
/// (itself capped by `max_alloc_bytes`), an RGBA copy for compositing (or
/// the decoder's working rows) and the RGB result, 4 + 3 bytes a pixel.
fn peak_decode_bytes(width: u32, height: u32, buffer_bytes: u64, limits: &ImageLimits) -> u64 {
    let pixels = u64::from(width) * u64::from(height);
    buffer_bytes.min(limits.max_alloc_bytes) + pixels * 7
}

/// Checks that `bytes` really are `declared`, then decodes the first frame
/// within `limits`. Blocking CPU work.
pub fn decode(
    declared: ImageFormat,
    bytes: Bytes,
    limits: &ImageLimits,
) -> Result<DecodedImage, ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(too_large_bytes(bytes.len(), limits.max_bytes));
    }
    check_container(declared, &bytes)?;
    let (width, height) = read_dimensions(declared, &bytes, limits)?;
    check_dimensions(width, height, limits)?;
    let image = decode_pixels(declared, &bytes, limits)?;
    let rgb = to_rgb_on_white(image);
    Ok(DecodedImage {
        format: declared,
        width: rgb.width(),
        height: rgb.height(),
        rgb,
        encoded: bytes,
    })
}

/// The data is a whole file of the declared format: its signature, and for
/// JPEG its end-of-image marker (the header alone reads fine from half a file).
fn check_container(declared: ImageFormat, bytes: &[u8]) -> Result<(), ImageError> {
    check_magic(declared, bytes)?;
    if declared == ImageFormat::Jpeg {
        check_jpeg_complete(bytes)?;
    }
    Ok(())
}

fn check_magic(declared: ImageFormat, bytes: &[u8]) -> Result<(), ImageError> {
    match ImageFormat::sniff(bytes) {
        Some(actual) if actual == declared => Ok(()),
        Some(actual) => Err(ImageError::Invalid(format!(
            "declared {} but the data is a {} image",
            declared.media_type(),
            actual.name()
        ))),
        None => Err(ImageError::Invalid(format!(
            "declared {} but the data does not start with a {} signature",
            declared.media_type(),
            declared.name()
        ))),
    }
}

/// The JPEG decoder fills in what a truncated file is missing (grey), so a
/// file cut short would be scored as if whole: walk the segments from SOI to
/// the end-of-image marker and refuse the file if the data ends first.
/// Segments are skipped by their lengths (an embedded thumbnail's own EOI is
/// inside one), and data after EOI is left alone. Anything malformed is left
/// to the decoder, which says what is wrong.
fn check_jpeg_complete(bytes: &[u8]) -> Result<(), ImageError> {
    let truncated = || {
        ImageError::Invalid(
            "the JPEG image is truncated: the data ends before its end-of-image marker".into(),
        )
    };
    let mut at = 2; // past SOI
    loop {
        if at >= bytes.len() {
            return Err(truncated());
        }
        if bytes[at] != 0xFF {
            return Ok(()); // not a marker: the decoder's to judge
        }
        // Fill bytes may precede a marker.
        while at + 1 < bytes.len() && bytes[at + 1] == 0xFF {
            at += 1;
        }
        let Some(&marker) = bytes.get(at + 1) else {
            return Err(truncated());
        };
        match marker {
            0xD9 => return Ok(()),
            0xD0..=0xD7 | 0x01 => at += 2, // no length
            _ => {
                let Some(length) = bytes.get(at + 2..at + 4) else {
                    return Err(truncated());
                };
                at += 2 + usize::from(u16::from_be_bytes([length[0], length[1]]));
                if marker == 0xDA {
                    at = next_marker_after_scan(bytes, at).ok_or_else(truncated)?;
                }
            }
        }
    }
}

/// The position of the marker that ends the entropy-coded data starting at
/// `from` (where 0xFF is followed by 0x00 stuffing or a restart marker
/// inside the data), or `None` if the data runs to the end.
fn next_marker_after_scan(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        at += bytes.get(at..)?.iter().position(|&b| b == 0xFF)?;
        match *bytes.get(at + 1)? {
            0x00 | 0xD0..=0xD7 => at += 2,
            0xFF => at += 1,
            _ => return Some(at),
        }
    }
}

/// `strict_dimensions` is off only for the header read, so that an
/// over-size header reaches [`check_dimensions`], whose message has the
/// numbers; reading a header allocates no pixels either way.
fn decoder_limits(limits: &ImageLimits, strict_dimensions: bool) -> Limits {
    let mut l = Limits::default();
    if strict_dimensions {
        l.max_image_width = Some(limits.max_width);
        l.max_image_height = Some(limits.max_height);
    }
    l.max_alloc = Some(limits.max_alloc_bytes);
    l
}

fn reader(format: ImageFormat, bytes: &[u8], limits: Limits) -> ImageReader<Cursor<&[u8]>> {
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format.to_image_crate());
    reader.limits(limits);
    reader
}

/// Reads only the header.
fn read_dimensions(
    format: ImageFormat,
    bytes: &[u8],
    limits: &ImageLimits,
) -> Result<(u32, u32), ImageError> {
    guard_panics(|| reader(format, bytes, decoder_limits(limits, false)).into_dimensions())
        .and_then(|r| r.map_err(|e| map_image_error(format, e)))
}

fn check_dimensions(width: u32, height: u32, limits: &ImageLimits) -> Result<(), ImageError> {
    if width == 0 || height == 0 {
        return Err(ImageError::Invalid(format!(
            "the image is {width}×{height} pixels; it has no pixels"
        )));
    }
    let pixels = u64::from(width) * u64::from(height);
    if width > limits.max_width || height > limits.max_height || pixels > limits.max_pixels {
        return Err(ImageError::TooLarge(format!(
            "the image is {width}×{height} pixels ({pixels} pixels); the limit is {}×{} and {} pixels",
            limits.max_width, limits.max_height, limits.max_pixels
        )));
    }
    Ok(())
}

fn decode_pixels(
    format: ImageFormat,
    bytes: &[u8],
    limits: &ImageLimits,
) -> Result<DynamicImage, ImageError> {
    guard_panics(|| reader(format, bytes, decoder_limits(limits, true)).decode())
        .and_then(|r| r.map_err(|e| map_image_error(format, e)))
}

/// A decoder bug must not take a worker down; the input is refused instead.
fn guard_panics<T>(f: impl FnOnce() -> T) -> Result<T, ImageError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .map_err(|_| ImageError::Invalid("the image decoder failed on this data".into()))
}

fn map_image_error(format: ImageFormat, e: image::ImageError) -> ImageError {
    match e {
        image::ImageError::Limits(limit) => match limit.kind() {
            image::error::LimitErrorKind::DimensionError => {
                ImageError::TooLarge("the image's dimensions are over the configured limits".into())
            }
            image::error::LimitErrorKind::InsufficientMemory => ImageError::TooLarge(
                "decoding the image would need more memory than the configured limit".into(),
            ),
            _ => ImageError::Invalid(format!(
                "the {} image cannot be decoded within the limits",
                format.name()
            )),
        },
        image::ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            ImageError::Invalid(format!("the {} image is truncated", format.name()))
        }
        other => ImageError::Invalid(format!("the {} image is corrupt: {other}", format.name())),
    }
}

fn to_rgb_on_white(image: DynamicImage) -> RgbImage {
    if !image.color().has_alpha() {
        return image.into_rgb8();
    }
    match image {
        DynamicImage::ImageRgba8(rgba) => composite_on_white(&rgba),
        other => composite_on_white(&other.into_rgba8()),
    }
}

fn composite_on_white(rgba: &RgbaImage) -> RgbImage {
    RgbImage::from_fn(rgba.width(), rgba.height(), |x, y| {
        let [r, g, b, a] = rgba.get_pixel(x, y).0;
        let blend = |c: u8| -> u8 {
            let (c, a) = (u32::from(c), u32::from(a));
            // Integer "over" with rounding: c·a + 255·(255 − a), over 255.
            ((c * a + 255 * (255 - a) + 127) / 255) as u8
        };
        image::Rgb([blend(r), blend(g), blend(b)])
    })
}

/// Runs arbitrary bytes through the image path the way a client could, for
/// the fuzz target (`fuzz/`) and its regression tests; the result is dropped.
///
/// The first byte picks the mode: even → the rest is a data URI string
/// (exercises the parser); odd → the rest are raw image bytes behind the
/// signature of the format the byte picks (exercises the decoders, which a
/// random data URI rarely reaches).
#[doc(hidden)]
pub fn exercise_untrusted_input(data: &[u8]) {
    const FORMATS: [(ImageFormat, &[u8]); 4] = [
        (ImageFormat::Png, b"\x89PNG\r\n\x1a\n"),
        (ImageFormat::Jpeg, &[0xFF, 0xD8, 0xFF]),
        (ImageFormat::Gif, b"GIF89a"),
        (ImageFormat::Webp, b"RIFF\x00\x00\x00\x00WEBP"),
    ];
    // Small enough that a bomb hits them quickly, large enough to decode.
    let limits = ImageLimits {
        max_bytes: 256 * 1024,
        max_width: 2048,
        max_height: 2048,
        max_pixels: 1 << 20,
        max_alloc_bytes: 64 << 20,
    };
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if let Ok((format, bytes)) = std::str::from_utf8(rest)
            .map_err(|_| ())
            .and_then(|uri| parse_data_uri(uri, &limits).map_err(|_| ()))
        {
            let _ = decode(format, bytes, &limits);
        }
    } else {
        let (format, signature) = FORMATS[usize::from(mode / 2) % FORMATS.len()];
        let mut bytes = signature.to_vec();
        bytes.extend_from_slice(rest);
        if format == ImageFormat::Webp {
            // A RIFF length that matches, so the decoder gets past the container.
            let len = u32::try_from(bytes.len() - 8).unwrap_or(u32::MAX);
            bytes[4..8].copy_from_slice(&len.to_le_bytes());
        }
        let _ = decode(format, Bytes::from(bytes), &limits);
    }
}

#[cfg(test)]
mod tests;
