//! The encoder's f32 operations around the 8-bit products: layer norm,
//! GELU, softmax's exponential, mean pooling, and an f32 reference product.
//! Compiled optimised in every profile (this crate), in a baseline and an
//! AVX2 build that give the same bits (see `simd`).

use crate::simd::{dispatch, lane_sum, sum_by, LANES};
use crate::Activation;

dispatch! {
    /// `dst[i] += src[i]`.
    pub fn add_in_place(dst: &mut [f32], src: &[f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d += *s;
        }
    }
}

dispatch! {
    /// `x = LayerNorm(x + residual)` for each row of `gamma.len()` values
    /// (biased variance, as BERT).
    pub fn add_layer_norm(
        x: &mut [f32],
        residual: Option<&[f32]>,
        gamma: &[f32],
        beta: &[f32],
        eps: f32,
    ) {
        let hidden = gamma.len();
        for (r, row) in x.chunks_exact_mut(hidden).enumerate() {
            if let Some(residual) = residual {
                for (a, b) in row.iter_mut().zip(&residual[r * hidden..(r + 1) * hidden]) {
                    *a += *b;
                }
            }
            let mean = sum_by(row, |v| v) / hidden as f32;
            let var = sum_by(row, |v| (v - mean) * (v - mean)) / hidden as f32;
            let inv = 1.0 / (var + eps).sqrt();
            for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
                *v = (*v - mean) * inv * *g + *b;
            }
        }
    }
}

dispatch! {
    /// BERT's GELU, `x · Φ(x)` with the exact (erf) normal CDF.
    pub fn gelu_in_place(x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = gelu(*v);
        }
    }
}

#[inline(always)]
pub fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2))
}

/// The error function to a few units in the last place: a rational
/// approximation on [-4, 4] (Eigen's and XLA's `erf` for f32), beyond
/// which erf is ±1 in f32. Branch-free, so loops over it vectorise.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.726_142e-10 + 2.770_681_4e-8;
    p = x2 * p + -2.101_024e-6;
    p = x2 * p + -5.692_506_4e-5;
    p = x2 * p + -7.349_906_3e-4;
    p = x2 * p + -2.9546e-3;
    p = x2 * p + -1.609_603_3e-2;
    p *= x;
    let mut q = x2 * -1.456_607_2e-5 + -2.133_740_6e-4;
    q = x2 * q + -1.682_827e-3;
    q = x2 * q + -7.373_329_3e-3;
    q = x2 * q + -1.426_473_9e-2;
    p / q
}

/// `e^x` to about one unit in the last place (Cephes' `expf`): exact
/// powers of two times a polynomial on [-ln2/2, ln2/2]. Inputs below -87
/// give about 1e-38 instead of 0, which softmax cannot tell apart.
/// Branch-free, so loops over it vectorise.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    // 1.5 x 2^23: adding it rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let ni = t.to_bits() as i32 - ROUND.to_bits() as i32;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    y * f32::from_bits(((ni + 127) << 23) as u32)
}

dispatch! {
    /// The mean of `rows` (each `out.len()` values), scaled to unit length
    /// (sentence-transformers' pooling and normalisation).
    pub fn mean_pool_unit(rows: &[f32], out: &mut [f32]) {
        let hidden = out.len();
        out.fill(0.0);
        let count = rows.len() / hidden;
        for row in rows.chunks_exact(hidden) {
            for (o, v) in out.iter_mut().zip(row) {
                *o += *v;
            }
        }
        let inv_count = 1.0 / count.max(1) as f32;
        for o in out.iter_mut() {
            *o *= inv_count;
        }
        let norm = sum_by(out, |v| v * v).sqrt().max(1e-12);
        for o in out.iter_mut() {
            *o /= norm;
        }
    }
}

dispatch! {
    /// `out = act(x · wᵀ + bias)` in f32, for `x` of `m x k` and `w` of
    /// `bias.len() x k`: the reference the 8-bit products are held to.
    pub fn matmul_f32(
        x: &[f32],
        w: &[f32],
        m: usize,
        k: usize,
        bias: &[f32],
        act: Activation,
        out: &mut [f32],
    ) {
        let n = bias.len();
        for r in 0..m {
            let xr = &x[r * k..(r + 1) * k];
            for c in 0..n {
                let wr = &w[c * k..(c + 1) * k];
                let mut acc = [0f32; LANES];
                for (xs, ws) in xr.chunks(LANES).zip(wr.chunks(LANES)) {
                    for ((a, xv), wv) in acc.iter_mut().zip(xs).zip(ws) {
                        *a += xv * wv;
                    }
                }
                let v = lane_sum(acc) + bias[c];
                out[r * n + c] = match act {
                    Activation::Identity => v,
                    Activation::Gelu => gelu(v),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf from its Taylor series in f64: slow, and accurate to about 1e-9
    /// on [-4, 4].
    fn erf_reference(x: f64) -> f64 {
        let mut term = x;
        let mut sum = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn erf_and_gelu_are_within_float_noise() {
        for i in -6000..=6000 {
            let x = i as f32 / 1000.0;
            let want = erf_reference(x.clamp(-4.0, 4.0) as f64);
            assert!(
                (erf(x) as f64 - want).abs() < 5e-7,
                "erf({x}) = {} vs {want}",
                erf(x)
            );
            let g = 0.5 * x as f64 * (1.0 + erf_reference(x as f64 / 2f64.sqrt()));
            assert!(
                (gelu(x) as f64 - g).abs() < 2e-6 * (1.0 + g.abs()),
                "gelu({x}) = {} vs {g}",
                gelu(x)
            );
        }
    }

    #[test]
    fn exp_is_within_float_noise() {
        for i in -8700..=8800 {
            let x = i as f32 / 100.0;
            let want = (x as f64).exp();
            let rel = ((exp(x) as f64 - want) / want).abs();
            assert!(rel < 3e-7, "exp({x}) = {} vs {want}", exp(x));
        }
        assert!(exp(-1000.0) < 1e-37);
    }

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        let mut x: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let residual = vec![1.0f32; 16];
        let (gamma, beta) = (vec![2.0f32; 8], vec![0.5f32; 8]);
        add_layer_norm(&mut x, Some(&residual), &gamma, &beta, 1e-12);
        for row in x.chunks(8) {
            let mean: f32 = row.iter().sum::<f32>() / 8.0;
            assert!((mean - 0.5).abs() < 1e-5, "{row:?}");
            let var: f32 = row.iter().map(|v| (v - 0.5) * (v - 0.5)).sum::<f32>() / 8.0;
            assert!((var - 4.0).abs() < 1e-4, "{row:?}");
        }
    }

    #[test]
    fn mean_pool_is_the_unit_mean() {
        let rows = [3.0f32, 0.0, 3.0, 8.0];
        let mut out = [0f32; 2];
        mean_pool_unit(&rows, &mut out);
        assert!((out[0] - 0.6).abs() < 1e-6 && (out[1] - 0.8).abs() < 1e-6);
    }
}
