use super::*;

fn lcg(seed: u64) -> impl FnMut() -> f32 {
    let mut s = seed;
    move || {
        s = s
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((s >> 40) as f32) / ((1u64 << 24) as f32) - 0.5
    }
}

/// The textbook definition, index by index, for checking the fast loops.
fn naive_depthwise(
    src: &[f32],
    (h, w): (usize, usize),
    k: &[f32; 9],
    stride: usize,
    pad: usize,
    (ho, wo): (usize, usize),
) -> Vec<f32> {
    let mut out = vec![0f32; ho * wo];
    for oy in 0..ho {
        for ox in 0..wo {
            let mut acc = 0f32;
            for ky in 0..3 {
                for kx in 0..3 {
                    let iy = (oy * stride + ky) as isize - pad as isize;
                    let ix = (ox * stride + kx) as isize - pad as isize;
                    if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < w {
                        acc += k[ky * 3 + kx] * src[iy as usize * w + ix as usize];
                    }
                }
            }
            out[oy * wo + ox] = acc;
        }
    }
    out
}

#[test]
fn depthwise_loops_match_the_definition() {
    let mut rand = lcg(7);
    for (h, w, stride, pad) in [(8, 8, 1, 1), (7, 9, 1, 1), (8, 8, 2, 0), (14, 10, 2, 0)] {
        let src: Vec<f32> = (0..h * w).map(|_| rand()).collect();
        let k: [f32; 9] = std::array::from_fn(|_| rand());
        let (ho, wo) = if stride == 1 {
            (h, w)
        } else {
            ((h - 2) / 2 + 1, (w - 2) / 2 + 1)
        };
        let mut fast = vec![0f32; ho * wo];
        depthwise_plane(&src, (h, w), &mut fast, (ho, wo), &k, stride, pad);
        let slow = naive_depthwise(&src, (h, w), &k, stride, pad, (ho, wo));
        for (a, b) in fast.iter().zip(&slow) {
            assert!((a - b).abs() < 1e-5, "{h}×{w} stride {stride}: {a} vs {b}");
        }
    }
}

#[test]
fn resize_with_aligned_corners_keeps_corners_and_interpolates_between() {
    // 2×2 → 3×3: corners copied, centre is the mean of the four.
    let src = [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0];
    let out = resize_bilinear_align_corners(&src, (2, 2), (3, 3));
    let at = |y: usize, x: usize| out[(y * 3 + x) * 3];
    assert_eq!(
        [at(0, 0), at(0, 2), at(2, 0), at(2, 2)],
        [0.0, 1.0, 2.0, 3.0]
    );
    assert!((at(1, 1) - 1.5).abs() < 1e-6);
    assert!((at(0, 1) - 0.5).abs() < 1e-6);
    assert!((at(1, 0) - 1.0).abs() < 1e-6);
}

#[test]
fn preprocess_scales_to_unit_range_and_resizes_to_the_input_size() {
    let img = image::RgbImage::from_fn(300, 100, |x, _| image::Rgb([255, (x % 256) as u8, 0]));
    let input = preprocess(&img);
    assert_eq!(input.len(), INPUT_SIZE * INPUT_SIZE * 3);
    assert!(input.iter().all(|v| (0.0..=1.0).contains(v)));
    assert!(input
        .chunks(3)
        .all(|p| (p[0] - 1.0).abs() < 1e-6 && p[2] == 0.0));

    let square = image::RgbImage::from_pixel(224, 224, image::Rgb([51, 102, 255]));
    let input = preprocess(&square);
    assert!((input[0] - 0.2).abs() < 1e-6 && (input[1] - 0.4).abs() < 1e-6 && input[2] == 1.0);
}

#[test]
fn sexual_counts_explicit_classes_fully_and_suggestive_in_part() {
    let neutral = [0.1, 0.0, 0.9, 0.0, 0.0];
    assert!(sexual_score(&neutral) < 0.01);
    let explicit = [0.0, 0.0, 0.1, 0.9, 0.0];
    assert!(sexual_score(&explicit) >= DEFAULT_SEXUAL_THRESHOLD);
    let drawn = [0.2, 0.7, 0.1, 0.0, 0.0];
    assert!(sexual_score(&drawn) >= DEFAULT_SEXUAL_THRESHOLD);
    let suggestive = [0.0, 0.0, 0.0, 0.0, 1.0];
    assert!(sexual_score(&suggestive) < DEFAULT_SEXUAL_THRESHOLD);
    let split = [0.0, 0.0, 0.2, 0.4, 0.4];
    assert!(sexual_score(&split) >= DEFAULT_SEXUAL_THRESHOLD);
}

#[test]
fn softmax_is_a_distribution_and_stable_for_large_logits() {
    let p = softmax5(&[1000.0, 0.0, -1000.0, 999.0, 0.0]);
    assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
    assert!(p[0] > p[3] && p[3] > 0.2 && p[2] == 0.0);
}

#[test]
fn missing_weights_name_the_file_and_the_setup_script() {
    let dir = tempfile::tempdir().unwrap();
    let err = NsfwClassifier::load(dir.path())
        .err()
        .expect("no weights there");
    assert!(matches!(err, NsfwError::Missing { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("mobilenet_v2.safetensors") && msg.contains("scripts/setup.sh"),
        "{msg}"
    );
}

#[test]
fn corrupt_or_foreign_weights_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(WEIGHTS_FILE);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();

    std::fs::write(&path, b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!").unwrap();
    let msg = NsfwClassifier::load(dir.path())
        .err()
        .expect("garbage")
        .to_string();
    assert!(
        msg.contains("mobilenet_v2.safetensors") && msg.contains("setup.sh"),
        "{msg}"
    );

    // A valid safetensors file holding some other model.
    let other = Tensor::zeros((3, 3), DType::F32, &Device::Cpu).unwrap();
    candle_core::safetensors::save(&HashMap::from([("dense/kernel".to_owned(), other)]), &path)
        .unwrap();
    let msg = NsfwClassifier::load(dir.path())
        .err()
        .expect("wrong model")
        .to_string();
    assert!(msg.contains("Conv1/kernel is missing"), "{msg}");
}
