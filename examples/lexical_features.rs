//! Computes the lexical features that the served text model's heads read
//! beside the embedding, for training and evaluation of those heads.
//!
//! Usage: `cargo run --example lexical_features -- IN.jsonl OUT.lex`
//! IN.jsonl has one `{"text": "..."}` object per line. Writes OUT.lex:
//! little-endian f32, one row of `LEXICAL_FEATURES` values per input line.

use std::io::{BufRead, BufReader, BufWriter, Write};

use anyhow::{bail, Context};
use moderato::moderation::text::model::LexicalFeatures;
use moderato::moderation::LexicalClassifier;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match (args.first(), args.get(1)) {
        (Some(i), Some(o)) => (i, o),
        _ => bail!("usage: lexical_features IN.jsonl OUT.lex"),
    };
    let lexical = LexicalClassifier::new();
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
        for x in LexicalFeatures::of(&lexical, text).values() {
            out.write_all(&x.to_le_bytes())?;
        }
    }
    out.flush()?;
    Ok(())
}
