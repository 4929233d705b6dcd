//! The trained text moderation model: all-MiniLM-L6-v2 sentence embeddings
//! (run in process on the CPU) followed by one calibrated logistic head per
//! category.
//!
//! The encoder's files are fetched by `scripts/fetch-minilm.sh` into
//! `<models_dir>/minilm/` and checksum-verified here at load. The heads are
//! small and versioned with the code: `assets/text-model/heads.json` is
//! compiled into the binary with `include_str!`, so a build can never pair
//! code with heads of another version.
//!
//! Long texts are cut into overlapping token windows; a category's score is
//! its strongest window's, so a threat in the middle of a long benign text is
//! not diluted away.

mod encoder;
mod files;
mod heads;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

pub use encoder::{WindowConfig, EMBEDDING_DIM};
pub use files::MINILM_DIR;
pub use heads::InputKind;

use encoder::MiniLm;
use heads::Heads;

use super::category::{CategoryScores, Thresholds};
use super::classifier::TextClassifier;

/// The shipped heads, thresholds and window settings.
pub const SHIPPED_HEADS_JSON: &str = include_str!("../../../assets/text-model/heads.json");

#[derive(Debug, thiserror::Error)]
pub enum TextModelError {
    #[error("model file {} is missing: run scripts/setup.sh to fetch it", path.display())]
    MissingFile { path: PathBuf },
    #[error(
        "checksum mismatch for {}: expected sha256 {expected}, found {actual}; \
         delete it and run scripts/setup.sh",
        path.display()
    )]
    ChecksumMismatch {
        path: PathBuf,
        expected: &'static str,
        actual: String,
    },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid text model: {0}")]
    Invalid(String),
    #[error("tokenizer failed: {0}")]
    Tokenizer(String),
    #[error("inference failed: {0}")]
    Inference(#[from] candle_core::Error),
}

/// MiniLM embeddings + per-category heads. `Send + Sync`; inference is
/// blocking and CPU-bound.
pub struct EmbeddingClassifier {
    encoder: MiniLm,
    heads: Heads,
}

impl EmbeddingClassifier {
    /// Loads the encoder from `models_dir/minilm/` and the shipped heads.
    pub fn load(models_dir: &Path) -> Result<EmbeddingClassifier, TextModelError> {
        EmbeddingClassifier::load_with_heads(models_dir, SHIPPED_HEADS_JSON)
    }

    /// Like [`EmbeddingClassifier::load`] with other heads (training, tests).
    pub fn load_with_heads(
        models_dir: &Path,
        heads_json: &str,
    ) -> Result<EmbeddingClassifier, TextModelError> {
        let heads = Heads::parse(heads_json)?;
        let encoder = MiniLm::load(&models_dir.join(MINILM_DIR))?;
        Ok(EmbeddingClassifier { encoder, heads })
    }

    /// The version of the heads, e.g. `2026-11-22.1`.
    pub fn version(&self) -> &str {
        &self.heads.version
    }

    /// The window settings of the shipped heads.
    pub fn window(&self) -> WindowConfig {
        self.heads.window
    }

    /// The embeddings of every window of every text (per text, per window),
    /// computed on the same model input as [`EmbeddingClassifier::score`]:
    /// what training and evaluation use so that they see what serving sees.
    pub fn embed_windows(&self, texts: &[&str]) -> Result<Vec<Vec<Vec<f32>>>, TextModelError> {
        let mut windows = Vec::new();
        let mut owner = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let input = self.model_input(text);
            for w in self.encoder.windows(&input, self.heads.window)? {
                windows.push(w);
                owner.push(i);
            }
        }
        let embeddings = self.encoder.embed(&windows)?;
        let mut out = vec![Vec::new(); texts.len()];
        for (i, e) in owner.into_iter().zip(embeddings) {
            out[i].push(e);
        }
        Ok(out)
    }

    /// Calibrated scores, one per text, in order. All windows of all texts
    /// go through the encoder together.
    pub fn score(&self, texts: &[&str]) -> Result<Vec<CategoryScores>, TextModelError> {
        let per_text = self.embed_windows(texts)?;
        Ok(per_text
            .iter()
            .map(|windows| {
                let strongest = windows
                    .iter()
                    .map(|e| self.heads.window_scores(e))
                    .fold(CategoryScores::default(), |acc, s| acc.max_with(&s));
                self.heads.compose(strongest)
            })
            .collect())
    }

    fn model_input<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.heads.input {
            InputKind::Raw => Cow::Borrowed(text),
            InputKind::Normalized => Cow::Owned(normalize_for_model(text)),
        }
    }
}

/// The form of the text the heads were trained on when they say `normalized`.
fn normalize_for_model(text: &str) -> String {
    text.to_string()
}

impl TextClassifier for EmbeddingClassifier {
    fn model_id(&self) -> String {
        format!("minilm-l6-heads-{}", self.heads.version)
    }

    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>> {
        Ok(self.score(texts)?)
    }

    fn default_thresholds(&self) -> Thresholds {
        self.heads.thresholds()
    }
}
