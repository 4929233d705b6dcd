//! The n-gram layer: a linear model on the words, word pairs and character
//! n-grams of the normalised text, one logistic score per learnt head.
//!
//! Why beside the encoder: the real comments of the validation half are
//! judged largely by their vocabulary (insults, slurs, sexual words), which a
//! sentence embedding blurs into topic. Trained on real texts the encoder's
//! heads never see (Toxic Spans and Davidson, labelled by our definitions),
//! its logits are features of the heads ([`super::model::LexicalFeatures`]),
//! which weigh them against the embedding per category. Six heads read
//! them; the threat and self-harm children and the minor signal do not, so
//! a masked or buried threat still rests on the encoder.
//!
//! The model is trained by `train/train_ngrams.py` from the terms this module
//! produces ([`for_each_term`], through the `ngram_terms` example), so
//! training and serving hash and count identically. It is shipped as
//! `assets/text-model/ngrams.bin`, compiled in:
//!
//! ```text
//! magic "MNG1", u32 terms, u32 heads (= NGRAM_HEADS)
//! f32 bias[heads], f32 scale[heads]
//! terms × { u32 hash (ascending), u16 idf × 1000, i8 weight[heads] }
//! ```
//! A term's weight for head h is `weight[h] * scale[h]`.

use std::collections::HashMap;
use std::sync::LazyLock;

use sha2::{Digest, Sha256};

/// The shipped model, paired with the shipped heads (which name its sha256).
pub const SHIPPED_NGRAM_MODEL: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/text-model/ngrams.bin"
));
static SHIPPED: LazyLock<NgramModel> = LazyLock::new(|| {
    NgramModel::parse(SHIPPED_NGRAM_MODEL).expect("the shipped n-gram model is valid (tested)")
});

/// Learnt heads, in `train/common.py` HEADS order: every category but
/// `sexual/minors`, then the minor signal.
pub const NGRAM_HEADS: usize = 11;
/// Longest word, in characters, whose character n-grams are taken: longer
/// runs are glued spam or encoded data, and would only cost time.
const MAX_WORD_CHARS: usize = 40;
const CHAR_NGRAMS: std::ops::RangeInclusive<usize> = 2..=5;
/// Texts of up to this many words are scored whole, as the model was
/// fitted (99 % of the training texts; 89 % of the validation half's).
pub const WHOLE_TEXT_WORDS: usize = 256;
/// How a text longer than [`WHOLE_TEXT_WORDS`] is cut: windows of `words`
/// words, `stride` apart, the last one ending at the last word. A head's
/// logit for such a text is its strongest window's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub words: usize,
    pub stride: usize,
}

/// Long enough that the strongest of a long text's many windows is not one
/// that merely sounds bad out of context, short enough that one insult is
/// not averaged away by a page of harmless text around it. On the
/// validation half, 128 words against 48 (with [`NARROW`] kept for
/// self-harm) raised any-category AUPRC 0.788 -> 0.796 and cut false
/// alarms 0.130 -> 0.117; whole texts did
/// better still there but let an insult inside 2,000 words of minutes
/// through (eval/ABLATION-real.md, heads .12).
pub const WIDE: Windows = Windows {
    words: 128,
    stride: 64,
};
/// For the self-harm heads: a long post about wanting to die says so in a
/// few sentences among many about the rest of a life, and 128-word windows
/// dilute them (long posts of the suicidal-intent sets lost recall).
pub const NARROW: Windows = Windows {
    words: 48,
    stride: 24,
};
/// Per head (in [`NGRAM_HEADS`] order), whether it is scored by [`NARROW`]
/// windows rather than [`WIDE`] ones: the three self-harm heads. Mirrored
/// by `NGRAM_NARROW_HEADS` in `train/common.py`.
pub const NARROW_HEADS: [bool; NGRAM_HEADS] = [
    false, false, false, false, true, true, true, false, false, false, false,
];
const MAGIC: &[u8; 4] = b"MNG1";
const ENTRY_BYTES: usize = 4 + 2 + NGRAM_HEADS;

/// The two feature blocks, normalised separately (each to unit length), so
/// that a long text's many character n-grams do not drown its words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// Words and pairs of neighbouring words.
    Words = 0,
    /// Character n-grams of each word padded with a space on both sides.
    Chars = 1,
}

/// Calls `f(block, hash)` for every term occurrence of `normalized` (the
/// output of the normaliser) taken whole: what the model is fitted on.
pub fn for_each_term(normalized: &str, f: impl FnMut(Block, u32)) {
    for_each_term_of(&words(normalized), f);
}

/// The words the terms are made of (the normaliser's tokens).
pub fn words(normalized: &str) -> Vec<&str> {
    super::normalize::tokens(normalized).collect()
}

/// Calls `f(words)` for each window of the words of `normalized` that the
/// model scores with `windows`: the whole text when it has at most
/// [`WHOLE_TEXT_WORDS`] words, else the [`Windows`] cut.
pub fn for_each_window<'a>(normalized: &'a str, windows: Windows, f: impl FnMut(&[&'a str])) {
    for_each_window_of(&words(normalized), windows, f);
}

fn for_each_window_of<'a>(words: &[&'a str], windows: Windows, mut f: impl FnMut(&[&'a str])) {
    if words.len() <= WHOLE_TEXT_WORDS {
        f(words);
        return;
    }
    let mut start = 0;
    loop {
        let end = (start + windows.words).min(words.len());
        f(&words[end - windows.words..end]);
        if end == words.len() {
            break;
        }
        start += windows.stride;
    }
}

/// The terms of a run of words: each word, each pair of neighbours, and
/// the character n-grams of each word padded with spaces. Runs of a
/// repeated letter count as one letter (`kill`, `kiill` and `kiiiill` are
/// all `kil`), so elongation does not hide a word; what that merges
/// (`good`, `god`) matters little to a moderation model.
pub fn for_each_term_of(words: &[&str], mut f: impl FnMut(Block, u32)) {
    let mut previous = String::new();
    let mut word = String::new();
    let mut padded: Vec<char> = Vec::with_capacity(MAX_WORD_CHARS + 2);
    let mut buf = [0u8; 4 * 5];
    for (i, raw) in words.iter().enumerate() {
        word.clear();
        let mut last = None;
        for c in raw.chars() {
            if last != Some(c) {
                word.push(c);
            }
            last = Some(c);
        }
        f(Block::Words, hash(b'w', &[&word]));
        if i > 0 {
            f(Block::Words, hash(b'b', &[&previous, " ", &word]));
        }

        padded.clear();
        padded.push(' ');
        padded.extend(word.chars().take(MAX_WORD_CHARS));
        padded.push(' ');
        for n in CHAR_NGRAMS {
            for gram in padded.windows(n) {
                let mut len = 0;
                for c in gram {
                    len += c.encode_utf8(&mut buf[len..]).len();
                }
                f(Block::Chars, hash_bytes(b'c', &buf[..len]));
            }
        }
        std::mem::swap(&mut previous, &mut word);
    }
}

/// FNV-1a (64-bit) of a tag byte and the parts, folded to 32 bits.
fn hash(tag: u8, parts: &[&str]) -> u32 {
    let mut h = Fnv::new(tag);
    for p in parts {
        h.write(p.as_bytes());
    }
    h.finish()
}

fn hash_bytes(tag: u8, bytes: &[u8]) -> u32 {
    let mut h = Fnv::new(tag);
    h.write(bytes);
    h.finish()
}

struct Fnv(u64);

impl Fnv {
    fn new(tag: u8) -> Fnv {
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        h.write(&[tag]);
        h
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u32 {
        (self.0 ^ (self.0 >> 32)) as u32
    }
}

#[derive(Debug, thiserror::Error)]
#[error("invalid n-gram model: {0}")]
pub struct NgramModelError(String);

/// The hex sha256 of a model file, as heads name it.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

struct Term {
    idf: f32,
    weights: [f32; NGRAM_HEADS],
}

/// The trained n-gram model.
pub struct NgramModel {
    terms: HashMap<u32, Term>,
    bias: [f32; NGRAM_HEADS],
}

impl NgramModel {
    /// The model compiled into the binary.
    pub fn shipped() -> &'static NgramModel {
        &SHIPPED
    }

    pub fn parse(bytes: &[u8]) -> Result<NgramModel, NgramModelError> {
        let bad = |m: &str| NgramModelError(m.to_string());
        let mut r = Reader(bytes);
        if r.take(4)? != MAGIC {
            return Err(bad("not an n-gram model (magic)"));
        }
        let count = r.u32()? as usize;
        if r.u32()? as usize != NGRAM_HEADS {
            return Err(bad("wrong number of heads"));
        }
        let mut bias = [0.0; NGRAM_HEADS];
        let mut scale = [0.0; NGRAM_HEADS];
        for b in &mut bias {
            *b = r.f32()?;
        }
        for s in &mut scale {
            *s = r.f32()?;
        }
        if r.0.len() != count * ENTRY_BYTES {
            return Err(bad("length does not match the term count"));
        }
        let mut terms = HashMap::with_capacity(count);
        let mut last = None;
        for _ in 0..count {
            let hash = r.u32()?;
            if last.is_some_and(|l| l >= hash) {
                return Err(bad("terms are not in ascending order"));
            }
            last = Some(hash);
            let idf = f32::from(r.u16()?) / 1000.0;
            let mut weights = [0.0; NGRAM_HEADS];
            for (w, s) in weights.iter_mut().zip(scale) {
                *w = f32::from(r.take(1)?[0] as i8) * s;
            }
            terms.insert(hash, Term { idf, weights });
        }
        if bias.iter().chain(&scale).any(|x| !x.is_finite()) {
            return Err(bad("a bias or scale is not finite"));
        }
        Ok(NgramModel { terms, bias })
    }

    /// The logit of every head for `normalized` (the normaliser's output):
    /// per window ([`for_each_window`]) sublinear term frequency times idf
    /// over the known terms, each block scaled to unit length, then the
    /// heads' dot products; per head the strongest of the windows its
    /// [`NARROW_HEADS`] entry names.
    pub fn logits(&self, normalized: &str) -> [f32; NGRAM_HEADS] {
        let words = words(normalized);
        let mut known: [Vec<u32>; 2] = [Vec::new(), Vec::new()];
        if words.len() <= WHOLE_TEXT_WORDS {
            return self.window_logits(&words, &mut known);
        }
        let wide = self.strongest(&words, WIDE, &mut known);
        let narrow = self.strongest(&words, NARROW, &mut known);
        std::array::from_fn(|h| if NARROW_HEADS[h] { narrow[h] } else { wide[h] })
    }

    /// Per head, the strongest logit of the `windows` of `words`.
    fn strongest(
        &self,
        words: &[&str],
        windows: Windows,
        known: &mut [Vec<u32>; 2],
    ) -> [f32; NGRAM_HEADS] {
        let mut out = [f32::NEG_INFINITY; NGRAM_HEADS];
        for_each_window_of(words, windows, |w| {
            for (o, z) in out.iter_mut().zip(self.window_logits(w, known)) {
                *o = o.max(z);
            }
        });
        out
    }

    /// One window's logits. Terms are summed in hash order, so a text's
    /// logits are the same bit for bit on every call.
    fn window_logits(&self, words: &[&str], known: &mut [Vec<u32>; 2]) -> [f32; NGRAM_HEADS] {
        for k in known.iter_mut() {
            k.clear();
        }
        for_each_term_of(words, |block, hash| {
            if self.terms.contains_key(&hash) {
                known[block as usize].push(hash);
            }
        });
        let mut out = self.bias;
        for block in known.iter_mut() {
            block.sort_unstable();
            let values: Vec<(&Term, f32)> = block
                .chunk_by(|a, b| a == b)
                .map(|run| {
                    let term = &self.terms[&run[0]];
                    (term, (1.0 + (run.len() as f32).ln()) * term.idf)
                })
                .collect();
            let norm = values.iter().map(|(_, v)| v * v).sum::<f32>().sqrt();
            if norm == 0.0 {
                continue;
            }
            for (term, v) in values {
                for (o, w) in out.iter_mut().zip(term.weights) {
                    *o += w * v / norm;
                }
            }
        }
        out
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], NgramModelError> {
        if self.0.len() < n {
            return Err(NgramModelError("truncated".to_string()));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, NgramModelError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u16(&mut self) -> Result<u16, NgramModelError> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn f32(&mut self) -> Result<f32, NgramModelError> {
        Ok(f32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moderation::text::normalize;

    /// A model of the given terms (hash, idf, weight of head 0), bias 0.
    fn model(terms: &[(u32, f32, i8)]) -> Vec<u8> {
        model_of_heads(terms, &[0])
    }

    /// The same, each term's weight on every head of `heads`.
    fn model_of_heads(terms: &[(u32, f32, i8)], heads: &[usize]) -> Vec<u8> {
        let mut terms = terms.to_vec();
        terms.sort_by_key(|t| t.0);
        let mut b = MAGIC.to_vec();
        b.extend((terms.len() as u32).to_le_bytes());
        b.extend((NGRAM_HEADS as u32).to_le_bytes());
        b.extend([0.0f32; NGRAM_HEADS].iter().flat_map(|x| x.to_le_bytes()));
        b.extend([0.1f32; NGRAM_HEADS].iter().flat_map(|x| x.to_le_bytes()));
        for (h, idf, w) in terms {
            b.extend(h.to_le_bytes());
            b.extend(((idf * 1000.0) as u16).to_le_bytes());
            b.extend((0..NGRAM_HEADS).map(|i| if heads.contains(&i) { w as u8 } else { 0 }));
        }
        b
    }

    fn terms_of(text: &str) -> Vec<(Block, u32)> {
        let mut out = Vec::new();
        for_each_term(&normalize(text), |b, h| out.push((b, h)));
        out
    }

    #[test]
    fn words_pairs_and_padded_character_grams_are_counted() {
        let t = terms_of("Hi you");
        let words = t.iter().filter(|(b, _)| *b == Block::Words).count();
        // "hi", "you", "hi you"
        assert_eq!(words, 3);
        // " hi " has 3 + 2 + 1 grams of 2..=5 chars; " you " 4 + 3 + 2 + 1.
        let chars = t.iter().filter(|(b, _)| *b == Block::Chars).count();
        assert_eq!(chars, 6 + 10);
        assert!(t.contains(&(Block::Words, hash(b'w', &["you"]))));
        assert!(t.contains(&(Block::Words, hash(b'b', &["hi", " ", "you"]))));
        assert_eq!(terms_of("hii yoouu"), t, "repeated letters count once");
    }

    #[test]
    fn obfuscated_spellings_give_the_plain_words_terms() {
        assert_eq!(terms_of("k1ll y0urs3lf"), terms_of("kill yourself"));
        assert_eq!(terms_of("K I L L yourself"), terms_of("kill yourself"));
        assert_eq!(terms_of("kiiiill yourself"), terms_of("kill yourself"));
    }

    #[test]
    fn a_known_word_moves_its_head_and_unknown_words_do_not() {
        let kill = hash(b'w', &["kil"]);
        let m = NgramModel::parse(&model(&[(kill, 2.0, 100)])).unwrap();
        // Only "kill" is known: its block is just that term, of unit length.
        let z = m.logits(&normalize("kill"))[0];
        assert!((z - 10.0).abs() < 1e-4, "{z}");
        assert_eq!(m.logits(&normalize("have a nice day")), [0.0; NGRAM_HEADS]);
        // Unknown words around it do not dilute it (sklearn's vocabulary).
        let z2 = m.logits(&normalize("i will kill it"))[0];
        assert!((z2 - 10.0).abs() < 1e-4, "{z2}");
        assert_eq!(m.logits(&normalize("kill"))[1], 0.0);
    }

    #[test]
    fn a_long_text_is_scored_by_its_strongest_window() {
        let kill = hash(b'w', &["kil"]);
        let m =
            NgramModel::parse(&model(&[(kill, 2.0, 100), (hash(b'w', &["the"]), 2.0, 0)])).unwrap();
        let filler = "the ".repeat(500);
        let text = format!("{filler} kill {filler}");
        // Its strongest window is "kill" among WIDE.words - 1 "the"s, not
        // among the whole text's 1,000.
        let z = m.logits(&normalize(&text))[0];
        let window = m.logits(&normalize(&format!(
            "{} kill",
            "the ".repeat(WIDE.words - 1)
        )))[0];
        let text = normalize(&text);
        let whole = m.window_logits(&words(&text), &mut Default::default())[0];
        assert_eq!(z, window);
        assert!(whole < 0.8 * window, "{whole} vs {window}");
        // A self-harm head reads the narrow windows: its strongest is "kill"
        // among NARROW.words - 1 "the"s, stronger than the wide one.
        let self_harm = NARROW_HEADS.iter().position(|&n| n).unwrap();
        let m = NgramModel::parse(&model_of_heads(
            &[(kill, 2.0, 100), (hash(b'w', &["the"]), 2.0, 0)],
            &[0, self_harm],
        ))
        .unwrap();
        let z = m.logits(&text);
        let narrow = m.logits(&normalize(&format!(
            "{} kill",
            "the ".repeat(NARROW.words - 1)
        )))[self_harm];
        assert_eq!(z[0], window);
        assert_eq!(z[self_harm], narrow);
        assert!(narrow > window, "{narrow} vs {window}");
        for cut in [WIDE, NARROW] {
            let mut windows = 0;
            for_each_window(&normalize(&text), cut, |w| {
                assert_eq!(w.len(), cut.words);
                windows += 1;
            });
            assert_eq!(windows, (1001 - cut.words).div_ceil(cut.stride) + 1);
        }
    }

    #[test]
    fn logits_are_the_same_bit_for_bit_on_every_call() {
        let terms: Vec<(u32, f32, i8)> = terms_of("you are all such utter fools and liars")
            .into_iter()
            .map(|(_, h)| h)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|h| (h, 1.5, 37))
            .collect();
        let m = NgramModel::parse(&model(&terms)).unwrap();
        let text = normalize("you are all such utter fools and liars");
        let first = m.logits(&text);
        for _ in 0..20 {
            assert_eq!(
                NgramModel::parse(&model(&terms)).unwrap().logits(&text),
                first
            );
        }
    }

    #[test]
    fn long_words_and_long_texts_are_bounded() {
        let word = "ab".repeat(50_000);
        let mut n = 0;
        for_each_term(&word, |_, _| n += 1);
        // one word, no pair, and the grams of its first 40 characters
        assert_eq!(n, 1 + (41 + 40 + 39 + 38));
    }

    #[test]
    fn the_shipped_model_parses() {
        NgramModel::parse(SHIPPED_NGRAM_MODEL).expect("valid");
    }

    #[test]
    fn malformed_models_are_refused() {
        let good = model(&[(1, 1.0, 1), (2, 1.0, 1)]);
        assert!(NgramModel::parse(&good).is_ok());
        assert!(NgramModel::parse(&good[..good.len() - 1]).is_err());
        assert!(NgramModel::parse(b"nope").is_err());
        let mut unordered = good.clone();
        let first = 4 + 4 + 4 + 8 * NGRAM_HEADS;
        unordered[first..first + 4].copy_from_slice(&3u32.to_le_bytes());
        assert!(NgramModel::parse(&unordered).is_err());
    }
}
