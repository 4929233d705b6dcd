//! The fetched model files and their pinned checksums (the same pins as
//! `scripts/fetch-minilm.sh`): a file that is missing or differs by one byte
//! is refused before it reaches the model.

use std::path::Path;

use sha2::{Digest, Sha256};

use super::TextModelError;

/// Folder under the models directory that holds the encoder's files.
pub const MINILM_DIR: &str = "minilm";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFile {
    Config,
    Tokenizer,
    Weights,
}

impl ModelFile {
    pub const fn name(self) -> &'static str {
        match self {
            ModelFile::Config => "config.json",
            ModelFile::Tokenizer => "tokenizer.json",
            ModelFile::Weights => "model.safetensors",
        }
    }

    pub const fn sha256(self) -> &'static str {
        match self {
            ModelFile::Config => "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            ModelFile::Tokenizer => {
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
            }
            ModelFile::Weights => {
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
            }
        }
    }
}

/// Reads `dir/<file>` and checks its sha256.
pub fn read_verified(dir: &Path, file: ModelFile) -> Result<Vec<u8>, TextModelError> {
    read_pinned(dir, file.name(), file.sha256())
}

/// Reads `dir/<name>` and checks it against the pinned `sha256`.
pub fn read_pinned(
    dir: &Path,
    name: &str,
    sha256: &'static str,
) -> Result<Vec<u8>, TextModelError> {
    let path = dir.join(name);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(TextModelError::MissingFile { path })
        }
        Err(source) => return Err(TextModelError::Io { path, source }),
    };
    let actual = hex::encode(Sha256::digest(&bytes));
    if actual != sha256 {
        return Err(TextModelError::ChecksumMismatch {
            path,
            expected: sha256,
            actual,
        });
    }
    Ok(bytes)
}
