use base64::Engine as _;
use image::codecs::gif::GifEncoder;
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::codecs::webp::WebPEncoder;
use image::{ExtendedColorType, ImageEncoder, Rgb, RgbImage, Rgba, RgbaImage};

use super::*;

fn default_limits() -> ImageLimits {
    crate::config::Config::embedded_defaults().limits.image
}

fn gradient(width: u32, height: u32) -> RgbImage {
    RgbImage::from_fn(width, height, |x, y| {
        Rgb([
            (x * 255 / width.max(1)) as u8,
            (y * 255 / height.max(1)) as u8,
            128,
        ])
    })
}

fn png_bytes(img: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

fn jpeg_bytes(img: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 90)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

fn webp_bytes(img: &RgbImage) -> Vec<u8> {
    let mut out = Vec::new();
    WebPEncoder::new_lossless(&mut out)
        .write_image(
            img.as_raw(),
            img.width(),
            img.height(),
            ExtendedColorType::Rgb8,
        )
        .unwrap();
    out
}

fn gif_bytes(frames: &[RgbaImage]) -> Vec<u8> {
    let mut out = Vec::new();
    {
        let mut enc = GifEncoder::new(&mut out);
        for f in frames {
            enc.encode_frame(image::Frame::new(f.clone())).unwrap();
        }
    }
    out
}

fn data_uri(media_type: &str, bytes: &[u8]) -> String {
    format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn parse_and_decode(uri: &str, limits: &ImageLimits) -> Result<DecodedImage, ImageError> {
    let (format, bytes) = parse_data_uri(uri, limits)?;
    decode(format, bytes, limits)
}

fn invalid_message(r: Result<impl std::fmt::Debug, ImageError>) -> String {
    match r {
        Err(ImageError::Invalid(m)) => m,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn too_large_message(r: Result<impl std::fmt::Debug, ImageError>) -> String {
    match r {
        Err(ImageError::TooLarge(m)) => m,
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

/// A PNG chunk with its CRC, so hand-made headers pass the decoder's checksum.
fn png_chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = 0xFFFF_FFFFu32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    let mut crc_input = kind.to_vec();
    crc_input.extend_from_slice(data);
    out.extend_from_slice(&crc32(&crc_input).to_be_bytes());
    out
}

fn png_header_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = Vec::new();
    ihdr.extend_from_slice(&width.to_be_bytes());
    ihdr.extend_from_slice(&height.to_be_bytes());
    ihdr.extend_from_slice(&[8, 6, 0, 0, 0]); // 8-bit RGBA, deflate, adaptive filter, no interlace
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    out.extend(png_chunk(b"IHDR", &ihdr));
    out
}

#[test]
fn decodes_each_accepted_format_to_rgb_of_the_right_size() {
    let img = gradient(40, 30);
    let frame = RgbaImage::from_fn(40, 30, |x, y| {
        let p = img.get_pixel(x, y).0;
        Rgba([p[0], p[1], p[2], 255])
    });
    let cases = [
        ("image/png", png_bytes(&img), ImageFormat::Png),
        ("image/jpeg", jpeg_bytes(&img), ImageFormat::Jpeg),
        ("image/jpg", jpeg_bytes(&img), ImageFormat::Jpeg),
        ("image/webp", webp_bytes(&img), ImageFormat::Webp),
        ("image/gif", gif_bytes(&[frame]), ImageFormat::Gif),
    ];
    for (media_type, bytes, format) in cases {
        let decoded = parse_and_decode(&data_uri(media_type, &bytes), &default_limits())
            .unwrap_or_else(|e| panic!("{media_type}: {e}"));
        assert_eq!(decoded.format, format, "{media_type}");
        assert_eq!((decoded.width, decoded.height), (40, 30), "{media_type}");
        assert_eq!(decoded.rgb.dimensions(), (40, 30), "{media_type}");
        assert_eq!(decoded.encoded.as_ref(), bytes.as_slice(), "{media_type}");
    }
}

#[test]
fn lossless_formats_keep_the_pixels() {
    let img = gradient(17, 9);
    for (media_type, bytes) in [
        ("image/png", png_bytes(&img)),
        ("image/webp", webp_bytes(&img)),
    ] {
        let decoded = parse_and_decode(&data_uri(media_type, &bytes), &default_limits()).unwrap();
        assert_eq!(decoded.rgb, img, "{media_type}");
    }
}

#[test]
fn gif_uses_the_first_frame() {
    let red = RgbaImage::from_pixel(8, 8, Rgba([255, 0, 0, 255]));
    let blue = RgbaImage::from_pixel(8, 8, Rgba([0, 0, 255, 255]));
    let decoded = parse_and_decode(
        &data_uri("image/gif", &gif_bytes(&[red, blue])),
        &default_limits(),
    )
    .unwrap();
    let p = decoded.rgb.get_pixel(4, 4).0;
    assert!(p[0] > 200 && p[2] < 50, "first frame is red, got {p:?}");
}

#[test]
fn transparency_is_composited_on_white() {
    let img = RgbaImage::from_fn(4, 1, |x, _| match x {
        0 => Rgba([0, 0, 0, 0]),     // fully transparent black → white
        1 => Rgba([0, 0, 0, 255]),   // opaque black stays black
        2 => Rgba([0, 0, 0, 128]),   // half → mid grey
        _ => Rgba([255, 0, 0, 255]), // opaque red
    });
    let mut bytes = Vec::new();
    PngEncoder::new(&mut bytes)
        .write_image(img.as_raw(), 4, 1, ExtendedColorType::Rgba8)
        .unwrap();
    let decoded = parse_and_decode(&data_uri("image/png", &bytes), &default_limits()).unwrap();
    assert_eq!(decoded.rgb.get_pixel(0, 0).0, [255, 255, 255]);
    assert_eq!(decoded.rgb.get_pixel(1, 0).0, [0, 0, 0]);
    let grey = decoded.rgb.get_pixel(2, 0).0;
    assert!(grey.iter().all(|&c| (125..=129).contains(&c)), "{grey:?}");
    assert_eq!(decoded.rgb.get_pixel(3, 0).0, [255, 0, 0]);
}

#[test]
fn uri_syntax_errors_say_what_is_wrong() {
    let limits = default_limits();
    let png = png_bytes(&gradient(4, 4));
    let good = data_uri("image/png", &png);
    assert!(parse_data_uri(&good, &limits).is_ok());
    assert!(parse_data_uri(&good.replacen("data:", "DATA:", 1), &limits).is_ok());

    let msg = invalid_message(parse_data_uri("https://example.com/cat.png", &limits));
    assert!(msg.contains("data URI"), "{msg}");
    let msg = invalid_message(parse_data_uri("data:image/png;base64", &limits));
    assert!(msg.contains("','"), "{msg}");
    let msg = invalid_message(parse_data_uri("data:image/png,rawbytes", &limits));
    assert!(msg.contains("base64"), "{msg}");
    let msg = invalid_message(parse_data_uri(
        "data:image/svg+xml;base64,PHN2Zz4=",
        &limits,
    ));
    assert!(
        msg.contains("image/svg+xml") && msg.contains("image/png"),
        "{msg}"
    );
    let msg = invalid_message(parse_data_uri("data:;base64,AAAA", &limits));
    assert!(msg.contains("no media type"), "{msg}");
    let msg = invalid_message(parse_data_uri("data:image/png;base64,", &limits));
    assert!(msg.contains("empty"), "{msg}");
    let msg = invalid_message(parse_data_uri("data:image/png;base64,iVBO*w0K", &limits));
    assert!(
        msg.contains("invalid base64") && msg.contains("offset 4"),
        "{msg}"
    );
    let msg = invalid_message(parse_data_uri("data:image/png;base64,iVBORw0KG", &limits));
    assert!(msg.contains("invalid base64"), "{msg}");
}

#[test]
fn media_type_parameters_are_tolerated() {
    let png = png_bytes(&gradient(4, 4));
    let b64 = base64::engine::general_purpose::STANDARD.encode(&png);
    let (format, bytes) = parse_data_uri(
        &format!("data:image/PNG;name=x.png;base64,{b64}"),
        &default_limits(),
    )
    .unwrap();
    assert_eq!(format, ImageFormat::Png);
    assert_eq!(bytes.as_ref(), png.as_slice());
}

#[test]
fn oversized_base64_is_refused_by_length_before_decoding() {
    let limits = ImageLimits {
        max_bytes: 1000,
        ..default_limits()
    };
    // Not valid base64 at all: a length check that ran after decoding would
    // report the bad character instead.
    let huge = format!("data:image/png;base64,{}", "*".repeat(100 * 1024 * 1024));
    let msg = too_large_message(parse_data_uri(&huge, &limits));
    assert!(msg.contains("1000 bytes"), "{msg}");
}

#[test]
fn decoded_bytes_are_bounded_exactly() {
    let limits = ImageLimits {
        max_bytes: 10,
        ..default_limits()
    };
    let b64 = base64::engine::general_purpose::STANDARD;
    assert_eq!(
        parse_data_uri(
            &format!("data:image/png;base64,{}", b64.encode([7u8; 10])),
            &limits
        )
        .unwrap()
        .1
        .len(),
        10
    );
    // 11 and 12 bytes both encode to 16 characters, the longest 10 bytes can take.
    too_large_message(parse_data_uri(
        &format!("data:image/png;base64,{}", b64.encode([7u8; 11])),
        &limits,
    ));
    too_large_message(parse_data_uri(
        &format!("data:image/png;base64,{}", b64.encode([7u8; 12])),
        &limits,
    ));
    too_large_message(decode(
        ImageFormat::Png,
        Bytes::from(vec![0u8; 11]),
        &limits,
    ));
}

#[test]
fn declared_type_must_match_the_data() {
    let limits = default_limits();
    let png = png_bytes(&gradient(4, 4));
    let msg = invalid_message(parse_and_decode(&data_uri("image/jpeg", &png), &limits));
    assert!(msg.contains("image/jpeg") && msg.contains("PNG"), "{msg}");
    let msg = invalid_message(parse_and_decode(
        &data_uri("image/webp", b"hello, world, not an image"),
        &limits,
    ));
    assert!(msg.contains("WebP signature"), "{msg}");
}

#[test]
fn truncated_and_corrupt_files_are_invalid() {
    let limits = default_limits();
    let img = gradient(64, 64);
    let png = png_bytes(&img);
    for cut in [8, 20, 40, png.len() / 2, png.len() - 13] {
        let msg = invalid_message(decode(
            ImageFormat::Png,
            Bytes::copy_from_slice(&png[..cut]),
            &limits,
        ));
        assert!(msg.contains("PNG"), "cut at {cut}: {msg}");
    }
    let jpeg = jpeg_bytes(&img);
    for cut in [3, 12, 100] {
        invalid_message(decode(
            ImageFormat::Jpeg,
            Bytes::copy_from_slice(&jpeg[..cut]),
            &limits,
        ));
    }
    let webp = webp_bytes(&img);
    invalid_message(decode(
        ImageFormat::Webp,
        Bytes::copy_from_slice(&webp[..webp.len() / 2]),
        &limits,
    ));

    let mut corrupt = png.clone();
    corrupt[16] ^= 0xFF; // inside IHDR: the CRC no longer matches
    let msg = invalid_message(decode(ImageFormat::Png, Bytes::from(corrupt), &limits));
    assert!(
        msg.contains("corrupt") || msg.contains("truncated"),
        "{msg}"
    );
}

#[test]
fn a_header_claiming_huge_dimensions_is_refused_before_decoding() {
    let limits = default_limits();
    let mut png = png_header_claiming(50_000, 50_000);
    // An IDAT of zeros compressed small, as a decompression bomb would carry.
    png.extend(png_chunk(
        b"IDAT",
        &[0x78, 0x9C, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01],
    ));
    png.extend(png_chunk(b"IEND", &[]));
    let msg = too_large_message(decode(ImageFormat::Png, Bytes::from(png), &limits));
    assert!(
        msg.contains("50000×50000") && msg.contains("8192×8192"),
        "{msg}"
    );
}

#[test]
fn pixel_count_and_zero_sizes_are_checked() {
    let limits = ImageLimits {
        max_pixels: 100,
        ..default_limits()
    };
    let msg = too_large_message(decode(
        ImageFormat::Png,
        Bytes::from(png_bytes(&gradient(11, 10))),
        &limits,
    ));
    assert!(
        msg.contains("110 pixels") && msg.contains("100 pixels"),
        "{msg}"
    );
    assert!(decode(
        ImageFormat::Png,
        Bytes::from(png_bytes(&gradient(10, 10))),
        &limits
    )
    .is_ok());

    let mut zero = png_header_claiming(0, 10);
    zero.extend(png_chunk(b"IEND", &[]));
    invalid_message(decode(
        ImageFormat::Png,
        Bytes::from(zero),
        &default_limits(),
    ));
}

#[test]
fn a_decompression_bomb_hits_the_allocation_limit() {
    // 4000×4000 grey zeros compress to a few kilobytes and expand to 16 MB.
    let side = 4000;
    let mut bomb = Vec::new();
    PngEncoder::new(&mut bomb)
        .write_image(
            &vec![0u8; side * side],
            side as u32,
            side as u32,
            ExtendedColorType::L8,
        )
        .unwrap();
    assert!(bomb.len() < 100_000, "the bomb is {} bytes", bomb.len());
    let limits = ImageLimits {
        max_alloc_bytes: 4 * 1024 * 1024,
        ..default_limits()
    };
    let msg = too_large_message(parse_and_decode(&data_uri("image/png", &bomb), &limits));
    assert!(msg.contains("memory"), "{msg}");
    // The same data is fine when the operator allows the memory.
    assert!(decode(ImageFormat::Png, Bytes::from(bomb), &default_limits()).is_ok());
}

#[test]
fn random_bytes_behind_a_valid_signature_never_panic() {
    let limits = default_limits();
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let signatures: [(ImageFormat, &[u8]); 4] = [
        (ImageFormat::Png, b"\x89PNG\r\n\x1a\n"),
        (ImageFormat::Jpeg, &[0xFF, 0xD8, 0xFF]),
        (ImageFormat::Gif, b"GIF89a"),
        (ImageFormat::Webp, b"RIFF\x10\x00\x00\x00WEBPVP8L"),
    ];
    for round in 0..400 {
        let (format, sig) = signatures[round % 4];
        let len = (next() % 300) as usize;
        let mut bytes = sig.to_vec();
        bytes.extend((0..len).map(|_| next() as u8));
        // Any answer is fine except the one `guard_panics` gives for a
        // decoder panic.
        if let Err(ImageError::Invalid(msg)) = decode(format, Bytes::from(bytes), &limits) {
            assert!(
                !msg.contains("decoder failed"),
                "{format:?} round {round}: {msg}"
            );
        }
    }
}

#[test]
fn fuzz_regressions_decode_without_panicking() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images/fuzz");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    for entry in entries.flatten() {
        exercise_untrusted_input(&std::fs::read(entry.path()).unwrap());
    }
}
