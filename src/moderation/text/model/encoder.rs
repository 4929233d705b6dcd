//! The sentence encoder: all-MiniLM-L6-v2 (BERT, 6 layers, 384 dimensions)
//! run with candle on the CPU, mean-pooled and L2-normalised exactly as
//! sentence-transformers does, so embeddings match the published model.

use std::path::Path;
use std::sync::{Arc, Mutex};

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use int8_matmul::ops;
use tokenizers::Tokenizer;

use super::adapter::Adapter;
#[cfg(test)]
use super::bert::{batch_len, MAX_BATCH_TOKENS};
use super::bert::{Bert, Config, Precision, Workspace};
use super::cache::{embed_through, EmbeddingCache};
use super::files::{read_verified, ModelFile};
use super::TextModelError;
use crate::moderation::Deadline;

/// Embedding width of all-MiniLM-L6-v2.
pub const EMBEDDING_DIM: usize = 384;

/// A sentence shorter than this shares its chunk with the next (`Hi.`,
/// `Ok!`, a list's numbers): alone it says too little to judge.
const MIN_CHUNK_TOKENS: usize = 8;

/// How texts are cut into chunks for the encoder (`"window"` in
/// heads.json): a text of up to `tokens` is one chunk, a longer one is cut
/// into sentences, and a sentence longer than `tokens` into overlapping
/// windows (see [`MiniLm::chunks`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Tokens per chunk at most, including the `[CLS]` and `[SEP]` markers.
    pub tokens: usize,
    /// Content tokens between the starts of a long sentence's windows.
    pub stride: usize,
}

impl WindowConfig {
    fn content_len(&self) -> usize {
        self.tokens.saturating_sub(2).max(1)
    }
}

/// A chunk's tokens, framed, and the byte range of the text they cover.
pub type RangedChunk = (Vec<u32>, std::ops::Range<usize>);

pub struct MiniLm {
    model: Bert,
    /// Inference runs inside this pool: the many small parallel operations
    /// of a forward pass then start from a pool thread and split work
    /// in place, instead of each handing off to the pool from the caller's
    /// thread and sleeping until it is done (a third of the time of a
    /// short message went to those context switches).
    pool: rayon::ThreadPool,
    tokenizer: Tokenizer,
    cls: u32,
    sep: u32,
    /// Forward-pass buffers of finished passes, taken by the next ones.
    workspaces: Mutex<Vec<Workspace>>,
    cache: Option<EmbeddingCache>,
}

impl MiniLm {
    /// Loads and checksum-verifies `dir/{config.json,tokenizer.json,model.safetensors}`,
    /// with the dense layers in 8-bit blocks.
    /// With `adapter`, its low-rank deltas are added to the base weights
    /// before they are quantised.
    pub fn load(dir: &Path, adapter: Option<&Adapter>) -> Result<MiniLm, TextModelError> {
        MiniLm::load_with(dir, Precision::Int8, adapter)
    }

    fn load_with(
        dir: &Path,
        precision: Precision,
        adapter: Option<&Adapter>,
    ) -> Result<MiniLm, TextModelError> {
        let config_bytes = read_verified(dir, ModelFile::Config)?;
        let tokenizer_bytes = read_verified(dir, ModelFile::Tokenizer)?;
        let weights = read_verified(dir, ModelFile::Weights)?;

        let config: Config = serde_json::from_slice(&config_bytes)
            .map_err(|e| TextModelError::Invalid(format!("config.json: {e}")))?;
        let mut tokenizer = Tokenizer::from_bytes(&tokenizer_bytes)
            .map_err(|e| TextModelError::Invalid(format!("tokenizer.json: {e}")))?;
        // Windowing is ours: the tokenizer must return every token, unpadded.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(None)
            .map_err(|e| TextModelError::Invalid(format!("tokenizer.json: {e}")))?;
        let special = |name: &str| {
            tokenizer
                .token_to_id(name)
                .ok_or_else(|| TextModelError::Invalid(format!("tokenizer has no {name} token")))
        };
        let (cls, sep) = (special("[CLS]")?, special("[SEP]")?);

        let vb = match adapter {
            None => VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)?,
            Some(adapter) => {
                let mut tensors = candle_core::safetensors::load_buffer(&weights, &Device::Cpu)?;
                adapter.apply(&mut tensors)?;
                VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu)
            }
        };
        let model = Bert::load(vb, &config, precision)?;
        let pool = rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("minilm-{i}"))
            .build()
            .map_err(|e| TextModelError::Invalid(format!("cannot start inference threads: {e}")))?;
        Ok(MiniLm {
            model,
            pool,
            tokenizer,
            cls,
            sep,
            workspaces: Mutex::new(Vec::new()),
            cache: None,
        })
    }

    /// Keeps up to `entries` embeddings across calls (none with 0).
    pub fn set_cache(&mut self, entries: usize) {
        self.cache = EmbeddingCache::new(entries, "minilm");
    }

    /// Runs `f` in the encoder's thread pool (the second encoder's passes
    /// too, for the same reason as MiniLM's own), counted as a call for
    /// the cores ([`int8_matmul::Call`]): alone, its products are split
    /// across the pool; while others wait, they are not. On 2 cores under
    /// 8 concurrent requests that served 15-25 % more short requests a
    /// second and cut their p99 from about 160 to 60 ms (docs/performance.md, concurrent requests).
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        let _call = int8_matmul::Call::enter();
        self.pool.install(f)
    }

    pub fn cache(&self) -> Option<&EmbeddingCache> {
        self.cache.as_ref()
    }

    /// The floating-point operations of encoding windows of these lengths.
    pub fn flops(&self, lens: &[usize]) -> f64 {
        self.model.flops(lens)
    }

    /// The text in chunks of at most `cfg.tokens` tokens, each framed by
    /// `[CLS]`/`[SEP]`. A text that fits is one chunk, exactly its tokens
    /// (an empty text gives the markers only). A longer one is cut into its
    /// sentences, one a chunk (fragments under [`MIN_CHUNK_TOKENS`] joined
    /// to what follows), and a sentence too long for one chunk into
    /// overlapping windows `cfg.stride` tokens apart.
    ///
    /// Why sentences: mean pooling over a long window averages one harmful
    /// sentence away (a threat inside a page of minutes), attention costs
    /// more per token the longer the window, and a sentence chunk is the
    /// same wherever the sentence appears, so the combined text of a request
    /// reuses its items' chunks and a repeated message hits the cache.
    pub fn chunks(&self, text: &str, cfg: WindowConfig) -> Result<Vec<Vec<u32>>, TextModelError> {
        let chunks = self.chunks_with_ranges(text, cfg)?;
        Ok(chunks.into_iter().map(|(ids, _)| ids).collect())
    }

    /// [`MiniLm::chunks`], each with the byte range of `text` its tokens
    /// cover (empty for the markers-only chunk of an empty text): where a
    /// chunk's score came from, for explanations. The ranges cost two
    /// look-ups a chunk, so both callers share this one cutting.
    pub fn chunks_with_ranges(
        &self,
        text: &str,
        cfg: WindowConfig,
    ) -> Result<Vec<RangedChunk>, TextModelError> {
        let encoding = self.encode(text)?;
        let ids = encoding.get_ids();
        let offsets = encoding.get_offsets();
        let len = cfg.content_len();
        let stride = cfg.stride.clamp(1, len);
        let mut out = Vec::new();
        let frame = |out: &mut Vec<RangedChunk>, r: std::ops::Range<usize>| {
            let bytes = match (
                offsets.get(r.start),
                r.end.checked_sub(1).and_then(|e| offsets.get(e)),
            ) {
                (Some(first), Some(last)) if !r.is_empty() => first.0..last.1.max(first.0),
                _ => 0..0,
            };
            let mut chunk = Vec::with_capacity(r.len() + 2);
            chunk.push(self.cls);
            chunk.extend_from_slice(&ids[r]);
            chunk.push(self.sep);
            out.push((chunk, bytes));
        };
        if ids.len() <= len {
            frame(&mut out, 0..ids.len());
            return Ok(out);
        }
        let mut current = 0..0;
        for sentence in sentence_ranges(text, offsets) {
            if sentence.len() > len {
                if !current.is_empty() {
                    frame(&mut out, current.clone());
                }
                let mut start = sentence.start;
                loop {
                    let end = (start + len).min(sentence.end);
                    frame(&mut out, start..end);
                    if end >= sentence.end {
                        break;
                    }
                    start += stride;
                }
                current = sentence.end..sentence.end;
            } else if current.len() >= MIN_CHUNK_TOKENS || current.len() + sentence.len() > len {
                if !current.is_empty() {
                    frame(&mut out, current.clone());
                }
                current = sentence;
            } else {
                current.end = sentence.end;
            }
        }
        if !current.is_empty() || out.is_empty() {
            frame(&mut out, current);
        }
        Ok(out)
    }

    /// The start and the end of `text`: the text up to its `tokens`-th token
    /// and the text from its `tokens`-th last token (the whole text when it
    /// is shorter).
    pub fn edges<'a>(
        &self,
        text: &'a str,
        tokens: usize,
    ) -> Result<(&'a str, &'a str), TextModelError> {
        let encoding = self.encode(text)?;
        let offsets = encoding.get_offsets();
        if offsets.len() <= tokens || tokens == 0 {
            return Ok((text, text));
        }
        let head_end = offsets[tokens - 1].1;
        let tail_start = offsets[offsets.len() - tokens].0;
        match (text.get(..head_end), text.get(tail_start..)) {
            (Some(head), Some(tail)) => Ok((head, tail)),
            _ => Ok((text, text)),
        }
    }

    /// The text's tokens, without `[CLS]`/`[SEP]`, truncation or padding.
    fn encode(&self, text: &str) -> Result<tokenizers::Encoding, TextModelError> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| TextModelError::Tokenizer(e.to_string()))
    }

    /// Token windows covering the whole text, each framed by `[CLS]`/`[SEP]`.
    /// An empty text gives one window with the markers only.
    pub fn windows(&self, text: &str, cfg: WindowConfig) -> Result<Vec<Vec<u32>>, TextModelError> {
        let encoding = self.encode(text)?;
        let ids = encoding.get_ids();
        let len = cfg.content_len();
        let stride = cfg.stride.clamp(1, len);
        let mut out = Vec::with_capacity(ids.len() / stride + 1);
        let mut start = 0;
        loop {
            let end = (start + len).min(ids.len());
            let mut window = Vec::with_capacity(end - start + 2);
            window.push(self.cls);
            window.extend_from_slice(&ids[start..end]);
            window.push(self.sep);
            out.push(window);
            if end >= ids.len() {
                return Ok(out);
            }
            start += stride;
        }
    }

    /// Sentence embeddings (unit length) of token windows, in input order.
    /// Identical windows are encoded once, and windows embedded by earlier
    /// calls come from the cache when there is one.
    pub fn embed(&self, windows: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, TextModelError> {
        self.embed_within(windows, &Deadline::distant())
    }

    /// [`MiniLm::embed`] that stops before the next encoder pass once
    /// `deadline` is over ([`TextModelError::Deadline`]).
    pub fn embed_within(
        &self,
        windows: &[Vec<u32>],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<f32>>, TextModelError> {
        let windows: Vec<&[u32]> = windows.iter().map(Vec::as_slice).collect();
        let embedded = embed_through(self.cache.as_ref(), &windows, |todo| {
            let computed = self.install(|| self.embed_distinct(todo, deadline))?;
            Ok(computed.into_iter().map(Arc::from).collect())
        })?;
        Ok(embedded.iter().map(|e| e.to_vec()).collect())
    }

    /// Embeddings of distinct windows, in bounded passes (see
    /// [`Bert::forward_pooled`]).
    fn embed_distinct(
        &self,
        windows: &[&[u32]],
        deadline: &Deadline,
    ) -> Result<Vec<Vec<f32>>, TextModelError> {
        let hidden = self.model.hidden_size();
        self.model
            .forward_pooled(&self.workspaces, windows, deadline, |states| {
                let mut e = vec![0f32; hidden];
                ops::mean_pool_unit(states, &mut e);
                e
            })
    }
}

/// The token ranges of a text's sentences, in order, covering every token:
/// a sentence ends after a `.`, `!`, `?` or `;` token, or before a line
/// break. `offsets` are the tokens' byte ranges in `text`.
fn sentence_ranges(text: &str, offsets: &[(usize, usize)]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, &(a, b)) in offsets.iter().enumerate() {
        let token = text.get(a..b).unwrap_or("");
        let next = offsets.get(i + 1).map_or(text.len(), |o| o.0);
        let gap = text.get(b..next.max(b)).unwrap_or("");
        if matches!(token, "." | "!" | "?" | ";") || gap.contains('\n') {
            out.push(start..i + 1);
            start = i + 1;
        }
    }
    if start < offsets.len() {
        out.push(start..offsets.len());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    fn models_dir() -> std::path::PathBuf {
        crate::config::repository_models_dir().join(super::super::MINILM_DIR)
    }

    const SENTENCES: [&str; 5] = [
        "You are an idiot and I will find you.",
        "How do I kill a Python process that hangs?",
        "The council approved the new cycling lanes after a long debate.",
        "i dont want to be here anymore",
        "ok",
    ];

    fn embed(model: &MiniLm) -> Vec<Vec<f32>> {
        let windows: Vec<Vec<u32>> = SENTENCES
            .iter()
            .flat_map(|s| {
                model
                    .windows(
                        s,
                        WindowConfig {
                            tokens: 256,
                            stride: 192,
                        },
                    )
                    .unwrap()
            })
            .collect();
        model.embed(&windows).unwrap()
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    /// The published model as candle's own BERT runs it, on `ours`' tokens.
    fn reference_embeddings(ours: &MiniLm) -> Vec<Vec<f32>> {
        use candle_transformers::models::bert::{BertModel, Config};
        let dir = models_dir();
        let config: Config =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu).unwrap();
        let bert = BertModel::load(vb, &config).unwrap();
        SENTENCES
            .iter()
            .map(|s| {
                let w = &ours
                    .windows(
                        s,
                        WindowConfig {
                            tokens: 256,
                            stride: 192,
                        },
                    )
                    .unwrap()[0];
                let ids = Tensor::new(w.as_slice(), &Device::Cpu)
                    .unwrap()
                    .unsqueeze(0)
                    .unwrap();
                let hidden = bert
                    .forward(&ids, &ids.zeros_like().unwrap(), None)
                    .unwrap();
                let mean = hidden.mean(1).unwrap().squeeze(0).unwrap();
                let norm = mean.sqr().unwrap().sum_all().unwrap().sqrt().unwrap();
                mean.broadcast_div(&norm).unwrap().to_vec1::<f32>().unwrap()
            })
            .collect()
    }

    #[test]
    fn our_forward_pass_matches_candles_bert_and_int8_stays_close() {
        let f32_model = MiniLm::load_with(&models_dir(), Precision::F32, None).unwrap();
        let reference = reference_embeddings(&f32_model);
        let int8_model = MiniLm::load_with(&models_dir(), Precision::Int8, None).unwrap();
        for ((text, r), (f, q)) in SENTENCES
            .iter()
            .zip(&reference)
            .zip(embed(&f32_model).iter().zip(&embed(&int8_model)))
        {
            assert!(cosine(r, f) > 0.99999, "f32 {text}: {}", cosine(r, f));
            assert!(cosine(r, q) > 0.995, "int8 {text}: {}", cosine(r, q));
        }
        // Different sentences stay far apart relative to the quantisation error.
        assert!(cosine(&reference[0], &reference[2]) < 0.5);
    }

    #[test]
    fn sentences_are_packed_into_chunks_and_long_ones_windowed() {
        let model = MiniLm::load(&models_dir(), None).unwrap();
        let cfg = WindowConfig {
            tokens: 16,
            stride: 10,
        };
        let ids = |t: &str| model.windows(t, cfg).unwrap().concat();
        // Short text: one chunk, its tokens exactly.
        let short = "Hello there. How are you?";
        assert_eq!(model.chunks(short, cfg).unwrap(), vec![ids(short)]);
        // Three sentences of 6 tokens: two fit in 14 content tokens.
        let three = "The cat sat on the mat. The dog sat on the rug. The bird sat on the tree.";
        let chunks = model.chunks(three, cfg).unwrap();
        assert_eq!(chunks.len(), 2, "{chunks:?}");
        assert_eq!(
            chunks[0],
            ids("The cat sat on the mat. The dog sat on the rug.")
        );
        assert_eq!(chunks[1], ids("The bird sat on the tree."));
        // A line break ends a sentence too; a long sentence is windowed.
        let long = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen\nok";
        let chunks = model.chunks(long, cfg).unwrap();
        assert!(chunks.iter().all(|c| c.len() <= 16), "{chunks:?}");
        assert_eq!(chunks.len(), 3, "{chunks:?}");
        assert_eq!(chunks[2], ids("ok"));
        assert_eq!(
            model.chunks("", cfg).unwrap(),
            vec![vec![model.cls, model.sep]]
        );
    }

    #[test]
    fn each_chunk_knows_the_text_it_covers() {
        let model = MiniLm::load(&models_dir(), None).unwrap();
        let cfg = WindowConfig {
            tokens: 16,
            stride: 10,
        };
        let three = "The cat sat on the mat. The dog sat on the rug. The bird sat on the tree.";
        let ranges: Vec<&str> = model
            .chunks_with_ranges(three, cfg)
            .unwrap()
            .into_iter()
            .map(|(_, r)| &three[r])
            .collect();
        assert_eq!(
            ranges,
            [
                "The cat sat on the mat. The dog sat on the rug.",
                "The bird sat on the tree."
            ]
        );
        let (_, empty) = &model.chunks_with_ranges("", cfg).unwrap()[0];
        assert!(empty.is_empty());
    }

    #[test]
    fn edges_are_the_first_and_last_tokens() {
        let model = MiniLm::load(&models_dir(), None).unwrap();
        let text = "I know where you live and I will k";
        assert_eq!(model.edges(text, 3).unwrap(), ("I know where", "I will k"));
        assert_eq!(model.edges("short", 3).unwrap(), ("short", "short"));
    }

    #[test]
    fn passes_respect_the_token_cap() {
        let windows: Vec<Vec<u32>> = (0..300).map(|i| vec![0; 10 + i % 3]).collect();
        let refs: Vec<&[u32]> = windows.iter().map(Vec::as_slice).collect();
        let n = batch_len(&refs);
        let tokens: usize = refs[..n].iter().map(|w| w.len()).sum();
        assert!(tokens <= MAX_BATCH_TOKENS && tokens + 12 > MAX_BATCH_TOKENS);
        let long = vec![0u32; 510];
        assert_eq!(batch_len(&[long.as_slice(); 40]), MAX_BATCH_TOKENS / 510);
        let huge = vec![0u32; MAX_BATCH_TOKENS + 1];
        assert_eq!(batch_len(&[huge.as_slice()]), 1);
    }

    #[test]
    fn a_window_embeds_the_same_alone_and_in_a_mixed_batch() {
        let model = MiniLm::load(&models_dir(), None).unwrap();
        let cfg = WindowConfig {
            tokens: 256,
            stride: 192,
        };
        let windows: Vec<Vec<u32>> = SENTENCES
            .iter()
            .flat_map(|s| model.windows(s, cfg).unwrap())
            .collect();
        let together = model.embed(&windows).unwrap();
        for (w, t) in windows.iter().zip(&together) {
            let alone = model.embed(std::slice::from_ref(w)).unwrap();
            assert_eq!(&alone[0], t);
        }
    }
}
