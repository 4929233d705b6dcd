//! Latency of the text model on the CPU: one short text, one 2,000-character
//! text (several windows), and a 16-item request scored together with its two
//! combined texts (items joined with "\n" and with no separator), as the
//! engine does. Needs `models/minilm` (run `scripts/setup.sh`).

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use moderato::moderation::text_model::EmbeddingClassifier;
use moderato::moderation::TextClassifier;

fn load() -> EmbeddingClassifier {
    let dir = std::env::var_os("MODERATO_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models"));
    match EmbeddingClassifier::load(&dir) {
        Ok(m) => m,
        Err(e) => panic!("cannot load the text model ({e}); run scripts/setup.sh"),
    }
}

fn long_text() -> String {
    let sentence = "The council approved the new cycling lanes after a long debate about parking, \
                    deliveries and the safety of children walking to school. ";
    sentence.repeat(2000 / sentence.len() + 1)[..2000].to_string()
}

fn bench(c: &mut Criterion) {
    let model = load();
    let short = "You are an idiot and I will find you.";
    c.bench_function("text_model/short_single", |b| {
        b.iter(|| model.score_batch(&[short]).unwrap())
    });

    let long = long_text();
    c.bench_function("text_model/2000_chars", |b| {
        b.iter(|| model.score_batch(&[long.as_str()]).unwrap())
    });

    let items: Vec<String> = (0..16)
        .map(|i| format!("Message number {i}: thanks for the update, see you at the meeting."))
        .collect();
    let refs: Vec<&str> = items.iter().map(String::as_str).collect();
    c.bench_function("text_model/batch_16", |b| {
        b.iter(|| model.score_batch(&refs).unwrap())
    });

    let joined_nl = items.join("\n");
    let joined = items.concat();
    let mut with_combined = refs.clone();
    with_combined.push(&joined_nl);
    with_combined.push(&joined);
    c.bench_function("text_model/batch_16_plus_combined", |b| {
        b.iter(|| model.score_batch(&with_combined).unwrap())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = bench
}
criterion_main!(benches);
