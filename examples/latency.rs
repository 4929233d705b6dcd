//! Time of one text through the text classifier, in process: the figure to
//! hold against the service's end-to-end latency for the same text
//! (`benches/load.sh`), so that what the service adds around the model shows.
//!
//! Usage: `cargo run --release --example latency -- [RUNS] [TEXT]`
//! (`MODERATO_TEXT_MODEL__CPU_KERNEL=avx2`, `avxvnni`, ... forces one kernel,
//! to measure each on one machine). Prints the median and the 90th and 99th
//! percentiles of RUNS calls (default 300) after 30 warm-up calls.
//! `MODERATO_TEXT_HEADS=FILE` times other heads than the shipped ones with
//! the same binary (heads of before a change, say);
//! `MODERATO_TEXT_MODEL__SECOND_STAGE=true` the shipped second stage (e5
//! reads again what the first stage finds suspect). TEXT `@mixed` times
//! `benches/texts/mixed.jsonl`, one text a call, and prints characters per
//! second of RUNS passes over them (the median pass).

use std::time::Instant;

use moderato::moderation::text::model::EmbeddingClassifier;
use moderato::moderation::TextClassifier;

/// The text of `benches/load.sh`'s `short` workload.
const LOAD_SH_SHORT: &str = "Thanks for the quick reply, see you at the meeting tomorrow!";

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runs: usize = match args.first() {
        Some(n) => n.parse()?,
        None => 300,
    };
    let text = args.get(1).map_or(LOAD_SH_SHORT, String::as_str);
    let choice = int8_matmul::KernelChoice::from_env("MODERATO_TEXT_MODEL__CPU_KERNEL")
        .map_err(|e| anyhow::anyhow!("MODERATO_TEXT_MODEL__CPU_KERNEL: {e}"))?;
    int8_matmul::choose_kernel(choice)
        .map_err(|e| anyhow::anyhow!("MODERATO_TEXT_MODEL__CPU_KERNEL: {e}"))?;
    let dir = moderato::config::repository_models_dir();
    let second_stage =
        std::env::var("MODERATO_TEXT_MODEL__SECOND_STAGE").is_ok_and(|v| v == "true");
    let model = match std::env::var_os("MODERATO_TEXT_HEADS") {
        Some(path) => EmbeddingClassifier::load_with_heads(&dir, &std::fs::read_to_string(path)?)?,
        None => EmbeddingClassifier::load_shipped(&dir, second_stage)?,
    };
    if text == "@mixed" {
        return mixed(&model, runs);
    }
    let windows = model.embed_windows(&[text])?;
    println!(
        "heads {}, kernel {}, {} chunk(s) for {:?}",
        model.version(),
        int8_matmul::kernel_name(),
        windows[0].len(),
        text
    );
    for _ in 0..30 {
        model.score_batch(&[text])?;
    }
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let started = Instant::now();
            model
                .score_batch(&[text])
                .map(|_| started.elapsed().as_secs_f64() * 1e3)
        })
        .collect::<anyhow::Result<_>>()?;
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    println!(
        "{runs} calls: p50 {:.2} ms, p90 {:.2} ms, p99 {:.2} ms",
        at(0.5),
        at(0.9),
        at(0.99)
    );
    Ok(())
}

/// Characters per second over the mixed texts, one text a call: the median
/// of `runs` passes after one warm-up pass.
fn mixed(model: &EmbeddingClassifier, runs: usize) -> anyhow::Result<()> {
    let texts: Vec<String> = include_str!("../benches/texts/mixed.jsonl")
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line)?;
            Ok(v["text"].as_str().unwrap_or_default().to_string())
        })
        .collect::<anyhow::Result<_>>()?;
    let chars: usize = texts.iter().map(|t| t.chars().count()).sum();
    let pass = || -> anyhow::Result<f64> {
        let started = Instant::now();
        for t in &texts {
            model.score_batch(&[t.as_str()])?;
        }
        Ok(started.elapsed().as_secs_f64())
    };
    pass()?;
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| pass())
        .collect::<anyhow::Result<_>>()?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "heads {}, kernel {}: {} texts ({chars} chars) one a call, median of {} passes {:.1} ms: {:.0} chars/s",
        model.version(),
        int8_matmul::kernel_name(),
        texts.len(),
        times.len(),
        median * 1e3,
        chars as f64 / median
    );
    Ok(())
}
