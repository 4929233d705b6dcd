//! The examples' input: JSON lines of `{"text": "..."}`, as training and
//! evaluation write them.

use std::io::{BufRead, BufReader};

use anyhow::{bail, Context};

/// Every line's `text`, in order; an error names the line that has none.
pub fn read_texts(path: &str) -> anyhow::Result<Vec<String>> {
    let reader =
        BufReader::new(std::fs::File::open(path).with_context(|| format!("opening {path}"))?);
    let mut texts = Vec::new();
    for (n, line) in reader.lines().enumerate() {
        let value: serde_json::Value =
            serde_json::from_str(&line?).with_context(|| format!("line {}", n + 1))?;
        match value.get("text").and_then(|t| t.as_str()) {
            Some(t) => texts.push(t.to_string()),
            None => bail!("line {} has no \"text\" string", n + 1),
        }
    }
    Ok(texts)
}
