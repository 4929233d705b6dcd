//! The terms of the n-gram model for each text, for `train/train_ngrams.py`
//! (which trains the model on exactly what serving counts).
//!
//! Usage: `cargo run --example ngram_terms -- IN.jsonl OUT.terms [--windows wide|narrow]`
//! IN.jsonl has one `{"text": "..."}` object per line. Writes OUT.terms:
//! little-endian u32 triples (row, term hash, count | block << 31), one per
//! distinct term of a row, rows in order. A row is an input line's whole
//! text (what the model is fitted on), or with `--windows` one of the
//! windows (`ngrams::WIDE` or `ngrams::NARROW`) the model scores a text by
//! (`ngrams::for_each_window`); then
//! OUT.terms.owner holds, per row, its input line (little-endian u32).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};

use anyhow::{bail, Context};
use moderato::moderation::text::ngrams::{for_each_term_of, for_each_window, NARROW, WIDE};
use moderato::moderation::text::normalize;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: ngram_terms IN.jsonl OUT.terms [--windows wide|narrow]";
    let (input, output, windows) = match args.as_slice() {
        [i, o] => (i, o, None),
        [i, o, flag, cut] if flag == "--windows" => match cut.as_str() {
            "wide" => (i, o, Some(WIDE)),
            "narrow" => (i, o, Some(NARROW)),
            _ => bail!(usage),
        },
        _ => bail!(usage),
    };
    let reader =
        BufReader::new(std::fs::File::open(input).with_context(|| format!("opening {input}"))?);
    let mut out = BufWriter::new(
        std::fs::File::create(output).with_context(|| format!("creating {output}"))?,
    );
    let mut owners = Vec::new();
    let mut counts: HashMap<(u32, u32), u32> = HashMap::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line?;
        let value: serde_json::Value =
            serde_json::from_str(&line).with_context(|| format!("line {}", n + 1))?;
        let Some(text) = value.get("text").and_then(|t| t.as_str()) else {
            bail!("line {} has no \"text\" string", n + 1);
        };
        let line_no = u32::try_from(n).context("too many lines")?;
        let normalized = normalize(text);
        let mut rows: Vec<Vec<&str>> = Vec::new();
        if let Some(cut) = windows {
            for_each_window(&normalized, cut, |w| rows.push(w.to_vec()));
        } else {
            rows.push(moderato::moderation::text::ngrams::words(&normalized));
        }
        for words in rows {
            let row = u32::try_from(owners.len()).context("too many rows")?;
            owners.push(line_no);
            counts.clear();
            for_each_term_of(&words, |block, hash| {
                *counts.entry((block as u32, hash)).or_insert(0) += 1;
            });
            let mut terms: Vec<_> = counts.iter().collect();
            terms.sort_unstable();
            for (&(block, hash), &count) in terms {
                for x in [row, hash, count.min(0x7fff_ffff) | (block << 31)] {
                    out.write_all(&x.to_le_bytes())?;
                }
            }
        }
    }
    out.flush()?;
    if windows.is_some() {
        let bytes: Vec<u8> = owners.iter().flat_map(|o| o.to_le_bytes()).collect();
        std::fs::write(format!("{output}.owner"), bytes)?;
    }
    Ok(())
}
