//! BERT encoder forward pass for all-MiniLM-L6-v2 with its dense layers
//! in 8-bit blocks (see the `int8-matmul` crate); attention, layer norms and the
//! embedding tables stay f32.
//!
//! Why not `candle_transformers::models::bert`: its f32 dense layers stream
//! 42 MB of weights from memory on every forward pass whatever the input
//! length, which was most of the time for a short message (7 ms of the 9 ms
//! for 12 tokens). The f32 path is kept as the reference the 8-bit one is
//! tested against.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Module, Shape, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use serde::Deserialize;

use super::TextModelError;
use int8_matmul::Int8Matrix;

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
    F32(Tensor),
    Int8(Int8Op),
}

/// The 8-bit matrix as a candle operation on activations.
struct Int8Op(Int8Matrix);

struct Dense {
    weight: Weights,
    bias: Tensor,
}

/// `x · Wᵀ` over the last dimension of a contiguous f32 tensor.
impl CustomOp1 for Int8Op {
    fn name(&self) -> &'static str {
        "int8-matmul"
    }

    fn cpu_fwd(
        &self,
        storage: &CpuStorage,
        layout: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            candle_core::bail!("int8 matmul takes f32 input");
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("int8 matmul takes contiguous input");
        };
        let w = &self.0;
        let mut dims = layout.dims().to_vec();
        if dims.last() != Some(&w.cols()) {
            candle_core::bail!("int8 matmul: input {dims:?} does not end in {}", w.cols());
        }
        let m = (end - start) / w.cols();
        let mut out = vec![0f32; m * w.rows()];
        w.matmul(&data[start..end], m, &mut out);
        *dims.last_mut().expect("checked above") = w.rows();
        Ok((CpuStorage::F32(out), Shape::from(dims)))
    }
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
        Dense::from_parts(&weight, bias, p)
    }

    fn from_parts(weight: &Tensor, bias: Tensor, p: Precision) -> candle_core::Result<Dense> {
        let weight = match p {
            Precision::F32 => Weights::F32(weight.clone()),
            Precision::Int8 => {
                let (rows, cols) = weight.dims2()?;
                let values = weight.flatten_all()?.to_vec1::<f32>()?;
                Weights::Int8(Int8Op(Int8Matrix::quantize(&values, rows, cols)))
            }
        };
        Ok(Dense { weight, bias })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let product = match &self.weight {
            Weights::F32(w) => {
                let (batch, seq, k) = x.dims3()?;
                x.reshape((batch * seq, k))?
                    .matmul(&w.t()?)?
                    .reshape((batch, seq, ()))?
            }
            Weights::Int8(w) => x.contiguous()?.apply_op1_no_bwd(w)?,
        };
        product.broadcast_add(&self.bias)
    }
}

struct Layer {
    /// Query, key and value projections fused into one matrix (3 x hidden rows).
    qkv: Dense,
    attention_out: Dense,
    attention_norm: LayerNorm,
    intermediate: Dense,
    output: Dense,
    output_norm: LayerNorm,
}

pub struct Bert {
    word: Embedding,
    position: Embedding,
    /// Token type 0's embedding: every input is a single segment.
    token_type: Tensor,
    embedding_norm: LayerNorm,
    layers: Vec<Layer>,
    heads: usize,
    head_dim: usize,
}

fn layer_norm(vb: VarBuilder, size: usize, eps: f64) -> candle_core::Result<LayerNorm> {
    candle_nn::layer_norm(size, eps, vb)
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
        let word = candle_nn::embedding(config.vocab_size, hidden, emb.pp("word_embeddings"))?;
        let position = candle_nn::embedding(
            config.max_position_embeddings,
            hidden,
            emb.pp("position_embeddings"),
        )?;
        let token_type = emb
            .pp("token_type_embeddings")
            .get((config.type_vocab_size, hidden), "weight")?
            .get(0)?;
        let embedding_norm = layer_norm(emb.pp("LayerNorm"), hidden, eps)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(vb.pp(format!("encoder.layer.{i}")), config, p))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Bert {
            word,
            position,
            token_type,
            embedding_norm,
            layers,
            heads: config.num_attention_heads,
            head_dim: hidden / config.num_attention_heads,
        })
    }

    /// Hidden states `(batch, seq, hidden)` for token ids `(batch, seq)`;
    /// `mask` is 1 for real tokens and 0 for padding.
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> candle_core::Result<Tensor> {
        let (_, seq) = ids.dims2()?;
        let positions = Tensor::arange(0u32, seq as u32, ids.device())?;
        let x = self
            .word
            .forward(ids)?
            .broadcast_add(&self.position.forward(&positions)?)?
            .broadcast_add(&self.token_type)?;
        let mut x = self.embedding_norm.forward(&x)?;
        // Padding gets a large negative score before the softmax: (batch, 1, 1, seq).
        let bias = ((mask.to_dtype(DType::F32)? - 1.0)? * 1e9)?
            .unsqueeze(1)?
            .unsqueeze(1)?;
        for layer in &self.layers {
            x = layer.forward(&x, &bias, self.heads, self.head_dim)?;
        }
        Ok(x)
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
            Tensor::cat(&[qb, kb, vb_], 0)?,
            p,
        )?;
        Ok(Layer {
            qkv,
            attention_out: Dense::load(attn.pp("output.dense"), hidden, hidden, p)?,
            attention_norm: layer_norm(attn.pp("output.LayerNorm"), hidden, eps)?,
            intermediate: Dense::load(
                vb.pp("intermediate.dense"),
                hidden,
                config.intermediate_size,
                p,
            )?,
            output: Dense::load(vb.pp("output.dense"), config.intermediate_size, hidden, p)?,
            output_norm: layer_norm(vb.pp("output.LayerNorm"), hidden, eps)?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        mask_bias: &Tensor,
        heads: usize,
        head_dim: usize,
    ) -> candle_core::Result<Tensor> {
        let (batch, seq, hidden) = x.dims3()?;
        // (batch, seq, 3, heads, head_dim) -> three (batch, heads, seq, head_dim)
        let qkv = self
            .qkv
            .forward(x)?
            .reshape((batch, seq, 3, heads, head_dim))?;
        let split = |i: usize| {
            qkv.narrow(2, i, 1)?
                .squeeze(2)?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = (q.matmul(&k.t()?)? * (1.0 / (head_dim as f64).sqrt()))?;
        let probs = candle_nn::ops::softmax_last_dim(&scores.broadcast_add(mask_bias)?)?;
        let context = probs
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((batch, seq, hidden))?;
        let x = self
            .attention_norm
            .forward(&(self.attention_out.forward(&context)? + x)?)?;
        let inner = self.intermediate.forward(&x)?.gelu_erf()?;
        self.output_norm
            .forward(&(self.output.forward(&inner)? + &x)?)
    }
}
