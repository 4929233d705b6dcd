//! Multi-head self-attention over a batch of sequences stored one after
//! another without padding: each sequence attends to its own tokens only,
//! so no token is computed for nothing and no mask is needed.

use std::ops::Range;

use rayon::prelude::*;

use crate::ops::exp;
use crate::simd::{dispatch, max_of, sum_by};

/// The context vectors of every token.
///
/// `qkv` holds per token its query, key and value (`3 * hidden` values,
/// `hidden = heads * head_dim`, each head's values contiguous); `seqs` are
/// the token ranges of the sequences, in order and disjoint; `out` gets
/// `hidden` values per token. Softmax(q·kᵀ/√d)·v per sequence and head.
pub fn attention(
    qkv: &[f32],
    seqs: &[Range<usize>],
    heads: usize,
    head_dim: usize,
    out: &mut [f32],
) {
    let hidden = heads * head_dim;
    let tokens = out.len() / hidden;
    assert_eq!(out.len(), tokens * hidden, "out is not tokens x hidden");
    assert_eq!(
        qkv.len(),
        tokens * 3 * hidden,
        "qkv is not tokens x 3 hidden"
    );
    let mut end = 0;
    for s in seqs {
        assert!(
            s.start >= end && s.end <= tokens,
            "sequences overlap or overrun"
        );
        end = s.end;
    }
    let out = Out(out.as_mut_ptr());
    let job = |(s, h): (usize, usize)| {
        let seq = &seqs[s];
        let mut scratch = SCRATCH.take();
        // SAFETY: the sequences are disjoint ranges of `out`'s rows and each
        // task writes one head's columns of one sequence's rows.
        unsafe {
            head(
                &qkv[seq.start * 3 * hidden..seq.end * 3 * hidden],
                h,
                heads,
                head_dim,
                out.at(seq.start * hidden),
                &mut scratch,
            )
        };
        SCRATCH.set(scratch);
    };
    let tasks = seqs.len() * heads;
    // Multiply-adds of the whole batch: small ones stay on one thread.
    let work: usize = seqs.iter().map(|s| s.len() * s.len()).sum::<usize>() * hidden;
    if !crate::split(work, 1 << 18) {
        (0..tasks).map(|t| (t / heads, t % heads)).for_each(job);
    } else {
        (0..tasks)
            .into_par_iter()
            .map(|t| (t / heads, t % heads))
            .for_each(job);
    }
}

#[derive(Clone, Copy)]
struct Out(*mut f32);

impl Out {
    /// # Safety
    /// `offset` must be within the buffer.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        self.0.add(offset)
    }
}
// SAFETY: see `attention`: tasks write disjoint parts.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

thread_local! {
    /// Transposed keys and one row of scores, reused by the tasks a thread runs.
    static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Head `h` of one sequence.
///
/// # Safety
/// `out` must point to the sequence's `len x hidden` outputs, whose
/// columns of head `h` no other thread touches.
unsafe fn head(
    qkv: &[f32],
    h: usize,
    heads: usize,
    head_dim: usize,
    out: *mut f32,
    scratch: &mut Vec<f32>,
) {
    let hidden = heads * head_dim;
    let len = qkv.len() / (3 * hidden);
    let outputs = std::slice::from_raw_parts_mut(out, len * hidden);
    head_into(qkv, h, head_dim, hidden, outputs, scratch);
}

dispatch! {
    fn head_into(
        qkv: &[f32],
        h: usize,
        head_dim: usize,
        hidden: usize,
        out: &mut [f32],
        scratch: &mut Vec<f32>,
    ) {
        let stride = 3 * hidden;
        let len = qkv.len() / stride;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (qo, ko, vo) = (h * head_dim, hidden + h * head_dim, 2 * hidden + h * head_dim);
        scratch.clear();
        // Key rows padded with zeros to whole chunks of scores.
        let padded = len.next_multiple_of(SCORE_CHUNK);
        scratch.resize(head_dim * padded + len, 0.0);
        let (kt, scores) = scratch.split_at_mut(head_dim * padded);
        // Keys transposed, so that a query's scores are sums of whole rows.
        for j in 0..len {
            for d in 0..head_dim {
                kt[d * padded + j] = qkv[j * stride + ko + d];
            }
        }
        for i in 0..len {
            let q = &qkv[i * stride + qo..i * stride + qo + head_dim];
            query_scores(q, kt, padded, scores);
            for s in scores.iter_mut() {
                *s *= scale;
            }
            let max = max_of(scores);
            for s in scores.iter_mut() {
                *s = exp(*s - max);
            }
            let inv = 1.0 / sum_by(scores, |v| v);
            let o = &mut out[i * hidden + h * head_dim..i * hidden + (h + 1) * head_dim];
            weighted_values(scores, inv, |j| &qkv[j * stride + vo..j * stride + vo + head_dim], o);
        }
    }
}

/// Values side by side in the accumulators below: four AVX2 registers.
const CHUNK: usize = 32;

/// Scores side by side in [`query_scores`]'s accumulators: one AVX-512
/// register, two AVX2 ones. Key rows are padded to a multiple of it.
const SCORE_CHUNK: usize = 16;

/// `scores[j] = Σ_d q[d] · kt[d * padded + j]`, summed over `d` in order;
/// `kt`'s rows are `padded` (a multiple of [`SCORE_CHUNK`]) long.
///
/// Why in chunks of keys held in local accumulators: summing into `scores`
/// in memory, one `d` at a time, made every step wait for the previous
/// one's store; attention then took as long as a layer's products for a
/// short text. The additions are the same, in the same order, so the bits
/// are too (the padding's lanes are computed and dropped).
#[inline(always)]
fn query_scores(q: &[f32], kt: &[f32], padded: usize, scores: &mut [f32]) {
    for (c, chunk) in scores.chunks_mut(SCORE_CHUNK).enumerate() {
        let j = c * SCORE_CHUNK;
        let mut acc = [0f32; SCORE_CHUNK];
        for (d, &qd) in q.iter().enumerate() {
            let k: &[f32; SCORE_CHUNK] = kt[d * padded + j..][..SCORE_CHUNK]
                .try_into()
                .expect("a whole chunk: rows are padded");
            for (a, k) in acc.iter_mut().zip(k) {
                *a += qd * *k;
            }
        }
        chunk.copy_from_slice(&acc[..chunk.len()]);
    }
}

/// `o = Σ_j (e[j] · inv) · value(j)`, summed over `j` in order, a chunk of
/// `o` at a time in local accumulators (see [`query_scores`]); a head's
/// values are a whole chunk in both encoders (32).
#[inline(always)]
fn weighted_values<'v>(e: &[f32], inv: f32, value: impl Fn(usize) -> &'v [f32], o: &mut [f32]) {
    for (c, chunk) in o.chunks_mut(CHUNK).enumerate() {
        let at = c * CHUNK;
        let mut acc = [0f32; CHUNK];
        if let Ok(acc) = <&mut [f32; CHUNK]>::try_from(&mut acc[..chunk.len()]) {
            for (j, &ej) in e.iter().enumerate() {
                let p = ej * inv;
                let v: &[f32; CHUNK] = value(j)[at..][..CHUNK].try_into().expect("a chunk");
                for (a, v) in acc.iter_mut().zip(v) {
                    *a += p * *v;
                }
            }
        } else {
            let acc = &mut acc[..chunk.len()];
            for (j, &ej) in e.iter().enumerate() {
                let p = ej * inv;
                for (a, v) in acc.iter_mut().zip(&value(j)[at..]) {
                    *a += p * *v;
                }
            }
        }
        chunk.copy_from_slice(&acc[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1664525).wrapping_add(1013904223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Straightforward attention of one sequence in f64.
    fn reference(qkv: &[f32], len: usize, heads: usize, dh: usize) -> Vec<f32> {
        let hidden = heads * dh;
        let at = |t: usize, part: usize, h: usize, d: usize| {
            qkv[t * 3 * hidden + part * hidden + h * dh + d] as f64
        };
        let mut out = vec![0f32; len * hidden];
        for h in 0..heads {
            for i in 0..len {
                let s: Vec<f64> = (0..len)
                    .map(|j| {
                        (0..dh)
                            .map(|d| at(i, 0, h, d) * at(j, 1, h, d))
                            .sum::<f64>()
                            / (dh as f64).sqrt()
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..dh {
                    out[i * hidden + h * dh + d] =
                        ((0..len).map(|j| e[j] * at(j, 2, h, d)).sum::<f64>() / sum) as f32;
                }
            }
        }
        out
    }

    /// The attention of one head as it was first written (scores summed in
    /// memory one `d` at a time): the bits the chunked loops must keep.
    fn head_as_first_written(qkv: &[f32], h: usize, dh: usize, hidden: usize) -> Vec<f32> {
        let stride = 3 * hidden;
        let len = qkv.len() / stride;
        let scale = 1.0 / (dh as f32).sqrt();
        let (qo, ko, vo) = (h * dh, hidden + h * dh, 2 * hidden + h * dh);
        let mut kt = vec![0f32; dh * len];
        for j in 0..len {
            for d in 0..dh {
                kt[d * len + j] = qkv[j * stride + ko + d];
            }
        }
        let mut out = vec![0f32; len * dh];
        let mut scores = vec![0f32; len];
        for i in 0..len {
            scores.fill(0.0);
            for d in 0..dh {
                for (s, k) in scores.iter_mut().zip(&kt[d * len..(d + 1) * len]) {
                    *s += qkv[i * stride + qo + d] * *k;
                }
            }
            for s in scores.iter_mut() {
                *s *= scale;
            }
            let max = max_of(&scores);
            for s in scores.iter_mut() {
                *s = exp(*s - max);
            }
            let inv = 1.0 / sum_by(&scores, |v| v);
            for (j, &e) in scores.iter().enumerate() {
                let p = e * inv;
                for d in 0..dh {
                    out[i * dh + d] += p * qkv[j * stride + vo + d];
                }
            }
        }
        out
    }

    #[test]
    fn chunked_loops_keep_the_bits_of_the_first_attention() {
        for (heads, dh) in [(12, 32), (2, 40), (1, 8), (1, 64)] {
            let hidden = heads * dh;
            for len in [1, 2, 7, 16, 31, 32, 33, 70] {
                let qkv: Vec<f32> = values(len * 3 * hidden, len as u32)
                    .iter()
                    .map(|v| v * 8.0)
                    .collect();
                let whole = 0..len;
                let mut out = vec![0f32; len * hidden];
                attention(&qkv, std::slice::from_ref(&whole), heads, dh, &mut out);
                for h in 0..heads {
                    let want = head_as_first_written(&qkv, h, dh, hidden);
                    for i in 0..len {
                        let got = &out[i * hidden + h * dh..][..dh];
                        let want = &want[i * dh..][..dh];
                        assert!(
                            got.iter()
                                .zip(want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "heads {heads} dh {dh} len {len} head {h} token {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn each_sequence_attends_to_itself_only() {
        let (heads, dh) = (3, 8);
        let hidden = heads * dh;
        let lens = [5, 1, 9];
        let total: usize = lens.iter().sum();
        let qkv = values(total * 3 * hidden, 11);
        let mut seqs = Vec::new();
        let mut start = 0;
        for l in lens {
            seqs.push(start..start + l);
            start += l;
        }
        let mut out = vec![0f32; total * hidden];
        attention(&qkv, &seqs, heads, dh, &mut out);
        for s in &seqs {
            let alone = reference(
                &qkv[s.start * 3 * hidden..s.end * 3 * hidden],
                s.len(),
                heads,
                dh,
            );
            for (a, b) in out[s.start * hidden..s.end * hidden].iter().zip(&alone) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn a_large_batch_stays_whole_while_calls_wait_and_keeps_its_bits() {
        let _serial = crate::tests::CALLS_TESTS
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (heads, dh, len) = (12, 32, 64);
        let hidden = heads * dh;
        let qkv = values(len * 3 * hidden, 7);
        let whole = 0..len;
        let seqs = std::slice::from_ref(&whole);
        let (mut alone, mut crowded) = (vec![0f32; len * hidden], vec![0f32; len * hidden]);
        let before = crate::SPLITS.get();
        attention(&qkv, seqs, heads, dh, &mut alone);
        assert_eq!(
            crate::SPLITS.get(),
            before + 1,
            "a batch this large is split"
        );
        let (_one, _two) = (crate::Call::enter(), crate::Call::enter());
        attention(&qkv, seqs, heads, dh, &mut crowded);
        assert_eq!(
            crate::SPLITS.get(),
            before + 1,
            "with calls waiting it is not"
        );
        assert_eq!(
            alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            crowded.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
