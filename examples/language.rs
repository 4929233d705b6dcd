//! Prints what the language detector makes of each text, for choosing its
//! bounds: `cargo run --example language -- IN.jsonl` reads
//! `{"text": ...}` lines and prints one JSON line each with whatlang's
//! unfiltered answer (ISO 639-3, confidence, script) and the service's
//! (the language it reports and the route it takes).

use std::io::{BufRead, BufReader};

use moderato::moderation::text::language;

fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("usage: language IN.jsonl"))?;
    for line in BufReader::new(std::fs::File::open(path)?).lines() {
        let value: serde_json::Value = serde_json::from_str(&line?)?;
        let text = value["text"].as_str().unwrap_or_default();
        let info = whatlang::detect(text);
        let served = language::detect(text);
        println!(
            "{}",
            serde_json::json!({
                "lang": info.as_ref().map(|i| i.lang().code()),
                "confidence": info.as_ref().map(|i| i.confidence()),
                "script": info.as_ref().map(|i| format!("{:?}", i.script())),
                "served": served.language().map(|l| l.code()),
                "route": format!("{:?}", served.route),
            })
        );
    }
    Ok(())
}
