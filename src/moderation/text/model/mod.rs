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
//! Texts are cut into sentence chunks of at most `window.tokens` tokens (128
//! since heads .6; see [`encoder::MiniLm::chunks`]); a category's score is its strongest
//! chunk's, so a threat in the middle of a long benign text is not diluted
//! away. Every distinct chunk of a request goes through the encoder once:
//! the combined text of a request is scored from its items' chunks plus
//! the few chunks that straddle item boundaries.

mod adapter;
mod bert;
mod cache;
pub mod e5;
mod encoder;
mod files;
mod heads;
mod q4;

use std::borrow::Cow;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use encoder::{WindowConfig, EMBEDDING_DIM};
pub use files::MINILM_DIR;
pub use heads::{InputKind, LexicalFeatures, LEXICAL_FEATURES};

use e5::{E5, E5_DIR};
use encoder::MiniLm;
use heads::Heads;

use super::evidence::{combined_lexicon_evidence, lexicon_evidence};
use super::language::{self, Route};
use super::lexical::LexicalClassifier;
use super::ngrams::{self, NgramModel, SHIPPED_NGRAM_MODEL};
use super::normalize::{self, normalize_traced, OffsetMap, Options, Repeats};
use crate::moderation::category::{CategoryScores, Thresholds};
use crate::moderation::classifier::{
    EmbeddingCacheStats, ExplainedScores, TextClassifier, TextEvidence,
};
use crate::moderation::explain::{Evidence, ItemRange, ItemRanges, Source};
use crate::moderation::{Deadline, DeadlineExceeded};

/// The shipped heads, thresholds and window settings.
pub const SHIPPED_HEADS_JSON: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/text-model/heads.json"
));

/// The shipped heads with a second stage (multilingual-e5, see
/// [`heads::E5Block`]), served when the operator turns it on
/// (`text_model.second_stage`): more accurate on real text, several times
/// the CPU for the texts it reads again (eval/ABLATION-real.md).
pub const SHIPPED_SECOND_STAGE_HEADS_JSON: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/text-model/heads-e5.json"
));

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
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    #[error("inference failed: {0}")]
    Inference(#[from] candle_core::Error),
}

/// The n-gram model `bytes`, refused when the heads name another (by its
/// sha256) as the one they were trained with.
fn ngrams_for(heads: &Heads, bytes: &[u8]) -> Result<NgramModel, TextModelError> {
    if let Some(expected) = &heads.ngram_model {
        let actual = ngrams::sha256_hex(bytes);
        if *expected != actual {
            return Err(TextModelError::Invalid(format!(
                "the heads were trained with the n-gram model {expected}, not {actual}"
            )));
        }
    }
    NgramModel::parse(bytes).map_err(|e| TextModelError::Invalid(e.to_string()))
}

/// MiniLM embeddings and lexical features + per-category heads.
/// `Send + Sync`; inference is blocking and CPU-bound.
pub struct EmbeddingClassifier {
    /// Shared by the accurate and the fast path (see
    /// [`EmbeddingClassifier::sibling`]): one copy in memory, one cache.
    encoder: Arc<MiniLm>,
    /// The second encoder, loaded when the heads have an e5 block.
    e5: Option<E5>,
    heads: Heads,
    lexical: LexicalClassifier,
    ngrams: NgramModel,
}

impl EmbeddingClassifier {
    /// Loads the encoder from `models_dir/minilm/` and the shipped heads.
    pub fn load(models_dir: &Path) -> Result<EmbeddingClassifier, TextModelError> {
        EmbeddingClassifier::load_with_heads(models_dir, SHIPPED_HEADS_JSON)
    }

    /// The shipped heads with the second stage (and `models_dir/e5/`) when
    /// `second_stage`, else [`EmbeddingClassifier::load`].
    pub fn load_shipped(
        models_dir: &Path,
        second_stage: bool,
    ) -> Result<EmbeddingClassifier, TextModelError> {
        let heads = if second_stage {
            SHIPPED_SECOND_STAGE_HEADS_JSON
        } else {
            SHIPPED_HEADS_JSON
        };
        EmbeddingClassifier::load_with_heads(models_dir, heads)
    }

    /// Like [`EmbeddingClassifier::load`] with other heads (training, tests)
    /// trained on the base encoder.
    pub fn load_with_heads(
        models_dir: &Path,
        heads_json: &str,
    ) -> Result<EmbeddingClassifier, TextModelError> {
        EmbeddingClassifier::load_with_adapter(models_dir, heads_json, None)
    }

    /// Like [`EmbeddingClassifier::load_with_heads`] with the encoder adapter
    /// `adapter` (a candidate in training, see [`adapter`]). The heads say
    /// whether they were trained on an adapter and which: `adapter` is used
    /// when it is that one and refused when the heads name another; heads
    /// that name none get the base encoder.
    pub fn load_with_adapter(
        models_dir: &Path,
        heads_json: &str,
        adapter: Option<&[u8]>,
    ) -> Result<EmbeddingClassifier, TextModelError> {
        EmbeddingClassifier::load_with_parts(models_dir, heads_json, adapter, SHIPPED_NGRAM_MODEL)
    }

    /// Like [`EmbeddingClassifier::load_with_adapter`] with the n-gram model
    /// `ngram_model` (a candidate in training) in place of the shipped one.
    /// Heads that name the n-gram model they were trained on (its sha256)
    /// refuse another.
    pub fn load_with_parts(
        models_dir: &Path,
        heads_json: &str,
        adapter: Option<&[u8]>,
        ngram_model: &[u8],
    ) -> Result<EmbeddingClassifier, TextModelError> {
        let heads = Heads::parse(heads_json)?;
        let ngrams = ngrams_for(&heads, ngram_model)?;
        let adapter = match (&heads.encoder_adapter, adapter) {
            (None, _) => None,
            (Some(sha256), Some(bytes)) => Some(adapter::Adapter::verified(bytes, sha256)?),
            (Some(sha256), None) => {
                return Err(TextModelError::Invalid(format!(
                    "the heads were trained with the encoder adapter {sha256}, which was not given"
                )))
            }
        };
        let encoder = Arc::new(MiniLm::load(
            &models_dir.join(MINILM_DIR),
            adapter.as_ref(),
        )?);
        EmbeddingClassifier::with_encoder(models_dir, encoder, heads, ngrams)
    }

    /// Another classifier on this one's MiniLM encoder (and its embedding
    /// cache) with the shipped `heads_json`: the fast path beside the
    /// accurate one costs its heads only. Heads trained on an encoder
    /// adapter need their own encoder and are refused here.
    pub fn sibling(
        &self,
        models_dir: &Path,
        heads_json: &str,
    ) -> Result<EmbeddingClassifier, TextModelError> {
        let heads = Heads::parse(heads_json)?;
        if heads.encoder_adapter.is_some() {
            return Err(TextModelError::Invalid(
                "heads trained on an encoder adapter cannot share the base encoder".into(),
            ));
        }
        let ngrams = ngrams_for(&heads, SHIPPED_NGRAM_MODEL)?;
        EmbeddingClassifier::with_encoder(models_dir, self.encoder.clone(), heads, ngrams)
    }

    fn with_encoder(
        models_dir: &Path,
        encoder: Arc<MiniLm>,
        heads: Heads,
        ngrams: NgramModel,
    ) -> Result<EmbeddingClassifier, TextModelError> {
        let e5 = match heads.e5.as_ref() {
            None => None,
            Some(block) => {
                let dir = models_dir.join(E5_DIR);
                let model = E5::open(&dir, block.weights(), block.layers())?;
                Some(match block.window() {
                    None => model,
                    Some(tokens) => model.with_window(tokens)?,
                })
            }
        };
        Ok(EmbeddingClassifier {
            encoder,
            e5,
            heads,
            lexical: LexicalClassifier::new(),
            ngrams,
        })
    }

    /// Keeps up to `entries` window embeddings across calls, per encoder
    /// (none with 0, the default): repeated sentences then skip the
    /// encoders.
    pub fn with_embedding_cache(mut self, entries: usize) -> EmbeddingClassifier {
        // Only before the encoder is shared: a sibling takes this cache.
        if let Some(encoder) = Arc::get_mut(&mut self.encoder) {
            encoder.set_cache(entries);
        }
        if let Some(e5) = &mut self.e5 {
            e5.set_cache(entries);
        }
        self
    }

    /// The second encoder's cache figures, when it runs and has a cache.
    pub fn second_stage_cache_stats(&self) -> Option<EmbeddingCacheStats> {
        self.e5.as_ref()?.cache().map(|c| c.stats())
    }

    /// The version of the heads, e.g. `2026-11-22.1`.
    pub fn version(&self) -> &str {
        &self.heads.version
    }

    /// The window settings of the shipped heads.
    pub fn window(&self) -> WindowConfig {
        self.heads.window
    }

    /// The embeddings of every chunk of every text (per text, per chunk,
    /// over all its views), computed exactly as [`EmbeddingClassifier::score`]
    /// and [`EmbeddingClassifier::score_items`] compute an item's: what
    /// training and evaluation use so that they see what serving sees.
    pub fn embed_windows(&self, texts: &[&str]) -> Result<Vec<Vec<Vec<f32>>>, TextModelError> {
        let chunks = texts
            .iter()
            .map(|t| self.text_chunks(t))
            .collect::<Result<Vec<_>, _>>()?;
        self.embed_grouped(&chunks, &Deadline::distant())
    }

    /// Embeds groups of chunks in one encoder call (each distinct chunk
    /// once), returned grouped the same way.
    fn embed_grouped(
        &self,
        groups: &[Vec<Vec<u32>>],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<Vec<f32>>>, TextModelError> {
        let flat: Vec<Vec<u32>> = groups.iter().flatten().cloned().collect();
        let mut embeddings = self.encoder.embed_within(&flat, deadline)?.into_iter();
        Ok(groups
            .iter()
            .map(|g| embeddings.by_ref().take(g.len()).collect())
            .collect())
    }

    /// The chunks of every view of `text` (see [`Self::model_inputs`]).
    fn text_chunks(&self, text: &str) -> Result<Vec<Vec<u32>>, TextModelError> {
        let mut out = Vec::new();
        for input in self.model_inputs(text) {
            out.extend(self.encoder.chunks(&input, self.heads.window)?);
        }
        Ok(out)
    }

    /// The composed scores of a text from its chunks' embeddings: per
    /// category the strongest chunk's.
    fn text_scores<'e>(
        &self,
        embeddings: impl IntoIterator<Item = &'e Vec<f32>>,
        lexical: &LexicalFeatures,
    ) -> CategoryScores {
        let strongest = embeddings
            .into_iter()
            .map(|e| self.heads.window_scores(e, lexical))
            .fold(CategoryScores::default(), |acc, s| acc.max_with(&s));
        self.heads.compose(strongest)
    }

    /// Each item's scores and, with two or more items, the scores of all of
    /// them as one text, from one encoder call. The combined text is what
    /// the items say together, so its chunks are the items' own (already
    /// encoded) plus, for each pair of neighbours, the end of one run
    /// together with the start of the next: where a word or a sentence
    /// split across items is whole again. It reads the lexical features of
    /// the items joined by a line break and run together (the stronger
    /// score of the two).
    pub fn score_items(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> Result<(Vec<CategoryScores>, Option<CategoryScores>), TextModelError> {
        if items.len() < 2 {
            let scores = self.score_within(items, deadline)?;
            let combined = scores.first().copied();
            return Ok((scores, combined));
        }
        let mut groups = items
            .iter()
            .map(|t| self.text_chunks(t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut boundary = Vec::new();
        for text in self.boundary_texts(items)? {
            boundary.extend(self.text_chunks(&text)?);
        }
        groups.push(boundary);
        let embedded = self.embed_grouped(&groups, deadline)?;
        let mut scores: Vec<CategoryScores> = embedded
            .iter()
            .zip(items)
            .map(|(e, text)| {
                self.text_scores(e, &LexicalFeatures::of(&self.lexical, &self.ngrams, text))
            })
            .collect();
        let combined = [items.join("\n"), items.concat()]
            .iter()
            .map(|joined| {
                let lexical = LexicalFeatures::of(&self.lexical, &self.ngrams, joined);
                self.text_scores(embedded.iter().flatten(), &lexical)
            })
            .reduce(|a, b| a.max_with(&b));
        let combined = self.second_stage_items(items, &mut scores, combined, deadline)?;
        Ok((scores, combined))
    }

    /// Where neighbouring items meet: the last [`BOUNDARY_TOKENS`] of one
    /// run together with the first of the next (`"... I will k"` +
    /// `"ill you"`), and, when letters or digits meet there, also with a
    /// line break between them (`"I will find"` + `"you"`).
    fn boundary_texts(&self, items: &[&str]) -> Result<Vec<String>, TextModelError> {
        Ok(self
            .boundaries(items)?
            .into_iter()
            .map(|b| b.text)
            .collect())
    }

    /// [`Self::boundary_texts`], each with where its two parts lie in the items.
    fn boundaries(&self, items: &[&str]) -> Result<Vec<Boundary>, TextModelError> {
        let mut out = Vec::new();
        for (left, pair) in items.windows(2).enumerate() {
            let (_, tail) = self.encoder.edges(pair[0], BOUNDARY_TOKENS)?;
            let (head, _) = self.encoder.edges(pair[1], BOUNDARY_TOKENS)?;
            let (tail, head) = (tail.trim_start(), head.trim_end());
            if tail.trim().is_empty() || head.trim().is_empty() {
                continue;
            }
            // `tail` is a suffix of the left item and `head` a prefix of
            // the right one.
            let boundary = |separator: &str| Boundary {
                text: format!("{tail}{separator}{head}"),
                left,
                tail_start: pair[0].len() - tail.len(),
                tail_len: tail.len(),
                head_at: tail.len() + separator.len(),
            };
            out.push(boundary(""));
            let word_char = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
            if word_char(tail.chars().last()) && word_char(head.chars().next()) {
                out.push(boundary("\n"));
            }
        }
        Ok(out)
    }

    /// [`Self::score_items`] with the evidence behind the scores: every
    /// chunk the encoder read (in every view of the text), placed in the
    /// text as sent, with its own scores, and the terms the lexical layer
    /// matched. The scores are computed exactly as `score_items` computes
    /// them; the chunks' places cost a traced normalisation of each text
    /// and are only computed here.
    pub fn score_items_explained(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> Result<ExplainedScores, TextModelError> {
        let placed = items
            .iter()
            .map(|t| self.placed_chunks(t))
            .collect::<Result<Vec<_>, _>>()?;
        let mut boundary_chunks: Vec<(Vec<u32>, Option<ItemRanges>)> = Vec::new();
        if items.len() > 1 {
            for boundary in self.boundaries(items)? {
                for (ids, range) in self.placed_chunks(&boundary.text)? {
                    boundary_chunks.push((ids, range.and_then(|r| boundary.place(r))));
                }
            }
        }
        let mut groups: Vec<Vec<Vec<u32>>> = placed
            .iter()
            .map(|chunks| chunks.iter().map(|(ids, _)| ids.clone()).collect())
            .collect();
        if items.len() > 1 {
            groups.push(boundary_chunks.iter().map(|(ids, _)| ids.clone()).collect());
        }
        let embedded = self.embed_grouped(&groups, deadline)?;
        let lexical: Vec<LexicalFeatures> = items
            .iter()
            .map(|t| LexicalFeatures::of(&self.lexical, &self.ngrams, t))
            .collect();

        let mut scores = Vec::with_capacity(items.len());
        let mut evidence = TextEvidence::none(items.len(), Source::Model);
        for (k, text) in items.iter().enumerate() {
            scores.push(self.text_scores(&embedded[k], &lexical[k]));
            let chunks = placed[k].iter().zip(&embedded[k]);
            evidence.items[k] = chunks
                .filter_map(|((_, range), e)| {
                    Some(self.chunk_evidence(range.clone()?, e, &lexical[k..=k]))
                })
                .chain(lexicon_evidence(&self.lexical, text, deadline)?)
                .collect();
        }
        if items.len() < 2 {
            let combined = scores.first().copied();
            let combined = self.second_stage_items(items, &mut scores, combined, deadline)?;
            return Ok(ExplainedScores {
                items: scores,
                combined,
                evidence,
            });
        }

        let together = [items.join("\n"), items.concat()]
            .map(|joined| LexicalFeatures::of(&self.lexical, &self.ngrams, &joined));
        let combined = together
            .iter()
            .map(|lexical| self.text_scores(embedded.iter().flatten(), lexical))
            .reduce(|a, b| a.max_with(&b));
        let combined = self.second_stage_items(items, &mut scores, combined, deadline)?;
        let item_chunks = placed.iter().enumerate().flat_map(|(k, chunks)| {
            chunks.iter().map(move |(_, range)| {
                let bytes = range.clone()?;
                ItemRanges::new([ItemRange { item: k, bytes }])
            })
        });
        let places = item_chunks.chain(boundary_chunks.into_iter().map(|(_, place)| place));
        evidence.combined = places
            .zip(embedded.iter().flatten())
            .filter_map(|(place, e)| Some(self.chunk_evidence(place?, e, &together)))
            .chain(combined_lexicon_evidence(&self.lexical, items, deadline)?)
            .collect();
        Ok(ExplainedScores {
            items: scores,
            combined,
            evidence,
        })
    }

    /// One chunk's own scores, composed as a text's are (parents at least
    /// their kinds, `sexual/minors` from its two signals), read with the
    /// strongest of the texts' lexical features it is part of.
    fn chunk_evidence<P>(
        &self,
        place: P,
        embedding: &[f32],
        lexical: &[LexicalFeatures],
    ) -> Evidence<P> {
        let scores = lexical
            .iter()
            .map(|lex| self.heads.compose(self.heads.window_scores(embedding, lex)))
            .reduce(|a, b| a.max_with(&b))
            .unwrap_or_default();
        Evidence {
            place,
            scores,
            source: Source::Model,
        }
    }

    /// The chunks of every view of `text` (the same as [`Self::text_chunks`]),
    /// each with the byte range of `text` it was cut from; `None` for a
    /// chunk that covers no text (the markers-only chunk of an empty text).
    fn placed_chunks(&self, text: &str) -> Result<Vec<PlacedChunk>, TextModelError> {
        let mut out = Vec::new();
        for view in self.model_views(text) {
            for (ids, range) in self
                .encoder
                .chunks_with_ranges(&view.text, self.heads.window)?
            {
                out.push((ids, view.to_original(range)));
            }
        }
        Ok(out)
    }

    /// [`Self::model_inputs`] with the way back from each view to `text`:
    /// the same views, by the same rules, normalised with their maps.
    fn model_views<'a>(&self, text: &'a str) -> Vec<View<'a>> {
        let traced = |repeats| normalize_traced(text, Options { repeats });
        match self.heads.input {
            InputKind::Raw => vec![View::raw(text)],
            InputKind::Normalized => vec![View::traced(traced(Repeats::CollapseToTwo))],
            InputKind::Both => {
                let mut views = vec![View::raw(text)];
                let normalized = traced(Repeats::CollapseToTwo);
                let single = traced(Repeats::CollapseToOne);
                if single.text != normalized.text && changed_beyond_case(text, &single.text) {
                    views.push(View::traced(single));
                }
                if changed_beyond_case(text, &normalized.text) {
                    views.push(View::traced(normalized));
                }
                views
            }
        }
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

    /// Calibrated scores, one per text, in order. All chunks of all texts
    /// go through the encoder together.
    pub fn score(&self, texts: &[&str]) -> Result<Vec<CategoryScores>, TextModelError> {
        self.score_within(texts, &Deadline::distant())
    }

    /// [`EmbeddingClassifier::score`] that stops at `deadline`.
    pub fn score_within(
        &self,
        texts: &[&str],
        deadline: &Deadline,
    ) -> Result<Vec<CategoryScores>, TextModelError> {
        let chunks = texts
            .iter()
            .map(|t| self.text_chunks(t))
            .collect::<Result<Vec<_>, _>>()?;
        let per_text = self.embed_grouped(&chunks, deadline)?;
        let mut scores: Vec<CategoryScores> = per_text
            .iter()
            .zip(texts)
            .map(|(chunks, text)| {
                self.text_scores(
                    chunks,
                    &LexicalFeatures::of(&self.lexical, &self.ngrams, text),
                )
            })
            .collect();
        self.second_stage(texts, &mut scores, deadline)?;
        Ok(scores)
    }

    /// Mixes in the second encoder's reading (see [`heads::E5Block`]) for
    /// the texts whose first-stage scores reach its gate, all of them in
    /// one e5 call: every scoring window of every view of the text, pooled
    /// per view by the block, the strongest view speaking. Nothing
    /// happens for heads without an e5 block.
    fn second_stage(
        &self,
        texts: &[&str],
        scores: &mut [CategoryScores],
        deadline: &Deadline,
    ) -> Result<(), TextModelError> {
        let (Some(block), Some(e5)) = (&self.heads.e5, &self.e5) else {
            return Ok(());
        };
        // A text that does not read as English is read whatever the first
        // stage thinks of it: its encoder reads English, and on another
        // language (or a short, mixed or transliterated text) a low
        // first-stage score says little.
        let routes: Vec<Route> = texts.iter().map(|t| language::detect(t).route).collect();
        let consulted: Vec<usize> = (0..texts.len())
            .filter(|&i| routes[i] != Route::English || block.consulted(&scores[i]))
            .collect();
        if consulted.is_empty() {
            return Ok(());
        }
        metrics::counter!(crate::metrics::names::SECOND_STAGE_TEXTS)
            .increment(consulted.len() as u64);
        // Every view the first stage read (the de-obfuscated one too), so
        // that `k i l l` is no weaker here than there.
        let views: Vec<Vec<Cow<str>>> = consulted
            .iter()
            .map(|&i| self.model_inputs(texts[i]))
            .collect();
        let inputs: Vec<&str> = views.iter().flatten().map(|v| v.as_ref()).collect();
        let mut windows = self
            .encoder
            .install(|| e5.embed_windows_within(&inputs, deadline))?
            .into_iter();
        for (&i, v) in consulted.iter().zip(&views) {
            let read: Vec<Vec<Vec<f32>>> = windows.by_ref().take(v.len()).collect();
            let other_language = routes[i] == Route::Other;
            scores[i] = self.heads.with_e5(scores[i], &read, !other_language);
        }
        Ok(())
    }

    /// Each item's scores, in place, and the combined ones (returned),
    /// through the second stage. The combined text is the items joined by
    /// line breaks, scored at least as high as each item; a single item is
    /// its own combined text.
    fn second_stage_items(
        &self,
        items: &[&str],
        scores: &mut Vec<CategoryScores>,
        combined: Option<CategoryScores>,
        deadline: &Deadline,
    ) -> Result<Option<CategoryScores>, TextModelError> {
        if self.heads.e5.is_none() {
            return Ok(combined);
        }
        let Some(together) = combined.filter(|_| items.len() > 1) else {
            self.second_stage(items, scores, deadline)?;
            return Ok(if items.len() == 1 {
                scores.first().copied()
            } else {
                combined
            });
        };
        let joined = items.join("\n");
        let mut texts = items.to_vec();
        texts.push(&joined);
        scores.push(together);
        let result = self.second_stage(&texts, scores, deadline);
        let together = scores.pop().expect("the combined scores were pushed");
        // The items taken together hold every item: e5 reads them as one
        // window, where a harmless question can outweigh an insult after it
        // that the item's own reading flags. The first stage's chunks keep
        // this by construction; the mix must not undo it.
        result.map(|()| Some(scores.iter().fold(together, |all, item| all.max_with(item))))
    }

    /// The texts the encoder sees for `text`: the heads' input form, plus
    /// the de-obfuscated form when the heads read raw text and normalising
    /// changed more than letter case (`k i l l`, `s.u.i.c.i.d.e`, look-alikes),
    /// so evasion cannot hide a word the model knows. Ordinary text costs
    /// one pass. [`Self::model_views`] makes the same choice with offset
    /// maps; keep the two in step (`explained_scores_are_exactly_the_scores`
    /// in `tests/it/text_model.rs` fails when they differ).
    fn model_inputs<'a>(&self, text: &'a str) -> Vec<Cow<'a, str>> {
        match self.heads.input {
            InputKind::Raw => vec![Cow::Borrowed(text)],
            InputKind::Normalized => vec![Cow::Owned(normalize_for_model(text))],
            InputKind::Both => {
                let mut views = vec![Cow::Borrowed(text)];
                let normalized = normalize_for_model(text);
                // Elongations: the intended length of `kiiiill` is unknown.
                let single = normalize::normalize_single_repeats(text);
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

/// Where two neighbouring items meet, as the encoder reads it: the end of
/// the left item, maybe a line break, then the start of the right one.
struct Boundary {
    text: String,
    /// The left item; the right one is the next.
    left: usize,
    /// Where the left item's part starts in it, and its length.
    tail_start: usize,
    tail_len: usize,
    /// Where the right item's part starts in `text`.
    head_at: usize,
}

impl Boundary {
    /// The items' ranges behind `range` of the boundary text: the left
    /// item's, the right item's, or both (a chunk across the boundary).
    fn place(&self, range: Range<usize>) -> Option<ItemRanges> {
        let (tail_start, tail_end) = (range.start.min(self.tail_len), range.end.min(self.tail_len));
        let head = range.start.max(self.head_at) - self.head_at
            ..range.end.max(self.head_at) - self.head_at;
        ItemRanges::new([
            ItemRange {
                item: self.left,
                bytes: self.tail_start + tail_start..self.tail_start + tail_end,
            },
            ItemRange {
                item: self.left + 1,
                bytes: head,
            },
        ])
    }
}

/// A chunk's tokens and the byte range of the item's text it was cut
/// from; `None` when it covers none.
type PlacedChunk = (Vec<u32>, Option<Range<usize>>);

/// A text the encoder reads for an item, with the way back to the item's
/// own text (`None`: it is the item's text).
struct View<'a> {
    text: Cow<'a, str>,
    map: Option<OffsetMap>,
}

impl<'a> View<'a> {
    fn raw(text: &'a str) -> View<'a> {
        View {
            text: Cow::Borrowed(text),
            map: None,
        }
    }

    fn traced(traced: normalize::Traced) -> View<'a> {
        View {
            text: Cow::Owned(traced.text),
            map: Some(traced.map),
        }
    }

    /// The byte range of the item's text behind `range` of this view.
    fn to_original(&self, range: Range<usize>) -> Option<Range<usize>> {
        match &self.map {
            _ if range.is_empty() => None,
            None => Some(range),
            Some(map) => map.to_original(range),
        }
    }
}

/// Tokens taken from each side of an item boundary for the combined text:
/// enough for a split word and the words around it, few enough that the
/// boundaries of a request cost a fraction of its items.
const BOUNDARY_TOKENS: usize = 10;

/// Whether normalising did more than fold case and whitespace.
fn changed_beyond_case(raw: &str, normalized: &str) -> bool {
    let folded = raw.split_whitespace().map(str::to_lowercase);
    !folded.eq(normalized.split_whitespace().map(str::to_string))
}

/// The de-obfuscated form of a text: the same normaliser as the lexical
/// layer's (look-alikes, invisibles, `k i l l`, `k1ll`, elongations).
fn normalize_for_model(text: &str) -> String {
    normalize::normalize(text)
}

/// A passed deadline stays a [`DeadlineExceeded`] for the engine to recognise.
fn into_anyhow(e: TextModelError) -> anyhow::Error {
    match e {
        TextModelError::Deadline(d) => anyhow::Error::new(d),
        other => other.into(),
    }
}

impl TextClassifier for EmbeddingClassifier {
    /// Names the encoders that read the text, so a response says which path
    /// judged it: `minilm-l6-heads-V` (the first stage alone) or
    /// `minilm-l6+e5-small-heads-V` (with the second stage).
    fn model_id(&self) -> String {
        let encoders = if self.e5.is_some() {
            "minilm-l6+e5-small"
        } else {
            "minilm-l6"
        };
        format!("{encoders}-heads-{}", self.heads.version)
    }

    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>> {
        self.score_batch_within(texts, &Deadline::distant())
    }

    fn score_batch_within(
        &self,
        texts: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<Vec<CategoryScores>> {
        let scores = self.score_within(texts, deadline).map_err(into_anyhow)?;
        self.log_cache_stats();
        Ok(scores)
    }

    fn score_items(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<(Vec<CategoryScores>, Option<CategoryScores>)> {
        let scores =
            EmbeddingClassifier::score_items(self, items, deadline).map_err(into_anyhow)?;
        self.log_cache_stats();
        Ok(scores)
    }

    fn score_items_explained(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<ExplainedScores> {
        let explained = EmbeddingClassifier::score_items_explained(self, items, deadline)
            .map_err(into_anyhow)?;
        self.log_cache_stats();
        Ok(explained)
    }

    fn default_thresholds(&self) -> Thresholds {
        self.heads.thresholds()
    }

    fn embedding_cache_stats(&self) -> Option<EmbeddingCacheStats> {
        self.encoder.cache().map(|c| c.stats())
    }
}

impl EmbeddingClassifier {
    fn log_cache_stats(&self) {
        if let Some(stats) = self.embedding_cache_stats() {
            tracing::debug!(
                hits = stats.hits,
                misses = stats.misses,
                entries = stats.entries,
                "embedding cache"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{changed_beyond_case, normalize_for_model};

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
            // Cyrillic і and о: the stand-in normaliser let these through.
            "k\u{0456}ll y\u{043E}u",
        ] {
            assert!(
                changed_beyond_case(text, &normalize_for_model(text)),
                "{text}"
            );
        }
    }
}
