//! Canonical text form shared by the lexical classifier and the embedding
//! model: undoes the cheap tricks people use to slip words past a filter
//! (look-alike letters, invisible characters, accents, `k i l l`, `k1ll`,
//! `kiiiill`) while leaving ordinary text unchanged apart from case.
//!
//! The pipeline is two linear passes:
//! 1. per character: NFKD, lower case, drop invisible characters and
//!    diacritics, recompose (NFC) — together this is NFKC minus accents;
//! 2. per word: rejoin letters spelt with separators, map homoglyphs, map
//!    digit/symbol swaps, collapse elongated letters.

use unicode_normalization::UnicodeNormalization;

/// Inputs longer than this are cut (at a character boundary) before
/// normalisation, which bounds time and memory per text. The HTTP layer's
/// body limit is far below this; the cap is a second line of defence.
pub const MAX_INPUT_BYTES: usize = 4 * 1024 * 1024;

/// Fewer single characters than this, e.g. `e.g.` or `u s`, are left alone:
/// rejoining them would damage abbreviations more often than it catches words.
const MIN_SPELT_OUT_LEN: usize = 3;

/// How [`normalize_with`] treats runs of a repeated letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeats {
    /// Runs of three or more become two (`kiiiill` → `kiill`).
    CollapseToTwo,
    /// Runs of three or more become one (`kiiiill` → `kil`, `killll` →
    /// `kil`): the model's other reading of an elongation, whose intended
    /// length is unknown.
    CollapseToOne,
}

/// Options for [`normalize_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    pub repeats: Repeats,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            repeats: Repeats::CollapseToTwo,
        }
    }
}

/// The canonical form used for matching and as model input.
pub fn normalize(text: &str) -> String {
    normalize_with(text, Options::default())
}

/// [`normalize`] with elongations cut to one letter.
pub fn normalize_single_repeats(text: &str) -> String {
    normalize_with(
        text,
        Options {
            repeats: Repeats::CollapseToOne,
        },
    )
}

/// [`normalize`] with explicit options.
pub fn normalize_with(text: &str, options: Options) -> String {
    let text = truncate_at_char_boundary(text, MAX_INPUT_BYTES);
    let folded = fold_characters(text);
    rewrite_words(&folded, options, None)
}

/// A normalised text with the way back to the text it came from.
#[derive(Clone, Debug)]
pub struct Traced {
    /// Exactly what [`normalize_with`] gives for the same text and options.
    pub text: String,
    pub map: OffsetMap,
}

/// Where the bytes of a normalised text came from in the original text.
/// Normalising rewrites whole words (`m*rder` → `murder`, `k i l l` →
/// `kill`) and characters (`ｋ` → `k`, `é` → `e`, invisible ones dropped),
/// so a position inside a rewritten piece maps to the whole piece it came
/// from: a mapped range always covers at least what was rewritten, never
/// less, and always lies on the original's character boundaries.
#[derive(Clone, Debug, Default)]
pub struct OffsetMap {
    /// Normalised bytes → folded bytes (pass 2, words).
    words: Vec<Piece>,
    /// Folded bytes → original bytes (pass 1, characters).
    chars: Vec<Piece>,
}

/// One stretch of output and the input it was written from. `aligned`
/// stretches are byte for byte the same length as their input (copied or
/// ASCII lower-cased), so positions inside them map exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Piece {
    out: std::ops::Range<usize>,
    src: std::ops::Range<usize>,
    aligned: bool,
}

impl OffsetMap {
    /// The byte range of the original text that `normalized` (a byte range
    /// of the normalised text) came from; `None` for an empty range or one
    /// outside the text.
    pub fn to_original(
        &self,
        normalized: std::ops::Range<usize>,
    ) -> Option<std::ops::Range<usize>> {
        let folded = map_range(&self.words, normalized)?;
        map_range(&self.chars, folded)
    }
}

/// The smallest input range that every piece overlapping `r` came from.
fn map_range(pieces: &[Piece], r: std::ops::Range<usize>) -> Option<std::ops::Range<usize>> {
    if r.is_empty() {
        return None;
    }
    let first = pieces.partition_point(|p| p.out.end <= r.start);
    let mut mapped: Option<std::ops::Range<usize>> = None;
    for p in pieces[first..].iter().take_while(|p| p.out.start < r.end) {
        if p.out.is_empty() {
            continue;
        }
        let part = if p.aligned {
            let a = r.start.max(p.out.start) - p.out.start;
            let b = r.end.min(p.out.end) - p.out.start;
            p.src.start + a..p.src.start + b
        } else {
            p.src.clone()
        };
        mapped = Some(match mapped {
            Some(m) => m.start.min(part.start)..m.end.max(part.end),
            None => part,
        });
    }
    mapped
}

/// [`normalize_with`] that also says where each part of the result came
/// from. Costs a little more than [`normalize_with`] (the map, and a
/// second fold of non-ASCII text to check it), so it is only used when a
/// caller asks where a score came from.
pub fn normalize_traced(text: &str, options: Options) -> Traced {
    let text = truncate_at_char_boundary(text, MAX_INPUT_BYTES);
    let (folded, chars) = fold_characters_traced(text);
    let mut words = Vec::new();
    let out = rewrite_words(&folded, options, Some(&mut words));
    Traced {
        text: out,
        map: OffsetMap { words, chars },
    }
}

/// The byte ranges of [`tokens`], in order.
pub fn token_ranges(normalized: &str) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = None;
    normalized
        .char_indices()
        .chain(std::iter::once((normalized.len(), ' ')))
        .filter_map(
            move |(i, c)| match (c.is_alphanumeric() && i < normalized.len(), start) {
                (true, None) => {
                    start = Some(i);
                    None
                }
                (false, Some(s)) => {
                    start = None;
                    Some(s..i)
                }
                _ => None,
            },
        )
}

/// The words of a normalised text: maximal runs of letters and digits.
/// Apostrophes split words (`you're` → `you`, `re`), so term lists must be
/// tokenised with this same function.
pub fn tokens(normalized: &str) -> impl Iterator<Item = &str> {
    normalized
        .split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty())
}

/// Longest token [`for_each_dedouble_variant`] varies; longer ones (glued
/// spam) are passed through as they are.
pub const MAX_DEDOUBLE_TOKEN_CHARS: usize = 48;

/// Variants of a token with each doubled letter kept or made single
/// (`kiill` → `kiill`, `kill`, `kiil`, `kil`), which is how matching "also
/// tries 1" after [`normalize`] collapsed elongations to two. Only the first
/// `max_runs` doubled runs vary, bounding the output to `2^max_runs` items.
/// The token itself always comes first. Each variant is built in `buf` and
/// handed to `f`, without allocating per variant.
pub fn for_each_dedouble_variant(
    token: &str,
    max_runs: usize,
    buf: &mut String,
    mut f: impl FnMut(&str),
) {
    f(token);
    if token.len() > MAX_DEDOUBLE_TOKEN_CHARS * 4
        || token.chars().count() > MAX_DEDOUBLE_TOKEN_CHARS
    {
        return;
    }
    // Byte offsets of the second letter of each run of exactly two.
    let mut seconds = [0usize; 8];
    let cap = max_runs.min(seconds.len());
    let mut n = 0;
    let mut run: Option<(char, usize, usize)> = None; // (letter, length, offset of 2nd)
    let mut close = |run: Option<(char, usize, usize)>, n: &mut usize| {
        if let Some((c, 2, second)) = run {
            if c.is_alphabetic() && *n < cap {
                seconds[*n] = second;
                *n += 1;
            }
        }
    };
    for (i, c) in token.char_indices() {
        run = match run {
            Some((p, len, second)) if p == c => {
                Some((p, len + 1, if len == 1 { i } else { second }))
            }
            other => {
                close(other, &mut n);
                Some((c, 1, 0))
            }
        };
    }
    close(run, &mut n);
    let seconds = &seconds[..n];
    for mask in 1u32..(1u32 << n) {
        buf.clear();
        for (i, c) in token.char_indices() {
            let skip = seconds
                .iter()
                .enumerate()
                .any(|(bit, &s)| s == i && mask & (1 << bit) != 0);
            if !skip {
                buf.push(c);
            }
        }
        f(buf);
    }
}

pub(crate) fn truncate_at_char_boundary(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

// ---------------------------------------------------------------------------
// Pass 1: characters.

fn fold_characters(text: &str) -> String {
    if text.is_ascii() {
        // Nothing to decompose, no invisibles or accents: the common case.
        return text.to_ascii_lowercase();
    }
    let mut out = String::with_capacity(text.len());
    fold_into(&mut out, text);
    out
}

fn fold_into(out: &mut String, text: &str) {
    out.extend(
        text.nfkd()
            .flat_map(char::to_lowercase)
            .filter(|&c| !is_invisible(c) && !is_diacritic(c))
            .map(fold_punctuation)
            .nfc(),
    );
}

/// [`fold_characters`] with the piece of the input each piece of output
/// came from. Non-ASCII text is folded cluster by cluster (a character with
/// the marks and invisibles after it), which gives the same text as folding
/// it whole except where a recomposition reaches across clusters (Hangul
/// jamo, some Indic vowel signs): then the whole text is one piece, which
/// is coarse but never wrong.
fn fold_characters_traced(text: &str) -> (String, Vec<Piece>) {
    if text.is_ascii() {
        let piece = Piece {
            out: 0..text.len(),
            src: 0..text.len(),
            aligned: true,
        };
        return (text.to_ascii_lowercase(), vec![piece]);
    }
    let mut out = String::with_capacity(text.len());
    let mut pieces = Vec::new();
    for src in fold_clusters(text) {
        let before = out.len();
        fold_into(&mut out, &text[src.clone()]);
        pieces.push(Piece {
            out: before..out.len(),
            src,
            aligned: false,
        });
    }
    let whole = fold_characters(text);
    if whole != out {
        let piece = Piece {
            out: 0..whole.len(),
            src: 0..text.len(),
            aligned: false,
        };
        return (whole, vec![piece]);
    }
    (out, pieces)
}

/// Byte ranges of `text` that fold independently: a new cluster starts at
/// a character that composes with nothing before it.
fn fold_clusters(text: &str) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    use unicode_normalization::char::canonical_combining_class;
    use unicode_normalization::{is_nfc_quick, IsNormalized};
    let starts = text.char_indices().filter(|&(i, c)| {
        i == 0
            || !(is_invisible(c)
                || is_diacritic(c)
                || canonical_combining_class(c) != 0
                || is_nfc_quick(std::iter::once(c)) != IsNormalized::Yes)
    });
    let mut starts = starts.map(|(i, _)| i).peekable();
    std::iter::from_fn(move || {
        let start = starts.next()?;
        let end = starts.peek().copied().unwrap_or(text.len());
        Some(start..end)
    })
}

/// Characters that render as nothing (or nearly) and are used to split words
/// invisibly: zero-width space/joiners, soft hyphen, bidi controls, variation
/// selectors, tag characters, Hangul fillers.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}'
        | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}'
        | '\u{2066}'..='\u{206F}'
        | '\u{3164}' | '\u{FEFF}' | '\u{FFA0}'
        | '\u{FE00}'..='\u{FE0F}'
        | '\u{E0000}'..='\u{E007F}'
        | '\u{E0100}'..='\u{E01EF}')
}

/// Generic combining diacritics (accents, "Zalgo" stacks). Script-specific
/// marks (Devanagari vowel signs, Japanese voicing marks) are kept: they are
/// part of the spelling there, not decoration.
fn is_diacritic(c: char) -> bool {
    matches!(c,
        '\u{0300}'..='\u{036F}'
        | '\u{1AB0}'..='\u{1AFF}'
        | '\u{1DC0}'..='\u{1DFF}'
        | '\u{20D0}'..='\u{20FF}'
        | '\u{FE20}'..='\u{FE2F}')
}

/// Typographic apostrophes become ASCII so `you’re` and `you're` agree.
fn fold_punctuation(c: char) -> char {
    match c {
        '\u{2018}' | '\u{2019}' | '\u{02BC}' | '\u{2032}' => '\'',
        _ => c,
    }
}

// ---------------------------------------------------------------------------
// Pass 2: words.

/// Word characters before leet mapping: `$` and `@` stand for letters often
/// enough (`a$$`, `h@te`) to be part of a word; `!` only between word
/// characters (`sh!t`), since at the end it is punctuation.
fn is_word_core(c: char) -> bool {
    c.is_alphanumeric() || c == '@' || c == '$'
}

/// Characters that stand for a hidden letter inside a word (`m*rder`,
/// `f#ck`, `sh_t`). Between single letters they are separators (`k*i*l*l`).
fn is_mask(c: char) -> bool {
    matches!(c, '*' | '#' | '%' | '_')
}

/// Longest run of mask characters read as hidden letters (`f**k`); longer
/// runs are decoration or markup (`***bold***`).
const MAX_MASK_RUN: usize = 3;

/// Whether `rest`, which starts with a mask character, is a short run of
/// masks followed by more of the word.
fn mask_run_continues_word(rest: &str) -> bool {
    let masks = rest.chars().take_while(|&c| is_mask(c)).count();
    masks <= MAX_MASK_RUN && rest.chars().nth(masks).is_some_and(is_word_core)
}

fn is_separator(c: char) -> bool {
    matches!(
        c,
        ' ' | '.' | '-' | '_' | '*' | '~' | '|' | '/' | '\\' | '+' | '\u{00B7}'
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SegKind {
    Word,
    Gap,
}

/// Splits into maximal word and gap segments, as byte ranges.
struct Segments<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Iterator for Segments<'a> {
    type Item = (SegKind, usize, usize);

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.text.get(self.pos..)?;
        let mut chars = rest.char_indices().peekable();
        let (_, first) = chars.next()?;
        let kind = if is_word_core(first) {
            SegKind::Word
        } else {
            SegKind::Gap
        };
        let mut end = rest.len();
        while let Some((i, c)) = chars.next() {
            let belongs = match kind {
                SegKind::Word => {
                    is_word_core(c)
                        || (c == '!' && chars.peek().is_some_and(|&(_, n)| is_word_core(n)))
                        || (is_mask(c) && mask_run_continues_word(&rest[i..]))
                }
                SegKind::Gap => !is_word_core(c),
            };
            if !belongs {
                end = i;
                break;
            }
        }
        let start = self.pos;
        self.pos += end;
        Some((kind, start, self.pos))
    }
}

/// A run of single-character words separated by single separators
/// (`k i l l`, `s.u.i.c.i.d.e`) or by runs of spaces (`k   i   l   l`),
/// pending until we know whether it is long enough to rejoin.
#[derive(Default)]
struct SpeltRun {
    start: usize,
    end: usize,
    singles: usize,
    /// A gap after `end` that may continue the run, not yet emitted.
    pending_sep: Option<std::ops::Range<usize>>,
}

/// At most this many spaces between single letters still spell a word
/// (`k     i     l     l`); a wider gap is layout.
const MAX_SPACE_GAP: usize = 8;

/// Whether a gap between single characters may continue a spelt-out run:
/// one separator character, or a run of spaces.
fn continues_spelt_run(gap: &str) -> bool {
    (is_single_char(gap) && gap.chars().all(is_separator))
        || (gap.len() <= MAX_SPACE_GAP && gap.bytes().all(|b| b == b' '))
}

/// A spelt-out run cut into its words: the narrowest gap inside the run is
/// the one between letters, and a wider one ends a word (`k i l l   y o u`,
/// `k  i  l  l     y  o  u`). Each part is `(is_gap, byte range)`.
fn spelt_words(text: &str, run: std::ops::Range<usize>) -> Vec<(bool, std::ops::Range<usize>)> {
    let mut parts: Vec<(bool, std::ops::Range<usize>)> = Vec::new();
    for (i, c) in text[run.clone()].char_indices() {
        let at = run.start + i..run.start + i + c.len_utf8();
        let gap = !is_word_core(c);
        match parts.last_mut() {
            Some((was_gap, range)) if *was_gap && gap => range.end = at.end,
            _ => parts.push((gap, at)),
        }
    }
    let narrowest = parts
        .iter()
        .filter(|(gap, _)| *gap)
        .map(|(_, r)| r.len())
        .min()
        .unwrap_or(0);
    parts
        .into_iter()
        .map(|(gap, r)| (gap && r.len() > narrowest, r))
        .fold(Vec::new(), |mut words, (wide_gap, r)| {
            match words.last_mut() {
                Some((false, word)) if !wide_gap => word.end = r.end,
                _ => words.push((wide_gap, r)),
            }
            words
        })
}

impl SpeltRun {
    fn is_active(&self) -> bool {
        self.singles > 0
    }
}

struct Rewriter<'a, 't> {
    text: &'a str,
    options: Options,
    out: String,
    scratch: Vec<char>,
    run: SpeltRun,
    /// Whether words written wholly in look-alike letters may be read as
    /// Latin: not in a text written in Cyrillic or Greek, where `всех` is
    /// a word, not a disguised `bcex`.
    lookalike_words: bool,
    /// Where each piece of `out` came from, when the caller asked.
    trace: Option<&'t mut Vec<Piece>>,
}

fn rewrite_words(text: &str, options: Options, trace: Option<&mut Vec<Piece>>) -> String {
    let mut rw = Rewriter {
        text,
        options,
        out: String::with_capacity(text.len()),
        scratch: Vec::with_capacity(32),
        run: SpeltRun::default(),
        lookalike_words: !written_in_lookalike_script(text),
        trace,
    };
    for (kind, start, end) in (Segments { text, pos: 0 }) {
        rw.segment(kind, start, end);
    }
    rw.flush_run();
    rw.out
}

impl Rewriter<'_, '_> {
    /// Runs `write`, which writes what `text[src]` becomes, and records the
    /// piece when tracing.
    fn emit(&mut self, src: std::ops::Range<usize>, write: impl FnOnce(&mut Self)) {
        let before = self.out.len();
        write(self);
        if let Some(trace) = self.trace.as_deref_mut() {
            let out = before..self.out.len();
            let aligned = self.out[out.clone()] == self.text[src.clone()];
            trace.push(Piece { out, src, aligned });
        }
    }

    fn segment(&mut self, kind: SegKind, start: usize, end: usize) {
        let text = self.text;
        let seg = &text[start..end];
        match kind {
            SegKind::Word if is_single_char(seg) => {
                if self.run.is_active() && self.run.pending_sep.is_some() {
                    self.run.end = end;
                    self.run.pending_sep = None;
                } else {
                    self.flush_run();
                    self.run.start = start;
                    self.run.end = end;
                }
                self.run.singles += 1;
            }
            SegKind::Word if is_email_local_part(self.text, start, end) => {
                self.flush_run();
                self.emit(start..end, |rw| rw.out.push_str(seg));
            }
            SegKind::Word => {
                self.flush_run();
                self.emit(start..end, |rw| rw.word(seg));
            }
            SegKind::Gap => {
                if self.run.is_active() && continues_spelt_run(seg) {
                    self.run.pending_sep = Some(start..end);
                } else {
                    self.flush_run();
                    self.emit(start..end, |rw| rw.out.push_str(seg));
                }
            }
        }
    }

    fn flush_run(&mut self) {
        let run = std::mem::take(&mut self.run);
        if !run.is_active() {
            return;
        }
        let text = self.text;
        for (wide_gap, part) in spelt_words(text, run.start..run.end) {
            if wide_gap {
                self.emit(part.clone(), |rw| rw.out.push_str(&text[part]));
            } else {
                self.spelt_word(part);
            }
        }
        if let Some(sep) = run.pending_sep {
            self.emit(sep.clone(), |rw| rw.out.push_str(&text[sep]));
        }
    }

    /// One word of a spelt-out run: rejoined when it has enough letters,
    /// else left as its pieces.
    fn spelt_word(&mut self, part: std::ops::Range<usize>) {
        let text = self.text;
        let spelt = &text[part.clone()];
        let singles = spelt.chars().filter(|&c| is_word_core(c)).count();
        let letters = spelt.chars().filter(|c| c.is_alphabetic()).count();
        if singles >= MIN_SPELT_OUT_LEN && letters >= 2 {
            let joined: String = spelt.chars().filter(|&c| is_word_core(c)).collect();
            self.emit(part, |rw| rw.word(&joined));
            return;
        }
        for (i, c) in spelt.char_indices() {
            let at = part.start + i..part.start + i + c.len_utf8();
            if is_word_core(c) {
                self.emit(at, |rw| rw.word(&spelt[i..i + c.len_utf8()]));
            } else {
                let piece = &text[at.clone()];
                self.emit(at, |rw| rw.out.push_str(piece));
            }
        }
    }

    /// A word with mask characters inside: letters spelt out between masks
    /// (`k*i*l*l`) are rejoined; a disguised lexicon word (`m*rder`) is
    /// restored; anything else is left as its pieces, as before masks were
    /// read.
    fn masked_word(&mut self, word: &str) {
        let chars: Vec<char> = word.chars().collect();
        if let Some(joined) = spelt_between_masks(&chars) {
            self.word(&joined);
        } else if let Some(restored) = unmask(&chars) {
            self.word(&restored);
        } else {
            for (is_masks, piece) in split_masks(word) {
                if is_masks {
                    self.out.push_str(piece);
                } else {
                    self.word(piece);
                }
            }
        }
    }

    fn word(&mut self, word: &str) {
        if word.contains(is_mask) {
            return self.masked_word(word);
        }
        if word.bytes().all(|b| b.is_ascii_lowercase()) && !has_long_run(word.as_bytes()) {
            // The common case: a plain word with nothing to undo.
            self.out.push_str(word);
            return;
        }
        self.scratch.clear();
        self.scratch.extend(word.chars());
        map_homoglyphs(&mut self.scratch, self.lookalike_words);
        map_leet(&mut self.scratch);
        let keep = match self.options.repeats {
            _ if word == "www" => None,
            Repeats::CollapseToTwo => Some(2),
            Repeats::CollapseToOne => Some(1),
        };
        push_collapsed(&mut self.out, &self.scratch, keep);
    }
}

/// `k*i*l*l`: single letters each followed by one mask, at least
/// [`MIN_SPELT_OUT_LEN`] of them with two letters, as the spelt-run rule
/// asks of `k i l l`.
fn spelt_between_masks(chars: &[char]) -> Option<String> {
    let singles = chars.len().div_ceil(2);
    let alternating = chars.iter().enumerate().all(|(i, &c)| {
        if i % 2 == 0 {
            is_word_core(c)
        } else {
            is_mask(c)
        }
    });
    let letters = chars.iter().filter(|c| c.is_alphabetic()).count();
    (alternating && chars.len() % 2 == 1 && singles >= MIN_SPELT_OUT_LEN && letters >= 2)
        .then(|| chars.iter().step_by(2).collect())
}

/// Longest masked word that is looked up.
const MAX_MASKED_WORD_CHARS: usize = 24;

/// The lexicon word a masked spelling stands for: same length, every
/// visible letter in place (after homoglyphs and digit swaps), at most half
/// the letters hidden. Among several, the one in the most lexicon terms
/// (`f#ck` is `fuck`, not the variant `fack`), then the one whose hidden
/// letters are most often vowels (people hide vowels: `m*rder`, `sh*t`),
/// then the first alphabetically, so the result never depends on hashing.
fn unmask(chars: &[char]) -> Option<String> {
    let hidden = chars.iter().filter(|&&c| is_mask(c)).count();
    if chars.len() > MAX_MASKED_WORD_CHARS || hidden * 2 > chars.len() || !is_word_core(chars[0]) {
        return None;
    }
    let mut visible = chars.to_vec();
    map_homoglyphs(&mut visible, true);
    map_leet(&mut visible);
    let candidates = maskable_words().get(&chars.len())?;
    let fits = |w: &&MaskableWord| {
        w.letters
            .iter()
            .zip(&visible)
            .all(|(&l, &v)| is_mask(v) || l == v)
    };
    let vowels_hidden = |w: &MaskableWord| {
        w.letters
            .iter()
            .zip(&visible)
            .filter(|&(&l, &v)| is_mask(v) && "aeiou".contains(l))
            .count()
    };
    candidates
        .iter()
        .filter(fits)
        .max_by(|a, b| {
            (a.terms, vowels_hidden(a))
                .cmp(&(b.terms, vowels_hidden(b)))
                .then(b.letters.cmp(&a.letters))
        })
        .map(|w| w.letters.iter().collect())
}

/// A word of the category lists and how many of their terms contain it.
struct MaskableWord {
    letters: Vec<char>,
    terms: usize,
}

/// The category lists' words by length in characters, sorted: built once.
fn maskable_words() -> &'static std::collections::HashMap<usize, Vec<MaskableWord>> {
    static WORDS: std::sync::OnceLock<std::collections::HashMap<usize, Vec<MaskableWord>>> =
        std::sync::OnceLock::new();
    WORDS.get_or_init(|| {
        let mut terms = std::collections::BTreeMap::<Vec<char>, usize>::new();
        for w in super::lexical::category_list_words() {
            if w.chars().all(char::is_alphabetic) && w.chars().count() >= 3 {
                *terms.entry(w.to_lowercase().chars().collect()).or_default() += 1;
            }
        }
        let mut by_len = std::collections::HashMap::new();
        for (letters, terms) in terms {
            by_len
                .entry(letters.len())
                .or_insert_with(Vec::new)
                .push(MaskableWord { letters, terms });
        }
        by_len
    })
}

/// A word split into runs of masks and runs of anything else, in order.
fn split_masks(word: &str) -> impl Iterator<Item = (bool, &str)> {
    let mut rest = word;
    std::iter::from_fn(move || {
        let first = rest.chars().next()?;
        let masks = is_mask(first);
        let end = rest
            .char_indices()
            .find(|&(_, c)| is_mask(c) != masks)
            .map_or(rest.len(), |(i, _)| i);
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some((masks, piece))
    })
}

/// `john.doe@example.com` reaches us as the words `john` and
/// `doe@example`; the `@` there is an address, not a disguised `a`.
fn is_email_local_part(text: &str, start: usize, end: usize) -> bool {
    let at_inside = text[start..end]
        .char_indices()
        .any(|(i, c)| c == '@' && i > 0);
    let mut after = text[end..].chars();
    at_inside && after.next() == Some('.') && after.next().is_some_and(char::is_alphanumeric)
}

fn is_single_char(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some() && chars.next().is_none()
}

fn has_long_run(bytes: &[u8]) -> bool {
    bytes.windows(3).any(|w| w[0] == w[1] && w[1] == w[2])
}

/// Pushes `chars`, cutting runs of three or more of a letter to `keep`
/// letters (runs of two are spelling: `ll` in `kill`); `None` keeps all.
fn push_collapsed(out: &mut String, chars: &[char], keep: Option<usize>) {
    let mut rest = chars;
    while let Some(&c) = rest.first() {
        let run = rest.iter().take_while(|&&x| x == c).count();
        let n = match keep {
            Some(k) if run > 2 && c.is_alphabetic() => k.min(run),
            _ => run,
        };
        out.extend(std::iter::repeat_n(c, n));
        rest = &rest[run..];
    }
}

// ---------------------------------------------------------------------------
// Homoglyphs.

/// Latin letter a look-alike stands for. Input is already lower case and
/// without accents (so `ё`, `ї` arrive as `е`, `і`).
fn homoglyph(c: char) -> Option<char> {
    Some(match c {
        // Cyrillic
        'а' => 'a',
        'в' => 'b',
        'ь' => 'b',
        'е' => 'e',
        'к' => 'k',
        'м' => 'm',
        'н' => 'h',
        'һ' => 'h',
        'о' => 'o',
        'р' => 'p',
        'с' => 'c',
        'т' => 't',
        'у' => 'y',
        'ү' => 'y',
        'х' => 'x',
        'і' => 'i',
        'ј' => 'j',
        'ѕ' => 's',
        'ԁ' => 'd',
        'ԛ' => 'q',
        'ԝ' => 'w',
        'ӏ' => 'l',
        // Greek
        'α' => 'a',
        'β' => 'b',
        'γ' => 'y',
        'ε' => 'e',
        'η' => 'n',
        'ι' => 'i',
        'κ' => 'k',
        'μ' => 'u',
        'ν' => 'v',
        'ο' => 'o',
        'ρ' => 'p',
        'ς' => 's',
        'τ' => 't',
        'υ' => 'u',
        'χ' => 'x',
        'ω' => 'w',
        // Latin letters that do not decompose, IPA and small capitals
        'ı' => 'i',
        'ł' => 'l',
        'ø' => 'o',
        'đ' => 'd',
        'ħ' => 'h',
        'ŧ' => 't',
        'ɑ' => 'a',
        'ɡ' => 'g',
        'ɩ' => 'i',
        'ᴀ' => 'a',
        'ʙ' => 'b',
        'ᴄ' => 'c',
        'ᴅ' => 'd',
        'ᴇ' => 'e',
        'ғ' => 'f',
        'ɢ' => 'g',
        'ʜ' => 'h',
        'ɪ' => 'i',
        'ᴊ' => 'j',
        'ᴋ' => 'k',
        'ʟ' => 'l',
        'ᴍ' => 'm',
        'ɴ' => 'n',
        'ᴏ' => 'o',
        'ᴘ' => 'p',
        'ʀ' => 'r',
        'ꜱ' => 's',
        'ᴛ' => 't',
        'ᴜ' => 'u',
        'ᴠ' => 'v',
        'ᴡ' => 'w',
        'ʏ' => 'y',
        'ᴢ' => 'z',
        _ => return None,
    })
}

/// Whether `text` is written in a script of look-alikes (Cyrillic,
/// Greek): it has a letter outside ASCII with no Latin twin (`ж`, `λ`),
/// which nobody disguising a Latin word would use.
fn written_in_lookalike_script(text: &str) -> bool {
    text.chars().any(|c| {
        c.is_alphabetic() && !c.is_ascii() && homoglyph(c).is_none() && is_cyrillic_or_greek(c)
    })
}

fn is_cyrillic_or_greek(c: char) -> bool {
    matches!(c, '\u{0370}'..='\u{03FF}' | '\u{0400}'..='\u{052F}' | '\u{1F00}'..='\u{1FFF}')
}

/// Maps look-alikes only in words that are evidently disguised Latin: words
/// that also contain ASCII letters (`kіll` with a Cyrillic `і`), or, when
/// `lookalike_words`, whose letters are all look-alikes (`ѕех`). A Russian
/// or Greek word with any letter that has no Latin twin is left alone, and
/// so is every word of a text written in those scripts, so real text in
/// them reaches the model intact.
fn map_homoglyphs(word: &mut [char], lookalike_words: bool) {
    if word.iter().all(char::is_ascii) {
        return;
    }
    let has_ascii_letter = word.iter().any(char::is_ascii_alphabetic);
    let all_lookalike = lookalike_words
        && word
            .iter()
            .filter(|c| c.is_alphabetic() && !c.is_ascii())
            .all(|&c| homoglyph(c).is_some());
    if !(has_ascii_letter || all_lookalike) {
        return;
    }
    for c in word.iter_mut() {
        if let Some(latin) = homoglyph(*c) {
            *c = latin;
        }
    }
}

// ---------------------------------------------------------------------------
// Digit and symbol swaps ("leetspeak").

fn leet(c: char) -> Option<char> {
    Some(match c {
        '0' => 'o',
        '1' | '!' => 'i',
        '3' => 'e',
        '4' | '@' => 'a',
        '5' | '$' => 's',
        '7' => 't',
        _ => return None,
    })
}

/// Letters after a leading number that make it a quantity, ordinal or age
/// (`1st`, `5g`, `10am`, `12yo`), not a disguised letter.
const NUMBER_SUFFIXES: &[&str] = &[
    "st", "nd", "rd", "th", "s", "am", "pm", "h", "hr", "hrs", "m", "min", "mins", "d", "day",
    "days", "y", "yo", "yr", "yrs", "year", "years", "k", "g", "x", "p", "mb", "gb", "tb", "kb",
    "mm", "cm", "km", "kg", "lb", "lbs", "ft", "in", "ml", "px", "mp", "v", "w", "kw", "hz", "mph",
    "kmh", "yd", "oz", "pc", "pcs",
];

/// Applies digit/symbol swaps to a word that mixes letters with them, unless
/// its shape says it is a number with a unit or a name with a version
/// (`2024`, `$5`, `1st`, `mp3`, `win10`, `covid19` stay as written).
fn map_leet(word: &mut [char]) {
    if !word.iter().any(|c| c.is_alphabetic()) || !word.iter().any(|&c| leet(c).is_some()) {
        return;
    }
    if looks_like_number_or_code(word) {
        return;
    }
    let mut i = 0;
    while i < word.len() {
        if word[i] == '1' {
            // `ki11`, `a11`: a run of ones is far more often ells than eyes.
            let run = word[i..].iter().take_while(|&&c| c == '1').count();
            word[i..i + run].fill(if run >= 2 { 'l' } else { 'i' });
            i += run;
        } else {
            if let Some(letter) = leet(word[i]) {
                word[i] = letter;
            }
            i += 1;
        }
    }
}

fn looks_like_number_or_code(word: &[char]) -> bool {
    let has_symbol = word.iter().any(|c| matches!(c, '@' | '$' | '!'));
    if has_symbol {
        // `$` and `@` mixed with letters are nearly always disguise; a
        // currency amount like `$5` has no letters and never gets here.
        return false;
    }
    if word.iter().any(|c| matches!(c, '2' | '6' | '8' | '9')) {
        // A digit that stands for no letter: a number or code (`h264`, `covid19`).
        return true;
    }
    let leading = word.iter().take_while(|c| c.is_ascii_digit()).count();
    let trailing = word.iter().rev().take_while(|c| c.is_ascii_digit()).count();
    let digits = word.iter().filter(|c| c.is_ascii_digit()).count();
    let letters = word.len() - digits;
    if leading == digits {
        let suffix: String = word[leading..].iter().collect();
        return leading >= 2 || NUMBER_SUFFIXES.contains(&suffix.as_str());
    }
    if trailing == digits {
        // `win10`, `mp3` are names; `a55`, `hell0`, `ki11` are disguise.
        let ells = word[word.len() - trailing..].iter().all(|&c| c == '1');
        return (trailing >= 2 && letters >= 2 && !ells) || (trailing == 1 && letters <= 2);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> String {
        normalize(s)
    }

    #[test]
    fn ordinary_text_is_only_lower_cased() {
        for s in [
            "The quick brown fox jumps over the lazy dog.",
            "Meet me at 10am on the 1st of May 2024, it costs $5 (or 4.50 EUR)!",
            "I'll upload the mp3 to win10 after covid19 ends; call 555-0100.",
            "Class assessment: the therapist said Scunthorpe's skill is killer.",
            "e.g. the U.S. and i.e. a b",
            "Hello!!! What?! email: john.doe@example.com",
            "  multiple   spaces\tand\nnewlines  ",
        ] {
            assert_eq!(n(s), s.to_lowercase(), "changed: {s:?}");
        }
    }

    #[test]
    fn fullwidth_and_mathematical_letters_fold_via_nfkc() {
        assert_eq!(n("ＫＩＬＬ"), "kill");
        assert_eq!(n("𝐤𝐢𝐥𝐥 𝓎ℴ𝓊"), "kill you");
        assert_eq!(n("Ⓚⓘⓛⓛ"), "kill");
    }

    #[test]
    fn zero_width_and_invisible_characters_are_removed() {
        assert_eq!(n("k\u{200B}i\u{200C}l\u{200D}l"), "kill");
        assert_eq!(n("ki\u{2060}ll\u{FEFF}"), "kill");
        assert_eq!(n("sui\u{00AD}cide"), "suicide");
        assert_eq!(n("ha\u{FE0F}te"), "hate");
        assert_eq!(n("di\u{E0041}e"), "die");
    }

    #[test]
    fn diacritics_and_zalgo_are_stripped() {
        assert_eq!(n("kíll yóu"), "kill you");
        assert_eq!(n("k\u{0336}i\u{0335}l\u{0334}l\u{0337}"), "kill");
        assert_eq!(n("Z̸̢͈a̵͚l̶g̷o"), "zalgo");
        assert_eq!(n("Crème Brûlée"), "creme brulee");
    }

    #[test]
    fn script_specific_marks_and_other_scripts_survive() {
        assert_eq!(n("नमस्ते"), "नमस्ते".nfc().collect::<String>());
        assert_eq!(n("がんばって"), "がんばって");
        assert_eq!(n("한국어"), "한국어");
        assert_eq!(n("Привет мир"), "привет мир");
        assert_eq!(n("Καλημέρα"), "καλημερα");
    }

    #[test]
    fn homoglyphs_in_latin_words_become_latin() {
        // Cyrillic а, е, о, р, с, х, у, і, ѕ inside Latin words.
        assert_eq!(n("kіll"), "kill");
        assert_eq!(n("hаtе"), "hate");
        assert_eq!(n("ѕuісіdе"), "suicide");
        assert_eq!(n("рrоxу"), "proxy");
        // Greek omicron and iota.
        assert_eq!(n("dοg kιll"), "dog kill");
        // Entirely look-alike words are disguised Latin too.
        assert_eq!(n("ѕех"), "sex");
        // Small capitals from "fancy text" generators.
        assert_eq!(n("ᴋɪʟʟ ʏᴏᴜ"), "kill you");
    }

    #[test]
    fn elongated_letters_collapse_to_two() {
        assert_eq!(n("kiiiiill"), "kiill");
        assert_eq!(n("KIIILLLL"), "kiill");
        assert_eq!(n("nooooo"), "noo");
        assert_eq!(n("see all"), "see all");
        assert_eq!(n("1000 www"), "1000 www");
        assert_eq!(normalize_single_repeats("kiiiiill"), "kill");
        assert_eq!(normalize_single_repeats("killll"), "kil");
        assert_eq!(normalize_single_repeats("see all"), "see all");
    }

    fn dedouble_variants(token: &str, max_runs: usize) -> Vec<String> {
        let mut out = Vec::new();
        for_each_dedouble_variant(token, max_runs, &mut String::new(), |v| {
            out.push(v.to_string())
        });
        out
    }

    #[test]
    fn dedouble_variants_try_one_and_two() {
        let v = dedouble_variants("kiill", 4);
        assert_eq!(v[0], "kiill");
        assert!(v.contains(&"kill".to_string()));
        assert!(v.contains(&"kil".to_string()));
        assert_eq!(v.len(), 4);
        assert_eq!(dedouble_variants("abc", 4), vec!["abc".to_string()]);
        assert_eq!(dedouble_variants("aabbccddeeff", 3).len(), 8);
    }

    #[test]
    fn words_spelt_with_separators_are_rejoined() {
        assert_eq!(n("k i l l you"), "kill you");
        assert_eq!(n("s.u.i.c.i.d.e"), "suicide");
        assert_eq!(n("k-i-l-l"), "kill");
        assert_eq!(n("k_i_l_l"), "kill");
        assert_eq!(n("I will K*I*L*L you."), "i will kill you.");
        assert_eq!(n("go d.i.e."), "go die.");
        // Mixed with leet inside the spelt word.
        assert_eq!(n("k 1 l l"), "kill");
    }

    /// Issue #56: text in other scripts reaches the model as written (lower
    /// case aside): no letter lost, none mapped to a Latin look-alike, and
    /// every piece maps back to its own bytes.
    #[test]
    fn other_scripts_pass_through_unharmed() {
        for text in [
            "Я ненавижу всех мигрантов, они грязные животные.",
            "أنا أكره كل المهاجرين، إنهم حيوانات قذرة.",
            "मुझे सभी मुसलमानों से नफ़रत है।",
            "我讨厌所有的黑人，他们都是肮脏的畜生。",
            "모든 이민자들은 더러운 짐승이다.",
            "Ελλάδα και Κύπρος",
        ] {
            let traced = normalize_traced(text, Options::default());
            let expected: String = text
                .nfkd()
                .filter(|&c| !is_diacritic(c))
                .nfc()
                .flat_map(char::to_lowercase)
                .collect();
            if traced.text != text.to_lowercase() {
                // Only combining marks (Devanagari's nukta, Greek accents)
                // may go, as for Latin accents.
                assert_eq!(traced.text, expected, "{text}");
            }
            let back = traced.map.to_original(0..traced.text.len()).unwrap();
            assert_eq!(back, 0..text.len(), "{text}");
        }
    }

    /// Issue #54: letters spread with runs of spaces were left apart, so
    /// `k  i  l  l` slipped past the lexicon and the model's second view.
    /// The narrowest gap of a run is the one between letters; wider gaps
    /// part its words.
    #[test]
    fn letters_spread_with_runs_of_spaces_are_rejoined_word_by_word() {
        assert_eq!(n("k  i  l  l"), "kill");
        assert_eq!(n("k i l l   y o u r s e l f now"), "kill   yourself now");
        assert_eq!(
            n("k  i  l  l     y  o  u  r  s  e  l  f"),
            "kill     yourself"
        );
        assert_eq!(n("k   i   l   l  y o u"), "k   i   l   l  you");
        assert_eq!(n("I will k    i    l    l you"), "i will kill you");
        // Beyond MAX_SPACE_GAP spaces it is layout, not spelling.
        let far = ["k", "i", "l", "l"].join(&" ".repeat(MAX_SPACE_GAP + 1));
        assert_eq!(n(&far), far);
        // Each rejoined word maps back to its own letters.
        let text = "go  k  i  l  l     y  o  u  r  s  e  l  f";
        let traced = normalize_traced(text, Options::default());
        assert_eq!(traced.text, "go  kill     yourself");
        let at = traced.text.find("yourself").unwrap();
        let back = traced.map.to_original(at..at + "yourself".len()).unwrap();
        assert_eq!(&text[back], "y  o  u  r  s  e  l  f");
    }

    #[test]
    fn masked_letters_are_restored_to_the_lexicon_word() {
        assert_eq!(n("I will m*rder you"), "i will murder you");
        assert_eq!(n("f#ck off"), "fuck off");
        assert_eq!(n("f**k you"), "fuck you");
        assert_eq!(n("k!ll yourself"), "kill yourself");
        assert_eq!(n("sh1t"), "shit");
        assert_eq!(n("sh*t head"), "shit head");
        // Not a disguise: left exactly as the pieces were before.
        assert_eq!(n("2*3 = 6"), "2*3 = 6");
        assert_eq!(n("my_variable_name"), "my_variable_name");
        assert_eq!(n("***bold***"), "***bold***");
        assert_eq!(n("note*"), "note*");
    }

    #[test]
    fn short_or_numeric_single_runs_are_not_rejoined() {
        assert_eq!(n("e.g. a b"), "e.g. a b");
        assert_eq!(n("1 2 3 4"), "1 2 3 4");
        assert_eq!(n("a  b"), "a  b");
        assert_eq!(n("i am a man"), "i am a man");
    }

    #[test]
    fn digit_and_symbol_swaps_inside_mixed_words() {
        assert_eq!(n("k1ll"), "kill");
        assert_eq!(n("ki11"), "kill");
        assert_eq!(n("h@te"), "hate");
        assert_eq!(n("a$$"), "ass");
        assert_eq!(n("sh!t"), "shit");
        assert_eq!(n("5hit"), "shit");
        assert_eq!(n("d13"), "die");
        assert_eq!(n("1d10t"), "idiot");
        assert_eq!(n("a55"), "ass");
        assert_eq!(n("hell0"), "hello");
        assert_eq!(n("b00bs"), "boobs");
        assert_eq!(n("7h3 5uicid3"), "the suicide");
    }

    #[test]
    fn numbers_units_and_codes_keep_their_digits() {
        for s in [
            "2024", "$5", "1st", "2nd", "10am", "5g", "12yo", "5yrs", "mp3", "win10", "h264",
            "covid19", "3d", "4k",
        ] {
            assert_eq!(n(s), s, "changed: {s}");
        }
        assert_eq!(n("hello! world!"), "hello! world!");
    }

    #[test]
    fn tokens_split_on_non_alphanumerics() {
        let t: Vec<&str> = tokens("you're dead, 12-year-old!").collect();
        assert_eq!(t, ["you", "re", "dead", "12", "year", "old"]);
        assert_eq!(tokens("").count(), 0);
    }

    #[test]
    fn empty_and_huge_inputs_are_handled() {
        assert_eq!(n(""), "");
        let huge = "k\u{200B}i l l é ".repeat(200_000);
        assert!(huge.len() > 1_000_000);
        let out = n(&huge);
        assert!(out.len() <= huge.len());
        assert!(out.starts_with("ki lle ki lle "), "{}", &out[..20]);
        let over = "ab".repeat(MAX_INPUT_BYTES / 2 + 10);
        assert_eq!(n(&over).len(), MAX_INPUT_BYTES);
        // A cut in the middle of a multi-byte character must not panic.
        let multibyte = "é".repeat(MAX_INPUT_BYTES / 2 + 1);
        assert!(n(&multibyte).len() <= MAX_INPUT_BYTES);
    }

    #[test]
    fn normalize_is_idempotent_on_evasions() {
        for s in [
            "k i l l",
            "k1ll",
            "kiiiill",
            "hаtе",
            "s.u.i.c.i.d.e",
            "a$$ h@te",
        ] {
            let once = n(s);
            assert_eq!(n(&once), once, "not idempotent: {s:?}");
        }
    }

    // -- the way back to the original --------------------------------------

    /// The original text behind the normalised `word` (its first occurrence).
    fn original_of<'a>(text: &'a str, word: &str) -> &'a str {
        let traced = normalize_traced(text, Options::default());
        let at = traced.text.find(word).unwrap_or_else(|| {
            panic!("{word:?} not in {:?}", traced.text);
        });
        let range = traced.map.to_original(at..at + word.len()).expect("mapped");
        &text[range]
    }

    const TRACED_SAMPLES: [&str; 16] = [
        "The quick brown fox jumps over the lazy dog.",
        "I will m*rder you, f#ck off",
        "k i l l you and s.u.i.c.i.d.e now",
        "I will K*I*L*L you.",
        "k1ll ki11 h@te a$$ 7h3 5uicid3",
        "kiiiiill KIIILLLL nooooo",
        "ＫＩＬＬ 𝐤𝐢𝐥𝐥 𝓎ℴ𝓊 Ⓚⓘⓛⓛ",
        "k\u{200B}i\u{200C}l\u{200D}l sui\u{00AD}cide di\u{E0041}e",
        "kíll yóu Z̸̢͈a̵͚l̶g̷o Crème Brûlée",
        "नमस्ते がんばって 한국어 Привет мир Καλημέρα",
        "kіll hаtе ѕех ᴋɪʟʟ ʏᴏᴜ",
        "email: john.doe@example.com 2*3 = 6 ***bold*** note*",
        "\u{1100}\u{1161}\u{11A8} \u{0B47}\u{0B3E} e\u{200B}\u{0301}x",
        "",
        "  multiple   spaces\tand\nnewlines  ",
        "you’re dead, 12-year-old! k  i  l  l",
    ];

    #[test]
    fn the_traced_text_is_the_normalised_text() {
        for s in TRACED_SAMPLES {
            for options in [
                Options::default(),
                Options {
                    repeats: Repeats::CollapseToOne,
                },
            ] {
                assert_eq!(
                    normalize_traced(s, options).text,
                    normalize_with(s, options),
                    "{s:?}"
                );
            }
        }
    }

    #[test]
    fn rewritten_words_map_back_to_what_was_written() {
        assert_eq!(original_of("I will m*rder you", "murder"), "m*rder");
        assert_eq!(original_of("ok, I will k1ll you", "kill"), "k1ll");
        assert_eq!(original_of("they said k i l l you", "kill"), "k i l l");
        assert_eq!(
            original_of("go s.u.i.c.i.d.e now", "suicide"),
            "s.u.i.c.i.d.e"
        );
        assert_eq!(original_of("a KIIIILL b", "kiill"), "KIIIILL");
        assert_eq!(original_of("so ki\u{200B}ll him", "kill"), "ki\u{200B}ll");
        assert_eq!(original_of("Ｉ ＫＩＬＬ", "kill"), "ＫＩＬＬ");
        assert_eq!(original_of("kíll yóu", "you"), "yóu");
        assert_eq!(original_of("a kіll b", "kill"), "kіll");
        assert_eq!(original_of("Hello World", "world"), "World");
        // Inside an unchanged word, positions map exactly.
        assert_eq!(original_of("Hello World", "orl"), "orl");
        assert_eq!(original_of("f**k you", "fuck"), "f**k");
    }

    #[test]
    fn every_mapped_range_lies_on_the_original_character_boundaries() {
        for s in TRACED_SAMPLES {
            let traced = normalize_traced(s, Options::default());
            let n = &traced.text;
            let bounds: Vec<usize> = n.char_indices().map(|(i, _)| i).chain([n.len()]).collect();
            for (i, &a) in bounds.iter().enumerate() {
                for &b in &bounds[i + 1..] {
                    let r = traced
                        .map
                        .to_original(a..b)
                        .expect("a non-empty range maps");
                    assert!(
                        r.start < r.end && r.end <= s.len(),
                        "{s:?} {a}..{b} → {r:?}"
                    );
                    assert!(
                        s.is_char_boundary(r.start) && s.is_char_boundary(r.end),
                        "{s:?}"
                    );
                }
            }
            assert_eq!(traced.map.to_original(0..0), None);
        }
    }

    #[test]
    fn token_ranges_are_the_tokens() {
        for s in TRACED_SAMPLES {
            let n = normalize(s);
            let by_range: Vec<&str> = token_ranges(&n).map(|r| &n[r]).collect();
            assert_eq!(by_range, tokens(&n).collect::<Vec<_>>(), "{s:?}");
        }
    }
}
