//! The sentence encoder: all-MiniLM-L6-v2 (BERT, 6 layers, 384 dimensions)
//! run with candle on the CPU, mean-pooled and L2-normalised exactly as
//! sentence-transformers does, so embeddings match the published model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use tokenizers::Tokenizer;

use super::bert::{Bert, Config, Precision};
use super::files::{read_verified, ModelFile};
use super::TextModelError;

/// Embedding width of all-MiniLM-L6-v2.
pub const EMBEDDING_DIM: usize = 384;

/// Mini-batches are capped by rows and by padded tokens, which bounds the
/// attention buffers (rows x heads x len x len) whatever the input.
const MAX_BATCH_ROWS: usize = 32;
const MAX_BATCH_TOKENS: usize = 8 * 1024;
/// A batch is computed at its longest window's length, so padded tokens
/// may exceed real ones by at most a quarter: sixteen 17-token sentences
/// batched with one 256-token window would cost fourteen times their work.
const MAX_PADDED_PER_REAL: (usize, usize) = (5, 4);

/// How long texts are cut into overlapping windows of tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Tokens per window, including the `[CLS]` and `[SEP]` markers.
    pub tokens: usize,
    /// Content tokens between the starts of consecutive windows.
    pub stride: usize,
}

impl WindowConfig {
    fn content_len(&self) -> usize {
        self.tokens.saturating_sub(2).max(1)
    }
}

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
    device: Device,
}

impl MiniLm {
    /// Loads and checksum-verifies `dir/{config.json,tokenizer.json,model.safetensors}`,
    /// with the dense layers in 8-bit blocks.
    pub fn load(dir: &Path) -> Result<MiniLm, TextModelError> {
        MiniLm::load_with(dir, Precision::Int8)
    }

    fn load_with(dir: &Path, precision: Precision) -> Result<MiniLm, TextModelError> {
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

        let device = Device::Cpu;
        let vb = VarBuilder::from_buffered_safetensors(weights, DType::F32, &device)?;
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
            device,
        })
    }

    /// Token windows covering the whole text, each framed by `[CLS]`/`[SEP]`.
    /// An empty text gives one window with the markers only.
    pub fn windows(&self, text: &str, cfg: WindowConfig) -> Result<Vec<Vec<u32>>, TextModelError> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| TextModelError::Tokenizer(e.to_string()))?;
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
    /// Identical windows are encoded once: the sentences of a request's two
    /// combined texts are the same, and often the items themselves. Windows
    /// are sorted by length and padded per mini-batch so short ones never
    /// pay for a long neighbour.
    pub fn embed(&self, windows: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, TextModelError> {
        let mut first_of: HashMap<&[u32], usize> = HashMap::new();
        let mut distinct: Vec<Vec<u32>> = Vec::new();
        let slot: Vec<usize> = windows
            .iter()
            .map(|w| {
                *first_of.entry(w.as_slice()).or_insert_with(|| {
                    distinct.push(w.clone());
                    distinct.len() - 1
                })
            })
            .collect();
        let embedded = self.pool.install(|| self.embed_distinct(&distinct))?;
        Ok(slot.into_iter().map(|d| embedded[d].clone()).collect())
    }

    fn embed_distinct(&self, windows: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, TextModelError> {
        let mut order: Vec<usize> = (0..windows.len()).collect();
        order.sort_by_key(|&i| windows[i].len());
        let mut out = vec![Vec::new(); windows.len()];
        let mut rest = &order[..];
        while !rest.is_empty() {
            let take = batch_len(rest, windows);
            let (batch, tail) = rest.split_at(take);
            let refs: Vec<&[u32]> = batch.iter().map(|&i| windows[i].as_slice()).collect();
            for (&i, emb) in batch.iter().zip(self.embed_batch(&refs)?) {
                out[i] = emb;
            }
            rest = tail;
        }
        Ok(out)
    }

    fn embed_batch(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>, TextModelError> {
        let max_len = batch.iter().map(|w| w.len()).max().unwrap_or(0);
        let rows = batch.len();
        let mut ids = vec![0u32; rows * max_len];
        let mut mask = vec![0u32; rows * max_len];
        for (r, w) in batch.iter().enumerate() {
            ids[r * max_len..r * max_len + w.len()].copy_from_slice(w);
            mask[r * max_len..r * max_len + w.len()].fill(1);
        }
        let ids = Tensor::from_vec(ids, (rows, max_len), &self.device)?;
        let mask = Tensor::from_vec(mask, (rows, max_len), &self.device)?;
        let hidden = self.model.forward(&ids, &mask)?;
        // Mean over real tokens only, then unit length (sentence-transformers' pooling).
        let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
        let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
        let counts = mask.sum(1)?;
        let mean = summed.broadcast_div(&counts)?;
        let norm = mean.sqr()?.sum_keepdim(1)?.sqrt()?.clamp(1e-12, f64::MAX)?;
        Ok(mean.broadcast_div(&norm)?.to_vec2::<f32>()?)
    }
}

/// How many of the (length-sorted) windows at the head of `order` go in the next batch.
fn batch_len(order: &[usize], windows: &[Vec<u32>]) -> usize {
    let (num, den) = MAX_PADDED_PER_REAL;
    let mut n = 0;
    let mut real = 0;
    for &i in order.iter().take(MAX_BATCH_ROWS) {
        // Sorted ascending, so this window sets the padded length.
        let len = windows[i].len();
        let padded = len * (n + 1);
        real += len;
        if n > 0 && (padded > MAX_BATCH_TOKENS || padded * den > real * num) {
            break;
        }
        n += 1;
    }
    n.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models_dir() -> std::path::PathBuf {
        std::env::var_os("MODERATO_MODELS_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models"))
            .join(super::super::MINILM_DIR)
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
        let f32_model = MiniLm::load_with(&models_dir(), Precision::F32).unwrap();
        let reference = reference_embeddings(&f32_model);
        let int8_model = MiniLm::load_with(&models_dir(), Precision::Int8).unwrap();
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
    fn batches_respect_row_and_token_caps() {
        let windows: Vec<Vec<u32>> = (0..100).map(|i| vec![0; 10 + i % 3]).collect();
        let mut order: Vec<usize> = (0..100).collect();
        order.sort_by_key(|&i| windows[i].len());
        assert_eq!(batch_len(&order, &windows), MAX_BATCH_ROWS);
        let long: Vec<Vec<u32>> = (0..40).map(|_| vec![0; 510]).collect();
        let order: Vec<usize> = (0..40).collect();
        let n = batch_len(&order, &long);
        assert!(n * 510 <= MAX_BATCH_TOKENS && n >= 1);
    }

    #[test]
    fn short_windows_are_not_padded_to_a_long_one() {
        let mut windows: Vec<Vec<u32>> = (0..16).map(|_| vec![0; 17]).collect();
        windows.push(vec![0; 256]);
        let order: Vec<usize> = (0..17).collect();
        assert_eq!(batch_len(&order, &windows), 16);
        assert_eq!(batch_len(&order[16..], &windows), 1);
    }
}
