//! 8-bit matrix multiplication for the text encoder's dense layers.
//!
//! Weights and activations are both quantised symmetrically in blocks of 32
//! along the shared dimension, each block with its own f32 scale, so one
//! large value only coarsens its own block. Products of 8-bit values are
//! summed exactly in integers and scaled once per block.
//!
//! Why: the f32 weights of MiniLM's dense layers (42 MB) do not fit in this
//! class of machine's cache, so every forward pass streams them from memory;
//! for a short message that took most of the time. As 8-bit blocks they are
//! 11 MB and stay cached.

use rayon::prelude::*;

/// Values per quantisation block.
pub const BLOCK: usize = 32;

/// A matrix of `rows x cols` weights (`cols` a multiple of [`BLOCK`]),
/// row-major, as `i8` values with one scale per block of a row.
pub struct Int8Matrix {
    rows: usize,
    cols: usize,
    values: Vec<i8>,
    scales: Vec<f32>,
}

/// Activations `m x k`, quantised like the weights but widened to `i16`
/// (the kernel multiplies 16-bit pairs).
struct Int8Rows {
    k: usize,
    values: Vec<i16>,
    scales: Vec<f32>,
}

/// Quantises `src` block by block to `[-127, 127]` (as `T`), with one
/// scale per block. An all-zero or non-finite block becomes zeros with
/// scale 0, so it cannot poison the others.
fn quantize_blocks<T: Copy + Default>(src: &[f32], to: fn(i32) -> T) -> (Vec<T>, Vec<f32>) {
    let mut values = vec![T::default(); src.len()];
    let scales = src
        .chunks_exact(BLOCK)
        .zip(values.chunks_exact_mut(BLOCK))
        .map(|(block, out)| {
            let max = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            if max == 0.0 || !max.is_finite() {
                out.fill(to(0));
                return 0.0;
            }
            let inv = 127.0 / max;
            for (o, v) in out.iter_mut().zip(block) {
                *o = to((v * inv).round().clamp(-127.0, 127.0) as i32);
            }
            max / 127.0
        })
        .collect();
    (values, scales)
}

impl Int8Matrix {
    /// Quantises a row-major `rows x cols` f32 matrix.
    pub fn quantize(weights: &[f32], rows: usize, cols: usize) -> Int8Matrix {
        assert_eq!(weights.len(), rows * cols, "weights are not rows x cols");
        assert!(cols % BLOCK == 0, "cols must be a multiple of {BLOCK}");
        let (values, scales) = quantize_blocks(weights, |q| q as i8);
        Int8Matrix {
            rows,
            cols,
            values,
            scales,
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `out = x · selfᵀ` for `x` of `m x cols` (row-major); `out` is `m x rows`.
    pub fn matmul(&self, x: &[f32], m: usize, out: &mut [f32]) {
        assert_eq!(x.len(), m * self.cols, "input is not m x cols");
        assert_eq!(out.len(), m * self.rows, "output is not m x rows");
        let xq = Int8Rows::quantize(x, m, self.cols);
        // Columns of the output in chunks; small products stay on one thread,
        // where waking a second would cost more than it saves.
        let work = m * self.rows * self.cols;
        let chunk = if work < 1 << 20 { self.rows } else { 64 };
        let mut columns: Vec<(usize, Vec<f32>)> = (0..self.rows)
            .step_by(chunk)
            .map(|start| (start, Vec::new()))
            .collect();
        columns.par_iter_mut().for_each(|(start, buf)| {
            let end = (*start + chunk).min(self.rows);
            *buf = vec![0f32; m * (end - *start)];
            kernel::run(self, &xq, *start..end, buf);
        });
        for (start, buf) in columns {
            let width = buf.len() / m.max(1);
            for r in 0..m {
                out[r * self.rows + start..r * self.rows + start + width]
                    .copy_from_slice(&buf[r * width..(r + 1) * width]);
            }
        }
    }
}

impl Int8Rows {
    fn quantize(x: &[f32], m: usize, k: usize) -> Int8Rows {
        debug_assert_eq!(x.len(), m * k);
        let (values, scales) = quantize_blocks(x, |q| q as i16);
        Int8Rows { k, values, scales }
    }
}

mod kernel {
    use super::{Int8Matrix, Int8Rows, BLOCK};
    use std::ops::Range;

    /// Fills `out` (`m x cols.len()`, row-major) with the products of every
    /// activation row and the weight rows in `cols`.
    pub(super) fn run(w: &Int8Matrix, x: &Int8Rows, cols: Range<usize>, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            unsafe { avx2::run(w, x, cols, out) };
            return;
        }
        portable(w, x, cols, out);
    }

    /// The same sums in plain Rust, for CPUs without AVX2.
    pub(super) fn portable(w: &Int8Matrix, x: &Int8Rows, cols: Range<usize>, out: &mut [f32]) {
        let blocks = x.k / BLOCK;
        let width = cols.len();
        for (j, n) in cols.enumerate() {
            let wrow = &w.values[n * x.k..(n + 1) * x.k];
            let wscale = &w.scales[n * blocks..(n + 1) * blocks];
            for (r, (xrow, xscale)) in x
                .values
                .chunks_exact(x.k)
                .zip(x.scales.chunks_exact(blocks))
                .enumerate()
            {
                let mut acc = 0f32;
                for b in 0..blocks {
                    let span = b * BLOCK..(b + 1) * BLOCK;
                    let dot: i32 = wrow[span.clone()]
                        .iter()
                        .zip(&xrow[span])
                        .map(|(&a, &c)| a as i32 * c as i32)
                        .sum();
                    acc += dot as f32 * (wscale[b] * xscale[b]);
                }
                out[r * width + j] = acc;
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod avx2 {
        use super::super::{Int8Matrix, Int8Rows, BLOCK};
        use std::arch::x86_64::*;
        use std::ops::Range;

        /// Activation rows handled together, so each weight block is
        /// widened once and used four times.
        const ROWS: usize = 4;
        /// Activation rows per cache tile: 32 x 1536 16-bit values = 96 KB.
        const TILE_ROWS: usize = 32;

        #[target_feature(enable = "avx2,fma")]
        pub(in super::super) unsafe fn run(
            w: &Int8Matrix,
            x: &Int8Rows,
            cols: Range<usize>,
            out: &mut [f32],
        ) {
            let k = x.k;
            let blocks = k / BLOCK;
            let m = x.values.len() / k;
            let width = cols.len();
            // A tile of activation rows stays in cache while every weight
            // row of the chunk passes over it.
            for tile in (0..m).step_by(TILE_ROWS) {
                let tile_end = (tile + TILE_ROWS).min(m);
                for (j, n) in cols.clone().enumerate() {
                    let wrow = w.values[n * k..(n + 1) * k].as_ptr();
                    let wscale = &w.scales[n * blocks..(n + 1) * blocks];
                    let mut r = tile;
                    while r < tile_end {
                        let rows = (tile_end - r).min(ROWS);
                        let mut acc = [_mm256_setzero_ps(); ROWS];
                        for (b, &ws) in wscale.iter().enumerate() {
                            // SAFETY: b * BLOCK + 32 <= k bytes of this weight row.
                            let raw = _mm256_loadu_si256(wrow.add(b * BLOCK) as *const __m256i);
                            let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw));
                            let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(raw));
                            for (i, a) in acc.iter_mut().enumerate().take(rows) {
                                let row = r + i;
                                // SAFETY: row < m and b * BLOCK + 32 <= k values of that row.
                                let xs = x.values.as_ptr().add(row * k + b * BLOCK);
                                let xlo = _mm256_loadu_si256(xs as *const __m256i);
                                let xhi = _mm256_loadu_si256(xs.add(16) as *const __m256i);
                                let sum = _mm256_add_epi32(
                                    _mm256_madd_epi16(lo, xlo),
                                    _mm256_madd_epi16(hi, xhi),
                                );
                                let scale = _mm256_set1_ps(ws * x.scales[row * blocks + b]);
                                *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *a);
                            }
                        }
                        for (i, a) in acc.iter().enumerate().take(rows) {
                            out[(r + i) * width + j] = horizontal_sum(*a);
                        }
                        r += rows;
                    }
                }
            }
        }

        #[target_feature(enable = "avx2,fma")]
        unsafe fn horizontal_sum(v: __m256) -> f32 {
            let pair = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let quad = _mm_add_ps(pair, _mm_movehl_ps(pair, pair));
            let one = _mm_add_ss(quad, _mm_shuffle_ps::<1>(quad, quad));
            _mm_cvtss_f32(one)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random matrix with a few large values, as
    /// trained weights and activations have.
    fn matrix(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..rows * cols)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if i % 97 == 0 {
                    u * 8.0
                } else {
                    u
                }
            })
            .collect()
    }

    fn reference(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k).map(|i| x[r * k + i] * w[c * k + i]).sum();
            }
        }
        out
    }

    fn max_error(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    /// The worst error rounding to 8-bit blocks can cause in each product:
    /// every value moves by at most half its block's step.
    fn rounding_bound(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
        let step = |v: &[f32]| v.iter().fold(0f32, |a, b| a.max(b.abs())) / 127.0;
        let mut out = vec![0f32; m * n];
        for r in 0..m {
            for c in 0..n {
                out[r * n + c] = (0..k / BLOCK)
                    .map(|b| {
                        let (xs, ws) = (
                            &x[r * k + b * BLOCK..][..BLOCK],
                            &w[c * k + b * BLOCK..][..BLOCK],
                        );
                        let (dx, dw) = (step(xs) / 2.0, step(ws) / 2.0);
                        xs.iter()
                            .zip(ws)
                            .map(|(a, b)| b.abs() * dx + a.abs() * dw + dx * dw)
                            .sum::<f32>()
                    })
                    .sum();
            }
        }
        out
    }

    fn assert_within_rounding(w: &[f32], x: &[f32], m: usize, n: usize, k: usize, out: &[f32]) {
        let exact = reference(w, x, m, n, k);
        let bound = rounding_bound(w, x, m, n, k);
        for (i, ((o, e), b)) in out.iter().zip(&exact).zip(&bound).enumerate() {
            assert!(
                (o - e).abs() <= b * 1.001 + 1e-4,
                "m={m} [{i}]: {o} vs {e}, bound {b}"
            );
        }
    }

    #[test]
    fn products_are_close_to_f32_for_every_row_count() {
        let (n, k) = (96, 384);
        let w = matrix(n, k, 1);
        let q = Int8Matrix::quantize(&w, n, k);
        for m in [1, 2, 3, 4, 5, 9, 33] {
            let x = matrix(m, k, 7 + m as u64);
            let mut out = vec![0f32; m * n];
            q.matmul(&x, m, &mut out);
            assert_within_rounding(&w, &x, m, n, k, &out);
        }
    }

    #[test]
    fn the_simd_kernel_sums_like_the_portable_one() {
        let (m, n, k) = (6, 40, 128);
        let w = Int8Matrix::quantize(&matrix(n, k, 3), n, k);
        let x = Int8Rows::quantize(&matrix(m, k, 4), m, k);
        let mut fast = vec![0f32; m * n];
        let mut plain = vec![0f32; m * n];
        kernel::run(&w, &x, 0..n, &mut fast);
        kernel::portable(&w, &x, 0..n, &mut plain);
        assert!(
            max_error(&fast, &plain) < 1e-4,
            "{}",
            max_error(&fast, &plain)
        );
    }

    #[test]
    fn large_products_split_across_threads_keep_column_order() {
        let (m, n, k) = (40, 200, 256);
        let w = matrix(n, k, 5);
        let x = matrix(m, k, 6);
        let q = Int8Matrix::quantize(&w, n, k);
        let mut out = vec![0f32; m * n];
        q.matmul(&x, m, &mut out);
        assert_within_rounding(&w, &x, m, n, k, &out);
    }

    #[test]
    fn zero_and_non_finite_blocks_do_not_poison_others() {
        let (n, k) = (2, 64);
        let mut w = matrix(n, k, 8);
        w[..BLOCK].fill(0.0);
        let q = Int8Matrix::quantize(&w, n, k);
        let x = matrix(1, k, 9);
        let mut out = vec![0f32; n];
        q.matmul(&x, 1, &mut out);
        assert!(out.iter().all(|v| v.is_finite()));
    }
}
