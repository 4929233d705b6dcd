//! The embedded image classifier: a port of nsfwjs 4.4.0 (MIT), a Keras
//! MobileNetV2 (α = 1, 224×224 input) with a 256-128-5 dense head over the
//! classes Drawing, Hentai, Neutral, Porn and Sexy.
//!
//! `scripts/fetch-nsfwjs.sh` fetches the npm package and dequantises its
//! weights into `<models>/nsfwjs/mobilenet_v2.safetensors` with the Keras
//! names and layouts. Here batch normalisation is folded into the preceding
//! convolution at load time, pointwise convolutions run as candle matrix
//! products and the 3×3 depthwise convolutions as plain loops (candle's
//! grouped convolution splits into one convolution per channel, which is far
//! slower for 960 groups).
//!
//! Preprocessing is nsfwjs's `infer`: pixels / 255 (no mean shift: the model
//! was trained on [0, 1]), then, unless the image already is 224×224,
//! `tf.image.resizeBilinear(…, [224, 224], alignCorners = true)`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};

use super::decode::DecodedImage;
use crate::moderation::category::{Category, CategoryScores, Thresholds};
use crate::moderation::classifier::{ImageClassifier, ImageScores};

/// Reported in responses' `model` field.
pub const MODEL_ID: &str = "nsfwjs-mobilenetv2-4.4.0";

/// The model's output classes, in output order.
pub const CLASSES: [&str; 5] = ["Drawing", "Hentai", "Neutral", "Porn", "Sexy"];

/// Indices into [`CLASSES`].
pub const DRAWING: usize = 0;
pub const HENTAI: usize = 1;
pub const NEUTRAL: usize = 2;
pub const PORN: usize = 3;
pub const SEXY: usize = 4;

/// Share of P(Sexy) counted as `sexual`. nsfwjs's "Sexy" class is suggestive
/// but not explicit (swimwear, lingerie, poses) and fires on ordinary beach
/// photos; counting it fully would flag those at the default threshold.
/// Counting a part still lets the frequent Porn/Sexy split of an explicit
/// image (say 0.4 / 0.4) cross 0.5, while a purely suggestive image tops out
/// at 0.3.
pub const SEXY_WEIGHT: f32 = 0.3;

/// Default decision threshold for `sexual`.
pub const DEFAULT_SEXUAL_THRESHOLD: f32 = 0.5;

/// Side of the square input the network takes.
pub const INPUT_SIZE: usize = 224;

/// Path of the converted weights below the models directory.
pub const WEIGHTS_FILE: &str = "nsfwjs/mobilenet_v2.safetensors";

/// Keras's BatchNormalization epsilon in this model.
const BN_EPSILON: f32 = 1e-3;

/// The inverted-residual blocks 1..=16 that downsample; all others keep the size.
const STRIDE_2_BLOCKS: [usize; 4] = [1, 3, 6, 13];

#[derive(Debug, thiserror::Error)]
pub enum NsfwError {
    #[error("the nsfwjs weights file {path} is missing; run scripts/setup.sh (or scripts/fetch-nsfwjs.sh) to fetch and convert it")]
    Missing { path: PathBuf },
    #[error("the nsfwjs weights file {path} is unreadable or not the expected model ({reason}); delete it and run scripts/setup.sh (or scripts/fetch-nsfwjs.sh)")]
    Corrupt { path: PathBuf, reason: String },
    #[error("nsfwjs input: {0}")]
    BadInput(String),
    #[error("nsfwjs inference failed: {0}")]
    Inference(#[from] candle_core::Error),
}

/// One convolution with batch normalisation folded in.
struct Pointwise {
    /// [out, in]
    weight: Tensor,
    /// [out, 1]
    bias: Tensor,
}

struct Depthwise {
    channels: usize,
    /// Per channel, the 3×3 kernel row-major.
    weight: Vec<[f32; 9]>,
    bias: Vec<f32>,
    stride: usize,
}

struct Block {
    expand: Option<Pointwise>,
    depthwise: Depthwise,
    project: Pointwise,
    residual: bool,
}

struct Dense {
    /// [in, out]
    weight: Tensor,
    /// [1, out]
    bias: Tensor,
}

/// nsfwjs's MobileNetV2, on the CPU.
pub struct NsfwClassifier {
    stem_weight: Tensor,
    stem_bias: Tensor,
    blocks: Vec<Block>,
    head_conv: Pointwise,
    dense: [Dense; 3],
}

impl NsfwClassifier {
    /// Loads `<models_dir>/nsfwjs/mobilenet_v2.safetensors`.
    pub fn load(models_dir: &Path) -> Result<NsfwClassifier, NsfwError> {
        let path = models_dir.join(WEIGHTS_FILE);
        let bytes = std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NsfwError::Missing { path: path.clone() },
            _ => NsfwError::Corrupt {
                path: path.clone(),
                reason: e.to_string(),
            },
        })?;
        let corrupt = |reason: String| NsfwError::Corrupt {
            path: path.clone(),
            reason,
        };
        let tensors = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| corrupt(e.to_string()))?;
        Weights { tensors }.build().map_err(corrupt)
    }

    /// The five class probabilities (in [`CLASSES`] order) nsfwjs gives for
    /// this image.
    pub fn class_probabilities(&self, image: &DecodedImage) -> Result<[f32; 5], NsfwError> {
        let input = preprocess(&image.rgb);
        self.forward(input)
    }

    /// The network on a preprocessed input: 224×224×3 values in [0, 1],
    /// height-width-channel order.
    pub fn class_probabilities_of_input(&self, input: &[f32]) -> Result<[f32; 5], NsfwError> {
        if input.len() != INPUT_SIZE * INPUT_SIZE * 3 {
            return Err(NsfwError::BadInput(format!(
                "expected {} values (224×224×3), got {}",
                INPUT_SIZE * INPUT_SIZE * 3,
                input.len()
            )));
        }
        self.forward(input.to_vec())
    }

    fn forward(&self, hwc: Vec<f32>) -> Result<[f32; 5], NsfwError> {
        let x = Tensor::from_vec(hwc, (INPUT_SIZE, INPUT_SIZE, 3), &Device::Cpu)?
            .permute((2, 0, 1))?
            .unsqueeze(0)?;
        // Keras's ZeroPadding2D((0, 1), (0, 1)) before every stride-2 "valid" conv.
        let x = x.pad_with_zeros(2, 0, 1)?.pad_with_zeros(3, 0, 1)?;
        let x = x.conv2d(&self.stem_weight, 0, 2, 1, 1)?.squeeze(0)?;
        let mut x = relu6(&x.broadcast_add(&self.stem_bias)?)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        let x = relu6(&self.head_conv.forward(&x)?)?;
        let (channels, h, w) = x.dims3()?;
        // AveragePooling2D(7×7) over the final 7×7 map, then Flatten.
        let mut x = x.reshape((channels, h * w))?.mean(1)?.unsqueeze(0)?;
        for (i, dense) in self.dense.iter().enumerate() {
            x = x.matmul(&dense.weight)?.broadcast_add(&dense.bias)?;
            if i < 2 {
                x = x.relu()?;
            }
        }
        let logits: Vec<f32> = x.flatten_all()?.to_vec1()?;
        Ok(softmax5(&logits))
    }
}

impl ImageClassifier for NsfwClassifier {
    fn model_id(&self) -> String {
        MODEL_ID.to_owned()
    }

    fn score(&self, image: &DecodedImage) -> anyhow::Result<ImageScores> {
        let p = self.class_probabilities(image)?;
        let mut scores = CategoryScores::default();
        scores.set(Category::Sexual, sexual_score(&p));
        Ok(ImageScores {
            scores,
            evaluated: vec![Category::Sexual],
        })
    }

    fn default_thresholds(&self) -> Thresholds {
        // Only `sexual` is evaluated; the other categories always score 0
        // and never reach any positive threshold.
        Thresholds::uniform(DEFAULT_SEXUAL_THRESHOLD)
    }
}

/// The `sexual` score from the class probabilities: explicit classes in
/// full, the suggestive one in part (see [`SEXY_WEIGHT`]).
pub fn sexual_score(p: &[f32; 5]) -> f32 {
    (p[PORN] + p[HENTAI] + SEXY_WEIGHT * p[SEXY]).clamp(0.0, 1.0)
}

fn softmax5(logits: &[f32]) -> [f32; 5] {
    let mut out = [0.0f32; 5];
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for (o, &l) in out.iter_mut().zip(logits) {
        *o = (l - max).exp();
        sum += *o;
    }
    out.iter_mut().for_each(|o| *o /= sum);
    out
}

fn relu6(x: &Tensor) -> candle_core::Result<Tensor> {
    x.clamp(0f32, 6f32)
}

impl Pointwise {
    /// `x`: [in, h, w] → [out, h, w].
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, h, w) = x.dims3()?;
        let y = self
            .weight
            .matmul(&x.reshape((c, h * w))?)?
            .broadcast_add(&self.bias)?;
        let out = self.weight.dim(0)?;
        y.reshape((out, h, w))
    }
}

impl Block {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = match &self.expand {
            Some(expand) => relu6(&expand.forward(x)?)?,
            None => x.clone(),
        };
        let h = self.depthwise.forward(&h)?;
        let h = self.project.forward(&h)?;
        if self.residual {
            h + x
        } else {
            Ok(h)
        }
    }
}

impl Depthwise {
    /// 3×3 depthwise convolution + bias + ReLU6 on [c, h, w]. Stride 1 pads
    /// one pixel all round (Keras "same"); stride 2 pads one at the bottom
    /// and right only (ZeroPadding2D((0, 1), (0, 1)) then "valid").
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (c, h, w) = x.dims3()?;
        if c != self.channels {
            candle_core::bail!("depthwise conv expects {} channels, got {c}", self.channels);
        }
        let input: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let (pad, ho, wo) = if self.stride == 1 {
            (1, h, w)
        } else {
            (0, h.saturating_sub(2) / 2 + 1, w.saturating_sub(2) / 2 + 1)
        };
        let mut out = vec![0f32; c * ho * wo];
        for ch in 0..c {
            let plane = &input[ch * h * w..(ch + 1) * h * w];
            let dst = &mut out[ch * ho * wo..(ch + 1) * ho * wo];
            depthwise_plane(
                plane,
                (h, w),
                dst,
                (ho, wo),
                &self.weight[ch],
                self.stride,
                pad,
            );
            let b = self.bias[ch];
            dst.iter_mut().for_each(|v| *v = (*v + b).clamp(0.0, 6.0));
        }
        Tensor::from_vec(out, (c, ho, wo), &Device::Cpu)
    }
}

/// One channel: `dst[y][x] = Σ k[ky][kx] · src[s·y + ky − pad][s·x + kx − pad]`,
/// out-of-range source pixels being zero.
fn depthwise_plane(
    src: &[f32],
    (h, w): (usize, usize),
    dst: &mut [f32],
    (ho, wo): (usize, usize),
    k: &[f32; 9],
    stride: usize,
    pad: usize,
) {
    for oy in 0..ho {
        let row = &mut dst[oy * wo..(oy + 1) * wo];
        for ky in 0..3 {
            let Some(iy) = (oy * stride + ky).checked_sub(pad).filter(|&iy| iy < h) else {
                continue;
            };
            let src_row = &src[iy * w..(iy + 1) * w];
            for kx in 0..3 {
                let weight = k[ky * 3 + kx];
                // Output columns whose source column ox·s + kx − pad is in [0, w).
                let first = pad.saturating_sub(kx).div_ceil(stride);
                let Some(span) = (w + pad).checked_sub(kx + 1) else {
                    continue;
                };
                let last = (span / stride + 1).min(wo);
                if stride == 1 {
                    let offset = first + kx - pad;
                    let n = last.saturating_sub(first);
                    for (d, s) in row[first..first + n]
                        .iter_mut()
                        .zip(&src_row[offset..offset + n])
                    {
                        *d += weight * s;
                    }
                } else {
                    for (ox, d) in row.iter_mut().enumerate().take(last).skip(first) {
                        *d += weight * src_row[ox * stride + kx - pad];
                    }
                }
            }
        }
    }
}

/// nsfwjs's preprocessing into 224×224×3 values in [0, 1] (HWC).
/// Values are normalised as they are read, so a large image is never copied
/// whole into floats (12 bytes a pixel); the result is bit-identical.
pub fn preprocess(rgb: &image::RgbImage) -> Vec<f32> {
    let raw = rgb.as_raw();
    let normalized = |i: usize| f32::from(raw[i]) / 255.0;
    let (w, h) = (rgb.width() as usize, rgb.height() as usize);
    if (w, h) == (INPUT_SIZE, INPUT_SIZE) {
        (0..raw.len()).map(normalized).collect()
    } else {
        resize_bilinear_with(normalized, (h, w), (INPUT_SIZE, INPUT_SIZE))
    }
}

/// `tf.image.resizeBilinear(x, [out_h, out_w], alignCorners = true)` on an
/// HWC image with 3 channels, following tfjs's CPU kernel.
pub fn resize_bilinear_align_corners(
    src: &[f32],
    size: (usize, usize),
    out_size: (usize, usize),
) -> Vec<f32> {
    resize_bilinear_with(|i| src[i], size, out_size)
}

/// The same, reading the source's value at flat index `i` through `src`.
fn resize_bilinear_with(
    src: impl Fn(usize) -> f32,
    (h, w): (usize, usize),
    (out_h, out_w): (usize, usize),
) -> Vec<f32> {
    let scale = |input: usize, output: usize| -> f64 {
        if output > 1 {
            (input as f64 - 1.0) / (output as f64 - 1.0)
        } else {
            input as f64 / output as f64
        }
    };
    let (sy, sx) = (scale(h, out_h), scale(w, out_w));
    let mut out = Vec::with_capacity(out_h * out_w * 3);
    for oy in 0..out_h {
        let fy = sy * oy as f64;
        let (y0, y1) = (
            (fy.floor() as usize).min(h - 1),
            (fy.ceil() as usize).min(h - 1),
        );
        let dy = (fy - fy.floor()) as f32;
        for ox in 0..out_w {
            let fx = sx * ox as f64;
            let (x0, x1) = (
                (fx.floor() as usize).min(w - 1),
                (fx.ceil() as usize).min(w - 1),
            );
            let dx = (fx - fx.floor()) as f32;
            for c in 0..3 {
                let at = |y: usize, x: usize| src((y * w + x) * 3 + c);
                let top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * dx;
                let bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * dx;
                out.push(top + (bottom - top) * dy);
            }
        }
    }
    out
}

/// The converted tensors, by Keras name.
struct Weights {
    tensors: HashMap<String, Tensor>,
}

impl Weights {
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, String> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| format!("tensor {name} is missing"))?;
        if t.dims() != shape {
            return Err(format!(
                "tensor {name} has shape {:?}, expected {shape:?}",
                t.dims()
            ));
        }
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .map_err(|e| format!("tensor {name}: {e}"))
    }

    fn shape(&self, name: &str) -> Result<Vec<usize>, String> {
        self.tensors
            .get(name)
            .map(|t| t.dims().to_vec())
            .ok_or_else(|| format!("tensor {name} is missing"))
    }

    /// Per-channel (scale, shift) that batch normalisation applies.
    fn batch_norm(&self, prefix: &str, channels: usize) -> Result<(Vec<f32>, Vec<f32>), String> {
        let gamma = self.get(&format!("{prefix}/gamma"), &[channels])?;
        let beta = self.get(&format!("{prefix}/beta"), &[channels])?;
        let mean = self.get(&format!("{prefix}/moving_mean"), &[channels])?;
        let var = self.get(&format!("{prefix}/moving_variance"), &[channels])?;
        let scale: Vec<f32> = gamma
            .iter()
            .zip(&var)
            .map(|(g, v)| g / (v + BN_EPSILON).sqrt())
            .collect();
        let shift = beta
            .iter()
            .zip(&mean)
            .zip(&scale)
            .map(|((b, m), s)| b - m * s)
            .collect();
        Ok((scale, shift))
    }

    fn pointwise(&self, conv: &str, bn: &str) -> Result<Pointwise, String> {
        let shape = self.shape(&format!("{conv}/kernel"))?;
        let [1, 1, cin, cout] = shape[..] else {
            return Err(format!(
                "tensor {conv}/kernel has shape {shape:?}, expected a 1×1 kernel"
            ));
        };
        let kernel = self.get(&format!("{conv}/kernel"), &[1, 1, cin, cout])?;
        let (scale, shift) = self.batch_norm(bn, cout)?;
        let mut weight = vec![0f32; cout * cin];
        for o in 0..cout {
            for i in 0..cin {
                weight[o * cin + i] = kernel[i * cout + o] * scale[o];
            }
        }
        Ok(Pointwise {
            weight: tensor(weight, &[cout, cin])?,
            bias: tensor(shift, &[cout, 1])?,
        })
    }

    fn depthwise(
        &self,
        conv: &str,
        bn: &str,
        channels: usize,
        stride: usize,
    ) -> Result<Depthwise, String> {
        let kernel = self.get(&format!("{conv}/depthwise_kernel"), &[3, 3, channels, 1])?;
        let (scale, shift) = self.batch_norm(bn, channels)?;
        let weight = (0..channels)
            .map(|c| std::array::from_fn(|k| kernel[k * channels + c] * scale[c]))
            .collect();
        Ok(Depthwise {
            channels,
            weight,
            bias: shift,
            stride,
        })
    }

    fn dense(&self, name: &str, inputs: usize, outputs: usize) -> Result<Dense, String> {
        let weight = self.get(&format!("{name}/kernel"), &[inputs, outputs])?;
        let bias = self.get(&format!("{name}/bias"), &[outputs])?;
        Ok(Dense {
            weight: tensor(weight, &[inputs, outputs])?,
            bias: tensor(bias, &[1, outputs])?,
        })
    }

    fn block(&self, index: usize, in_channels: usize) -> Result<(Block, usize), String> {
        let name = |part: &str| format!("block_{index}_{part}");
        let expand = self.pointwise(&name("expand"), &name("expand_BN"))?;
        let hidden = expand.weight.dim(0).map_err(|e| e.to_string())?;
        if expand.weight.dim(1).map_err(|e| e.to_string())? != in_channels {
            return Err(format!(
                "block {index} expects {in_channels} input channels"
            ));
        }
        let stride = if STRIDE_2_BLOCKS.contains(&index) {
            2
        } else {
            1
        };
        let depthwise =
            self.depthwise(&name("depthwise"), &name("depthwise_BN"), hidden, stride)?;
        let project = self.pointwise(&name("project"), &name("project_BN"))?;
        let out = project.weight.dim(0).map_err(|e| e.to_string())?;
        let residual = stride == 1 && out == in_channels;
        Ok((
            Block {
                expand: Some(expand),
                depthwise,
                project,
                residual,
            },
            out,
        ))
    }

    fn build(&self) -> Result<NsfwClassifier, String> {
        let stem = self.get("Conv1/kernel", &[3, 3, 3, 32])?;
        let (scale, shift) = self.batch_norm("bn_Conv1", 32)?;
        // HWIO → OIHW, scaled by the folded batch norm.
        let mut stem_oihw = vec![0f32; 32 * 3 * 9];
        for o in 0..32 {
            for i in 0..3 {
                for k in 0..9 {
                    stem_oihw[(o * 3 + i) * 9 + k] = stem[(k * 3 + i) * 32 + o] * scale[o];
                }
            }
        }
        let first = Block {
            expand: None,
            depthwise: self.depthwise(
                "expanded_conv_depthwise",
                "expanded_conv_depthwise_BN",
                32,
                1,
            )?,
            project: self.pointwise("expanded_conv_project", "expanded_conv_project_BN")?,
            residual: false,
        };
        let mut channels = first.project.weight.dim(0).map_err(|e| e.to_string())?;
        let mut blocks = vec![first];
        for index in 1..=16 {
            let (block, out) = self.block(index, channels)?;
            blocks.push(block);
            channels = out;
        }
        let head_conv = self.pointwise("Conv_1", "Conv_1_bn")?;
        let features = head_conv.weight.dim(0).map_err(|e| e.to_string())?;
        Ok(NsfwClassifier {
            stem_weight: tensor(stem_oihw, &[32, 3, 3, 3])?,
            stem_bias: tensor(shift, &[32, 1, 1])?,
            blocks,
            head_conv,
            dense: [
                self.dense("dense_1", features, 256)?,
                self.dense("dense_2", 256, 128)?,
                self.dense("dense_3", 128, 5)?,
            ],
        })
    }
}

fn tensor(values: Vec<f32>, shape: &[usize]) -> Result<Tensor, String> {
    Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
