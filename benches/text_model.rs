//! Speed of the text model on the CPU. Needs `models/minilm` (run
//! `scripts/setup.sh`).
//!
//! - `text_model/*`: whole classifier calls, as the engine makes them: one
//!   short text, one 2,000-character text, and 8 mixed real-length texts
//!   (`benches/texts/mixed.jsonl`) with their combined text.
//! - `encoder/*`: the encoder alone on the windows of those 8 texts, next to
//!   a plain f32 sgemm (candle's CPU matmul, the `gemm` crate) of the same
//!   dense shapes in the same run. Throughput is in floating-point
//!   operations, so Criterion's `Gelem/s` reads as GFLOP/s.

use candle_core::{Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use moderato::moderation::text::model::EmbeddingClassifier;
use moderato::moderation::{Deadline, TextClassifier};

fn load() -> EmbeddingClassifier {
    // The service's setting, so that one machine can measure each kernel it
    // runs: MODERATO_TEXT_MODEL__CPU_KERNEL=avx2 (or avxvnni, avx512vnni, ...).
    let choice = int8_matmul::KernelChoice::from_env("MODERATO_TEXT_MODEL__CPU_KERNEL")
        .unwrap_or_else(|e| panic!("MODERATO_TEXT_MODEL__CPU_KERNEL: {e}"));
    if let Err(e) = int8_matmul::choose_kernel(choice) {
        panic!("MODERATO_TEXT_MODEL__CPU_KERNEL: {e}");
    }
    eprintln!("int8 kernel: {}", int8_matmul::kernel_name());
    let dir = moderato::config::repository_models_dir();
    match EmbeddingClassifier::load(&dir) {
        Ok(m) => m,
        Err(e) => panic!("cannot load the text model ({e}); run scripts/setup.sh"),
    }
}

/// The benchmark's texts: people's writing of mixed lengths, written for
/// the project (median about 340 characters, a tenth over 1,500).
pub fn mixed_texts() -> Vec<String> {
    include_str!("texts/mixed.jsonl")
        .lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).expect("benches/texts/mixed.jsonl");
            v["text"].as_str().expect("a text field").to_string()
        })
        .collect()
}

fn long_text() -> String {
    let sentence = "The council approved the new cycling lanes after a long debate about parking, \
                    deliveries and the safety of children walking to school. ";
    sentence.repeat(2000 / sentence.len() + 1)[..2000].to_string()
}

fn classifier(c: &mut Criterion, model: &EmbeddingClassifier) {
    let short = "You are an idiot and I will find you.";
    c.bench_function("text_model/short_single", |b| {
        b.iter(|| model.score_batch(&[short]).unwrap())
    });

    let long = long_text();
    c.bench_function("text_model/2000_chars", |b| {
        b.iter(|| model.score_batch(&[long.as_str()]).unwrap())
    });

    let items: Vec<String> = mixed_texts().into_iter().take(8).collect();
    let chars: usize = items.iter().map(|t| t.chars().count()).sum();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    let mut group = c.benchmark_group("text_model");
    group.throughput(Throughput::Elements(chars as u64));
    // What the engine does for a request of 8 items: each item and the
    // combined text, from one encoder call (items' chunks + boundary chunks).
    group.bench_function("8_mixed_with_combined", |b| {
        b.iter(|| model.score_items(&refs, &Deadline::distant()).unwrap())
    });
    group.bench_function("8_mixed_one_per_call", |b| {
        b.iter(|| {
            for t in &items {
                model.score_batch(&[t.as_str()]).unwrap();
            }
        })
    });
    group.finish();
}

/// The dense products of one forward pass over `tokens` tokens, in f32:
/// (tokens x 384) times the qkv, attention-output, intermediate and output
/// weights, six layers.
fn sgemm_shapes(tokens: usize) -> Vec<(Tensor, Tensor)> {
    let dev = Device::Cpu;
    let rand = |r: usize, c: usize| Tensor::rand(-1f32, 1f32, (r, c), &dev).unwrap();
    [(384, 1152), (384, 384), (384, 1536), (1536, 384)]
        .iter()
        .map(|&(k, n)| (rand(tokens, k), rand(n, k)))
        .collect()
}

fn encoder(c: &mut Criterion, model: &EmbeddingClassifier) {
    let items: Vec<String> = mixed_texts().into_iter().take(8).collect();
    let windows: Vec<Vec<u32>> = items
        .iter()
        .flat_map(|t| model.token_windows(t).unwrap())
        .collect();
    let tokens: usize = windows.iter().map(Vec::len).sum();
    let flops = model.encoder_flops(&windows);
    let mut group = c.benchmark_group("encoder");
    group.throughput(Throughput::Elements(flops as u64));
    group.bench_function(format!("{}_windows_{tokens}_tokens", windows.len()), |b| {
        b.iter(|| model.embed_token_windows(&windows).unwrap())
    });

    let shapes = sgemm_shapes(tokens);
    let dense_flops: f64 = 6.0
        * shapes
            .iter()
            .map(|(x, w)| 2.0 * (x.dims()[0] * x.dims()[1] * w.dims()[0]) as f64)
            .sum::<f64>();
    group.throughput(Throughput::Elements(dense_flops as u64));
    group.bench_function(format!("sgemm_same_dense_shapes_{tokens}_tokens"), |b| {
        b.iter(|| {
            for _layer in 0..6 {
                for (x, w) in &shapes {
                    x.matmul(&w.t().unwrap()).unwrap();
                }
            }
        })
    });
    group.finish();
}

fn bench(c: &mut Criterion) {
    let model = load();
    encoder(c, &model);
    classifier(c, &model);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
