//! A fine-tuning of the encoder as low-rank adapters: for each adapted
//! dense layer `W` (out × in) of the base weights, a pair `A` (rank × in)
//! and `B` (out × rank, its scale folded in), and the weight used is
//! `W + B·A`. `train/finetune_encoder.py` trains them, and the `embed`
//! example measures heads trained on them exactly as they would be served.
//!
//! Why a delta: the base weights come from a package registry by pinned
//! version and checksum (`scripts/fetch-minilm.sh`); a fine-tuned copy of
//! all 91 MB could be neither fetched from one nor committed, while the
//! adapters are a few hundred thousand numbers (0.7 MB in half precision)
//! that could live beside heads.json. Heads name the adapter they were
//! trained with by its sha256, so heads and encoder cannot be paired
//! wrongly. None is shipped: the two tried did not beat the base encoder on
//! the validation half (eval/ABLATION-real.md).

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use sha2::{Digest, Sha256};

use super::TextModelError;

const A_SUFFIX: &str = ".lora_a";
const B_SUFFIX: &str = ".lora_b";

/// An adapter file's bytes, checked against the sha256 the heads name.
pub struct Adapter<'a> {
    bytes: &'a [u8],
}

impl<'a> Adapter<'a> {
    /// `bytes` when their sha256 is `expected` (lowercase hex).
    pub fn verified(bytes: &'a [u8], expected: &str) -> Result<Adapter<'a>, TextModelError> {
        let actual = sha256(bytes);
        if actual != expected {
            return Err(TextModelError::Invalid(format!(
                "the heads were trained with the encoder adapter {expected}, \
                 but the adapter given has sha256 {actual}"
            )));
        }
        Ok(Adapter { bytes })
    }

    /// Adds `B·A` to every weight of `base` the adapter names. Every pair must
    /// be complete and fit its weight's shape: a partial adapter would serve
    /// an encoder no head was trained on.
    pub fn apply(&self, base: &mut HashMap<String, Tensor>) -> Result<(), TextModelError> {
        let invalid = |m: String| TextModelError::Invalid(format!("encoder adapter: {m}"));
        let tensors = candle_core::safetensors::load_buffer(self.bytes, &Device::Cpu)?;
        if tensors.is_empty() {
            return Err(invalid("it holds no tensor".into()));
        }
        for (name, a) in &tensors {
            if let Some(weight) = name.strip_suffix(A_SUFFIX) {
                let b = tensors
                    .get(&format!("{weight}{B_SUFFIX}"))
                    .ok_or_else(|| invalid(format!("{name} has no {B_SUFFIX} pair")))?;
                let w = base
                    .get(weight)
                    .ok_or_else(|| invalid(format!("{weight} is not a weight of the encoder")))?;
                let merged = merge(w, a, b).map_err(|e| invalid(format!("{weight}: {e}")))?;
                base.insert(weight.to_string(), merged);
            } else if let Some(weight) = name.strip_suffix(B_SUFFIX) {
                if !tensors.contains_key(&format!("{weight}{A_SUFFIX}")) {
                    return Err(invalid(format!("{name} has no {A_SUFFIX} pair")));
                }
            } else {
                return Err(invalid(format!(
                    "{name} is neither {A_SUFFIX} nor {B_SUFFIX}"
                )));
            }
        }
        Ok(())
    }
}

/// `w + b·a` in f32, when the shapes fit: `w` out × in, `a` rank × in, `b`
/// out × rank.
fn merge(w: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor, String> {
    let (out, inputs) = w.dims2().map_err(|e| e.to_string())?;
    let (rank, a_in) = a.dims2().map_err(|e| e.to_string())?;
    let (b_out, b_rank) = b.dims2().map_err(|e| e.to_string())?;
    if a_in != inputs || b_out != out || b_rank != rank {
        return Err(format!(
            "shapes do not fit: weight {out}×{inputs}, a {rank}×{a_in}, b {b_out}×{b_rank}"
        ));
    }
    let f32 = |t: &Tensor| t.to_dtype(DType::F32);
    let delta = f32(b)
        .and_then(|b| f32(a).and_then(|a| b.matmul(&a)))
        .map_err(|e| e.to_string())?;
    f32(w).and_then(|w| w + delta).map_err(|e| e.to_string())
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(values: &[f32], rows: usize, cols: usize) -> Tensor {
        Tensor::from_slice(values, (rows, cols), &Device::Cpu).unwrap()
    }

    fn file(tensors: &[(&str, Tensor)]) -> Vec<u8> {
        let map: HashMap<String, Tensor> = tensors
            .iter()
            .map(|(n, t)| (n.to_string(), t.clone()))
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.safetensors");
        candle_core::safetensors::save(&map, &path).unwrap();
        std::fs::read(path).unwrap()
    }

    fn base() -> HashMap<String, Tensor> {
        HashMap::from([("l.weight".to_string(), tensor(&[1.0, 0.0, 0.0, 1.0], 2, 2))])
    }

    #[test]
    fn the_product_of_the_pair_is_added_to_its_weight() {
        // b·a = [1, 2]ᵀ · [3, 4] = [[3, 4], [6, 8]]
        let bytes = file(&[
            ("l.weight.lora_a", tensor(&[3.0, 4.0], 1, 2)),
            ("l.weight.lora_b", tensor(&[1.0, 2.0], 2, 1)),
        ]);
        let mut weights = base();
        Adapter::verified(&bytes, &sha256(&bytes))
            .unwrap()
            .apply(&mut weights)
            .unwrap();
        let merged: Vec<Vec<f32>> = weights["l.weight"].to_vec2().unwrap();
        assert_eq!(merged, vec![vec![4.0, 4.0], vec![6.0, 9.0]]);
    }

    #[test]
    fn another_adapter_than_the_heads_name_is_refused() {
        let bytes = file(&[("l.weight.lora_a", tensor(&[3.0, 4.0], 1, 2))]);
        let err = Adapter::verified(&bytes, &"0".repeat(64)).err().unwrap();
        assert!(err.to_string().contains("trained with the encoder adapter"));
    }

    #[test]
    fn unpaired_misnamed_or_misshapen_adapters_are_refused() {
        let a = || tensor(&[3.0, 4.0], 1, 2);
        let b = || tensor(&[1.0, 2.0], 2, 1);
        let cases = [
            (vec![("l.weight.lora_a", a())], "no .lora_b pair"),
            (vec![("l.weight.lora_b", b())], "no .lora_a pair"),
            (
                vec![("other.weight.lora_a", a()), ("other.weight.lora_b", b())],
                "not a weight of the encoder",
            ),
            (
                vec![("l.weight.lora_a", a()), ("l.weight.lora_b", a())],
                "shapes do not fit",
            ),
            (vec![("l.weight", a())], "neither"),
        ];
        for (tensors, expected) in cases {
            let bytes = file(&tensors);
            let err = Adapter::verified(&bytes, &sha256(&bytes))
                .unwrap()
                .apply(&mut base())
                .err()
                .unwrap();
            assert!(err.to_string().contains(expected), "{err} lacks {expected}");
        }
    }
}
