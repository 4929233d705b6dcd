//! Embeds texts with multilingual-e5-small exactly as the service does,
//! for training and evaluating the heads' e5 block: one L2-normalised
//! 384-wide row per scoring window of the text as given (see
//! `E5::windows`; a text of up to 128 tokens is one window).
//!
//! Usage: `cargo run --release --example embed_e5 -- IN.jsonl OUT_PREFIX`
//! IN.jsonl has one `{"text": "..."}` object per line. Writes
//! `OUT_PREFIX.f32` (little-endian f32 rows) and `OUT_PREFIX.idx`
//! (little-endian u32: the input line of each row), as the `embed` example
//! does. The model is read from `$MODERATO_MODELS_DIR/e5` or
//! `<repository>/models/e5`. `E5_LAYERS=n` keeps only the first `n`
//! layers (see `E5::load_layers`); `E5_WINDOW=n` reads scoring windows of
//! `n` framed tokens (see `E5::with_window`); `E5_WEIGHTS=finetuned` reads
//! the fine-tuned file instead of the pinned one (see `E5Weights`).

use std::io::{BufWriter, Write};

use anyhow::{bail, Context};
use moderato::moderation::text::model::e5::{E5Weights, E5, E5_DIR};
use moderato::moderation::Deadline;

mod texts;
use texts::read_texts;

/// Texts per call: enough to fill the encoder's passes.
const CHUNK: usize = 64;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, output) = match (args.first(), args.get(1)) {
        (Some(i), Some(o)) => (i, o),
        _ => bail!("usage: embed_e5 IN.jsonl OUT_PREFIX"),
    };
    let dir = moderato::config::repository_models_dir().join(E5_DIR);
    let layers = match std::env::var("E5_LAYERS") {
        Ok(n) => Some(n.parse().context("E5_LAYERS is a positive number")?),
        Err(_) => None,
    };
    let weights = match std::env::var("E5_WEIGHTS") {
        Ok(w) => w.parse::<E5Weights>()?,
        Err(_) => E5Weights::Pinned,
    };
    let model = E5::open(&dir, weights, layers)?;
    let model = match std::env::var("E5_WINDOW") {
        Ok(n) => model.with_window(n.parse().context("E5_WINDOW is a positive number")?)?,
        Err(_) => model,
    };
    let texts = read_texts(input)?;
    let mut out = BufWriter::new(std::fs::File::create(format!("{output}.f32"))?);
    let mut idx = BufWriter::new(std::fs::File::create(format!("{output}.idx"))?);
    for (c, chunk) in texts.chunks(CHUNK).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        let embedded = model.embed_windows_within(&refs, &Deadline::distant())?;
        for (k, windows) in embedded.into_iter().enumerate() {
            let line = u32::try_from(c * CHUNK + k)?;
            for row in windows {
                for x in row {
                    out.write_all(&x.to_le_bytes())?;
                }
                idx.write_all(&line.to_le_bytes())?;
            }
        }
        eprint!("\re5: {}/{}", c * CHUNK + chunk.len(), texts.len());
    }
    eprintln!();
    out.flush()?;
    idx.flush()?;
    Ok(())
}
