//! Computes the lexical features that the served text model's heads read
//! beside the embedding, for training and evaluation of those heads.
//!
//! Usage: `cargo run --example lexical_features -- IN.jsonl OUT.lex`
//! IN.jsonl has one `{"text": "..."}` object per line. Writes OUT.lex:
//! little-endian f32, one row of `LEXICAL_FEATURES` values per input line.
//! The n-gram logits come from the shipped n-gram model, or from the file
//! `$MODERATO_NGRAM_MODEL` (a candidate of `train/train_ngrams.py`).

use std::io::{BufRead, BufReader, BufWriter, Write};

use anyhow::{bail, Context};
use moderato::moderation::text::model::LexicalFeatures;
use moderato::moderation::text::ngrams::NgramModel;
use moderato::moderation::LexicalClassifier;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match (args.first(), args.get(1)) {
        (Some(i), Some(o)) => (i, o),
        _ => bail!("usage: lexical_features IN.jsonl OUT.lex"),
    };
    let lexical = LexicalClassifier::new();
    let candidate = match std::env::var_os("MODERATO_NGRAM_MODEL") {
        Some(path) => Some(NgramModel::parse(
            &std::fs::read(&path).with_context(|| format!("reading {path:?}"))?,
        )?),
        None => None,
    };
    let ngrams = candidate.as_ref().unwrap_or_else(|| NgramModel::shipped());
    let reader =
        BufReader::new(std::fs::File::open(input).with_context(|| format!("opening {input}"))?);
    let mut out = BufWriter::new(
        std::fs::File::create(output).with_context(|| format!("creating {output}"))?,
    );
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        let value: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("line {}", n + 1))?;
        let Some(text) = value.get("text").and_then(|t| t.as_str()) else {
            bail!("line {} has no \"text\" string", n + 1);
        };
        for x in LexicalFeatures::of(&lexical, ngrams, text).values() {
            out.write_all(&x.to_le_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}
