//! Embeds texts exactly as the served text model does, for training and
//! evaluation of its heads.
//!
//! Usage: `cargo run --release --example embed -- IN.jsonl OUT_PREFIX [HEADS.json]`
//! IN.jsonl has one `{"text": "..."}` object per line. Writes
//! `OUT_PREFIX.f32` (little-endian f32, one 384-wide row per chunk) and
//! `OUT_PREFIX.idx` (little-endian u32: the input line of each row). The
//! rows of a text are exactly the chunk embeddings the served heads read
//! for it as an item: one per sentence chunk (the whole text when it fits
//! in `window.tokens`) of each view (raw, and de-obfuscated when that
//! differs). The input form and the chunk settings come from HEADS.json,
//! by default the shipped heads. Models are read from `$MODERATO_MODELS_DIR`
//! or `<repository>/models`. Heads trained on an encoder adapter (a
//! candidate of `train/finetune_encoder.py`) get it from the file
//! `$MODERATO_ENCODER_ADAPTER`.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use moderato::moderation::text::model::{EmbeddingClassifier, SHIPPED_HEADS_JSON};
use moderato::moderation::text::ngrams::SHIPPED_NGRAM_MODEL;

mod texts;
use texts::read_texts;

const CHUNK: usize = 256;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (input, prefix) = match (args.first(), args.get(1)) {
        (Some(i), Some(p)) => (PathBuf::from(i), p.clone()),
        _ => bail!("usage: embed IN.jsonl OUT_PREFIX [HEADS.json]"),
    };
    let heads = match args.get(2) {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
        None => SHIPPED_HEADS_JSON.to_string(),
    };
    let models = moderato::config::repository_models_dir();
    let adapter = read_env_file("MODERATO_ENCODER_ADAPTER")?;
    let ngrams = read_env_file("MODERATO_NGRAM_MODEL")?;
    let model = EmbeddingClassifier::load_with_parts(
        &models,
        &heads,
        adapter.as_deref(),
        ngrams.as_deref().unwrap_or(SHIPPED_NGRAM_MODEL),
    )?;

    let texts = read_texts(&input.to_string_lossy())?;

    let mut vecs = BufWriter::new(std::fs::File::create(format!("{prefix}.f32"))?);
    let mut idx = BufWriter::new(std::fs::File::create(format!("{prefix}.idx"))?);
    for (c, chunk) in texts.chunks(CHUNK).enumerate() {
        let refs: Vec<&str> = chunk.iter().map(String::as_str).collect();
        for (k, windows) in model.embed_windows(&refs)?.into_iter().enumerate() {
            let line = u32::try_from(c * CHUNK + k)?;
            for w in windows {
                for x in w {
                    vecs.write_all(&x.to_le_bytes())?;
                }
                idx.write_all(&line.to_le_bytes())?;
            }
        }
        eprint!("\rembedded {}/{}", (c * CHUNK + chunk.len()), texts.len());
    }
    eprintln!();
    vecs.flush()?;
    idx.flush()?;
    Ok(())
}

/// The file named by the environment variable `name`, if it is set (a
/// candidate encoder adapter or n-gram model in training).
fn read_env_file(name: &str) -> anyhow::Result<Option<Vec<u8>>> {
    match std::env::var_os(name) {
        Some(path) => {
            let path = PathBuf::from(path);
            Ok(Some(std::fs::read(&path).with_context(|| {
                format!("reading {} ({name})", path.display())
            })?))
        }
        None => Ok(None),
    }
}
