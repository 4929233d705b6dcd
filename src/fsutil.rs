//! Small file helpers for secrets the service creates on first start.

use std::io::Write;
use std::path::Path;

/// Writes `contents` to a new file readable by its owner only, creating the
/// parent folder. Fails if the file already exists, so that two replicas
/// starting together never overwrite each other's secret.
pub fn write_secret_file(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}
