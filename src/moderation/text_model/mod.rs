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

mod bert;
mod cache;
mod deobfuscate;
mod encoder;
mod files;
mod heads;

use std::borrow::Cow;
use std::path::{Path, PathBuf};

pub use encoder::{WindowConfig, EMBEDDING_DIM};
pub use files::MINILM_DIR;
pub use heads::{InputKind, LexicalFeatures, LEXICAL_FEATURES};

use encoder::MiniLm;
use heads::Heads;

use super::category::{CategoryScores, Thresholds};
use super::classifier::{EmbeddingCacheStats, TextClassifier};
use super::lexical::LexicalClassifier;

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

/// MiniLM embeddings and lexical features + per-category heads.
/// `Send + Sync`; inference is blocking and CPU-bound.
pub struct EmbeddingClassifier {
    encoder: MiniLm,
    heads: Heads,
    lexical: LexicalClassifier,
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
        Ok(EmbeddingClassifier {
            encoder,
            heads,
            lexical: LexicalClassifier::new(),
        })
    }

    /// Keeps up to `entries` window embeddings across calls (none with 0,
    /// the default): repeated sentences then skip the encoder.
    pub fn with_embedding_cache(mut self, entries: usize) -> EmbeddingClassifier {
        self.encoder.set_cache(entries);
        self
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
            for input in self.model_inputs(text) {
                let whole = self.encoder.windows(&input, self.heads.window)?;
                let long =
                    whole.len() > 1 || whole.iter().any(|w| w.len() > SENTENCE_VIEW_MIN_TOKENS);
                let n = windows.len();
                windows.extend(whole);
                if long {
                    for sentence in sentences(&input) {
                        windows.extend(self.encoder.windows(sentence, self.heads.window)?);
                    }
                }
                owner.resize(windows.len(), i);
                debug_assert!(owner.len() >= n);
            }
        }
        let embeddings = self.encoder.embed(&windows)?;
        let mut out = vec![Vec::new(); texts.len()];
        for (i, e) in owner.into_iter().zip(embeddings) {
            out[i].push(e);
        }
        Ok(out)
    }

    /// The token windows the encoder sees for `text` (benchmarks).
    pub fn token_windows(&self, text: &str) -> Result<Vec<Vec<u32>>, TextModelError> {
        let mut out = Vec::new();
        for input in self.model_inputs(text) {
            out.extend(self.encoder.windows(&input, self.heads.window)?);
        }
        Ok(out)
    }

    /// Embeddings of token windows, straight through the encoder (and its
    /// cache, if any): for benchmarks of the encoder alone.
    pub fn embed_token_windows(
        &self,
        windows: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>, TextModelError> {
        self.encoder.embed(windows)
    }

    /// The floating-point operations an f32 encoder does for `windows`
    /// (two per multiply-add), to report the achieved rate.
    pub fn encoder_flops(&self, windows: &[Vec<u32>]) -> f64 {
        let lens: Vec<usize> = windows.iter().map(Vec::len).collect();
        self.encoder.flops(&lens)
    }

    /// Calibrated scores, one per text, in order. All windows of all texts
    /// go through the encoder together.
    pub fn score(&self, texts: &[&str]) -> Result<Vec<CategoryScores>, TextModelError> {
        let per_text = self.embed_windows(texts)?;
        Ok(per_text
            .iter()
            .zip(texts)
            .map(|(windows, text)| {
                let lexical = LexicalFeatures::of(&self.lexical, text);
                let strongest = windows
                    .iter()
                    .map(|e| self.heads.window_scores(e, &lexical))
                    .fold(CategoryScores::default(), |acc, s| acc.max_with(&s));
                self.heads.compose(strongest)
            })
            .collect())
    }

    /// The texts the encoder sees for `text`: the heads' input form, plus
    /// the de-obfuscated form when the heads read raw text and normalising
    /// changed more than letter case (`k i l l`, `s.u.i.c.i.d.e`, look-alikes),
    /// so evasion cannot hide a word the model knows. Ordinary text costs
    /// one pass.
    fn model_inputs<'a>(&self, text: &'a str) -> Vec<Cow<'a, str>> {
        match self.heads.input {
            InputKind::Raw => vec![Cow::Borrowed(text)],
            InputKind::Normalized => vec![Cow::Owned(normalize_for_model(text))],
            InputKind::Both => {
                let mut views = vec![Cow::Borrowed(text)];
                let normalized = normalize_for_model(text);
                // Elongations: the intended length of `kiiiill` is unknown.
                let single = deobfuscate::normalize_single_repeats(text);
                if single != normalized && changed_beyond_case(text, &single) {
                    views.push(Cow::Owned(single));
                }
                if changed_beyond_case(text, &normalized) {
                    views.push(Cow::Owned(normalized));
                }
                views
            }
        }
    }
}

/// Texts longer than this many tokens are also read sentence by sentence:
/// mean pooling over a long window averages one harmful sentence away (a
/// threat inside a page of minutes), while the heads judge a lone sentence
/// well, having been trained mostly on short texts.
const SENTENCE_VIEW_MIN_TOKENS: usize = 64;

/// The distinct sentences (and lines) of a text with at least three words.
fn sentences(text: &str) -> Vec<&str> {
    let mut seen = std::collections::HashSet::new();
    text.split(['.', '!', '?', '\n', ';'])
        .map(str::trim)
        .filter(|s| s.split_whitespace().nth(2).is_some())
        .filter(|s| seen.insert(*s))
        .collect()
}

/// Whether normalising did more than fold case and whitespace.
fn changed_beyond_case(raw: &str, normalized: &str) -> bool {
    let folded = raw.split_whitespace().map(str::to_lowercase);
    !folded.eq(normalized.split_whitespace().map(str::to_string))
}

/// The de-obfuscated form of a text (see [`deobfuscate`]).
fn normalize_for_model(text: &str) -> String {
    deobfuscate::normalize(text)
}

impl TextClassifier for EmbeddingClassifier {
    fn model_id(&self) -> String {
        format!("minilm-l6-heads-{}", self.heads.version)
    }

    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>> {
        let scores = self.score(texts)?;
        if let Some(stats) = self.embedding_cache_stats() {
            tracing::debug!(
                hits = stats.hits,
                misses = stats.misses,
                entries = stats.entries,
                "embedding cache"
            );
        }
        Ok(scores)
    }

    fn default_thresholds(&self) -> Thresholds {
        self.heads.thresholds()
    }

    fn embedding_cache_stats(&self) -> Option<EmbeddingCacheStats> {
        self.encoder.cache().map(|c| c.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::{changed_beyond_case, normalize_for_model, sentences};

    #[test]
    fn sentences_are_distinct_and_have_three_words() {
        let text = "Hi. The cat sat down. The cat sat down!\nOk then\nI will find you; see you";
        assert_eq!(sentences(text), ["The cat sat down", "I will find you"]);
    }

    #[test]
    fn ordinary_text_needs_no_second_view() {
        for text in [
            "Hello there, how are you?",
            "I LOVE this  song",
            "Meet at 10",
        ] {
            assert!(
                !changed_beyond_case(text, &normalize_for_model(text)),
                "{text}"
            );
        }
    }

    #[test]
    fn obfuscated_text_gets_a_second_view() {
        for text in [
            "I will k i l l you",
            "s.u.i.c.i.d.e",
            "k1ll yourself",
            "ki\u{200B}ll",
        ] {
            assert!(
                changed_beyond_case(text, &normalize_for_model(text)),
                "{text}"
            );
        }
    }
}
