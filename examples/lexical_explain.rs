//! Reads texts, one per line, from standard input and prints, per line, the
//! lexical scores above 0, the categories flagged at the default thresholds
//! and the matched terms. For tuning the term lists:
//!
//!     cargo run --example lexical_explain < sentences.txt

use std::io::{self, BufRead, Write};

use moderato::moderation::text::normalize;
use moderato::moderation::{Category, LexicalClassifier};

fn main() -> io::Result<()> {
    let lc = LexicalClassifier::new();
    let thresholds = lc.default_thresholds();
    let stdout = io::stdout();
    let mut out = stdout.lock();
    for line in io::stdin().lock().lines() {
        let line = line?;
        let normalized = normalize(&line);
        let scores = lc.features(&normalized);
        let decided = thresholds.decide(&scores);
        let flagged: Vec<&str> = Category::ALL
            .into_iter()
            .filter(|c| decided[c.index()])
            .map(Category::as_str)
            .collect();
        let terms: Vec<String> = lc
            .explain(&normalized)
            .into_iter()
            .map(|m| {
                let cat = m.category.map_or(m.kind, Category::as_str);
                format!("{}={}:{}", cat, m.term, m.weight)
            })
            .collect();
        writeln!(
            out,
            "{}\t{}\t{}",
            flagged.join(","),
            terms.join(" | "),
            line
        )?;
    }
    Ok(())
}
