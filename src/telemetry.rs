//! Logging: human-readable or JSON lines on standard error (standard output
//! is for the CLI's results).

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber; the filter comes from `MODERATO_LOG`
/// (default `info`). Safe to call more than once.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_env("MODERATO_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.try_init(),
    };
}
