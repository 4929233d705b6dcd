//! Normalise + lexical score, and the n-gram layer's logits, for a short
//! message and a 2,000-character text.

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use moderato::moderation::text::ngrams::NgramModel;
use moderato::moderation::text::normalize;
use moderato::moderation::{LexicalClassifier, TextClassifier};

const SHORT: &str = "honestly i will k1ll you if you touch my stuff again, you idiot";

fn long_text() -> String {
    let para = "The committee met on Tuesday to review the quarterly figures. \
        Revenue grew by 4% while costs fell; the killer feature of the new app \
        drove most sign-ups. Some users were upset and one wrote: you are a \
        w0rthless piece of sh!t. Moderators removed it within the hour. ";
    let mut s = String::new();
    while s.len() < 2_000 {
        s.push_str(para);
    }
    s.truncate(2_000);
    s
}

fn bench(c: &mut Criterion) {
    let lc = LexicalClassifier::new();
    let long = long_text();
    c.bench_function("normalize short", |b| {
        b.iter(|| normalize(black_box(SHORT)))
    });
    c.bench_function("normalize 2000 chars", |b| {
        b.iter(|| normalize(black_box(&long)))
    });
    c.bench_function("normalize+score short", |b| {
        b.iter(|| lc.score_batch(black_box(&[SHORT])).map(|v| v.len()))
    });
    c.bench_function("normalize+score 2000 chars", |b| {
        b.iter(|| lc.score_batch(black_box(&[long.as_str()])).map(|v| v.len()))
    });
    c.bench_function("LexicalClassifier::new", |b| b.iter(LexicalClassifier::new));
    let ngrams = NgramModel::shipped();
    let (short, long) = (normalize(SHORT), normalize(&long));
    c.bench_function("ngram logits short", |b| {
        b.iter(|| ngrams.logits(black_box(&short)))
    });
    c.bench_function("ngram logits 2000 chars", |b| {
        b.iter(|| ngrams.logits(black_box(&long)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
