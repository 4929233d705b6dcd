//! Scores texts exactly as the served text path does (first stage, the
//! language check and, with an e5 block, the second stage), for evaluating
//! a heads file on sets whose scoring depends on more than embeddings (the
//! multilingual ones: which texts e5 reads depends on their language).
//!
//! Usage: `cargo run --example score -- HEADS.json IN.jsonl OUT.jsonl`
//! IN.jsonl has one `{"text": "..."}` object per line; OUT.jsonl gets one
//! `{"scores": {category: score}, "language": "de" | null}` per input line,
//! in order. Models are read from `$MODERATO_MODELS_DIR` or
//! `<repository>/models`. `$MODERATO_NGRAM_MODEL` names a candidate n-gram
//! model (`train/train_ngrams.py`'s output) to use in place of the one built
//! into the binary, so that heads trained beside a new n-gram model are
//! scored without rebuilding.

use std::io::{BufWriter, Write};

use anyhow::{bail, Context};
use moderato::moderation::text::language;
use moderato::moderation::text::model::EmbeddingClassifier;
use moderato::moderation::{Deadline, TextClassifier};

mod texts;
use texts::read_texts;

/// Texts scored per call: the encoders batch within a call.
const CHUNK: usize = 64;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [heads, input, output] = args.as_slice() else {
        bail!("usage: score HEADS.json IN.jsonl OUT.jsonl");
    };
    let heads = std::fs::read_to_string(heads).with_context(|| format!("reading {heads}"))?;
    let models_dir = moderato::config::repository_models_dir();
    let model = match std::env::var_os("MODERATO_NGRAM_MODEL") {
        Some(path) => {
            let ngrams = std::fs::read(&path)
                .with_context(|| format!("reading {}", path.to_string_lossy()))?;
            EmbeddingClassifier::load_with_parts(&models_dir, &heads, None, &ngrams)?
        }
        None => EmbeddingClassifier::load_with_heads(&models_dir, &heads)?,
    };
    let texts = read_texts(input)?;
    let mut out = BufWriter::new(
        std::fs::File::create(output).with_context(|| format!("creating {output}"))?,
    );
    for (c, chunk) in texts.chunks(CHUNK).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let scores = model.score_batch_within(&refs, &Deadline::distant())?;
        for (text, s) in refs.iter().zip(scores) {
            let map: serde_json::Map<String, serde_json::Value> = s
                .iter()
                .map(|(c, v)| (c.as_str().to_owned(), serde_json::Value::from(v)))
                .collect();
            let language = language::detect(text).language().map(|l| l.code());
            writeln!(
                out,
                "{}",
                serde_json::json!({"scores": map, "language": language})
            )?;
        }
        eprint!("\rscored {}/{}", c * CHUNK + chunk.len(), texts.len());
    }
    eprintln!();
    out.flush()?;
    Ok(())
}
