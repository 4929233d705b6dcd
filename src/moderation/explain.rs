//! Where a verdict came from: for each flagged category, the piece of the
//! text that gave it its score (the chunk the model scored highest, the
//! term a term list matched).
//!
//! Classifiers report [`Evidence`] (every scored piece, with where it lies
//! in the text the client sent); [`explain`] then picks, for whatever is
//! flagged, the pieces that account for it. Which categories are flagged is
//! an input, not something decided here: the decision belongs to the
//! thresholds in force (the model's, the operator's, or a key's policy).

use std::ops::Range;

use super::category::{Category, CategoryScores, EffectiveThresholds, NUM_CATEGORIES};

/// At most this many model chunks explain one category: the strongest,
/// then others that reach the threshold too, strongest first.
pub const MAX_MODEL_PIECES: usize = 3;
/// At most this many matched terms explain one category.
pub const MAX_LEXICON_PIECES: usize = 3;

/// What produced a score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A chunk of the text, scored by the model.
    Model,
    /// A term of the term lists, matched in the text.
    Lexicon,
}

/// A piece of a text and what it scored. `P` says where the piece lies: a
/// byte range of one text, or [`ItemRanges`] for the combined text.
#[derive(Clone, Debug, PartialEq)]
pub struct Evidence<P> {
    pub place: P,
    pub scores: CategoryScores,
    pub source: Source,
}

/// A byte range of one text item (by its position among the text items
/// while classifying; the engine turns it into the input's index).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ItemRange {
    pub item: usize,
    pub bytes: Range<usize>,
}

/// Where a piece of the combined text lies in the items: one range, or
/// one per item for a piece that runs across neighbouring items (a threat
/// split between two messages). In item order; only the whole combined
/// text ([`ItemRanges::covering`]) has empty ranges.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ItemRanges(Vec<ItemRange>);

impl ItemRanges {
    /// `None` when no range is left once the empty ones are dropped.
    pub fn new(ranges: impl IntoIterator<Item = ItemRange>) -> Option<ItemRanges> {
        let mut ranges: Vec<ItemRange> =
            ranges.into_iter().filter(|r| !r.bytes.is_empty()).collect();
        ranges.sort_by_key(|r| (r.item, r.bytes.start));
        (!ranges.is_empty()).then_some(ItemRanges(ranges))
    }

    /// Every item whole, empty ones too: the place of the whole combined
    /// text, given item lengths in bytes.
    pub fn covering(lens: impl IntoIterator<Item = usize>) -> ItemRanges {
        ItemRanges(
            lens.into_iter()
                .enumerate()
                .map(|(item, len)| ItemRange {
                    item,
                    bytes: 0..len,
                })
                .collect(),
        )
    }

    pub fn ranges(&self) -> &[ItemRange] {
        &self.0
    }

    pub fn into_ranges(self) -> Vec<ItemRange> {
        self.0
    }
}

/// Why a category is flagged: one piece and its score for that category.
#[derive(Clone, Debug, PartialEq)]
pub struct Explanation<P> {
    pub category: Category,
    pub place: P,
    /// The piece's own score for the category (a chunk's, or a term's
    /// weight), not the text's.
    pub score: f32,
    pub source: Source,
}

/// A range of a text in Unicode scalar values, `start <= end <= ` the
/// text's length: made only by [`Span::of`], which checks it against the
/// text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    start: usize,
    end: usize,
}

impl Span {
    /// The characters of `text` that `bytes` covers, widened to character
    /// boundaries and clamped to the text, so that a span always lies
    /// inside its text whatever it was computed from.
    pub fn of(text: &str, bytes: Range<usize>) -> Span {
        let mut start = bytes.start.min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let mut end = bytes.end.clamp(start, text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        let start_chars = text[..start].chars().count();
        Span {
            start: start_chars,
            end: start_chars + text[start..end].chars().count(),
        }
    }

    pub fn start(&self) -> usize {
        self.start
    }

    pub fn end(&self) -> usize {
        self.end
    }
}

/// A [`Span`] of one text item, by its index in the request's input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemSpan {
    pub item: usize,
    pub span: Span,
}

/// For every flagged category, the pieces that explain it: model chunks
/// (the strongest always, then up to [`MAX_MODEL_PIECES`] in all that reach
/// the category's threshold) and matched terms that count towards it (up
/// to [`MAX_LEXICON_PIECES`]), each list strongest first. A flagged
/// category that no piece accounts for (a classifier that reports none, or
/// a score composed of several terms' categories) is explained by
/// `whole`, the whole text with its score, so that a flag never comes
/// without an explanation. Categories in the API's order.
pub fn explain<P: Clone + PartialEq>(
    evidence: &[Evidence<P>],
    flagged: &[bool; NUM_CATEGORIES],
    thresholds: &EffectiveThresholds,
    whole: &Evidence<P>,
) -> Vec<Explanation<P>> {
    let mut out = Vec::new();
    for category in Category::ALL.into_iter().filter(|c| flagged[c.index()]) {
        let before = out.len();
        let model = strongest(evidence, category, Source::Model);
        for (rank, piece) in model.into_iter().take(MAX_MODEL_PIECES).enumerate() {
            let score = piece.scores.get(category);
            if rank > 0 && thresholds.get(category).is_none_or(|t| score < t) {
                break;
            }
            out.push(explanation(category, piece));
        }
        let lexicon = strongest(evidence, category, Source::Lexicon);
        out.extend(
            lexicon
                .into_iter()
                .filter(|piece| piece.scores.get(category) > 0.0)
                .take(MAX_LEXICON_PIECES)
                .map(|piece| explanation(category, piece)),
        );
        if out.len() == before {
            out.push(explanation(category, whole));
        }
    }
    out
}

/// The pieces of `source`, strongest for `category` first (earlier pieces
/// first among equals), each place once.
fn strongest<P: PartialEq>(
    evidence: &[Evidence<P>],
    category: Category,
    source: Source,
) -> Vec<&Evidence<P>> {
    let mut pieces: Vec<&Evidence<P>> = evidence.iter().filter(|e| e.source == source).collect();
    pieces.sort_by(|a, b| b.scores.get(category).total_cmp(&a.scores.get(category)));
    let mut unique: Vec<&Evidence<P>> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if !unique.iter().any(|u| u.place == piece.place) {
            unique.push(piece);
        }
    }
    unique
}

fn explanation<P: Clone>(category: Category, piece: &Evidence<P>) -> Explanation<P> {
    Explanation {
        category,
        place: piece.place.clone(),
        score: piece.scores.get(category),
        source: piece.source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moderation::{CategoryRules, Thresholds};

    /// The same threshold for every category, no policy.
    fn uniform(t: f32) -> EffectiveThresholds {
        Thresholds::uniform(t).under(&CategoryRules::default())
    }

    fn scores(pairs: &[(Category, f32)]) -> CategoryScores {
        let mut s = CategoryScores::default();
        for &(c, v) in pairs {
            s.set(c, v);
        }
        s
    }

    fn piece(
        bytes: Range<usize>,
        source: Source,
        pairs: &[(Category, f32)],
    ) -> Evidence<Range<usize>> {
        Evidence {
            place: bytes,
            scores: scores(pairs),
            source,
        }
    }

    fn flags(categories: &[Category]) -> [bool; NUM_CATEGORIES] {
        let mut f = [false; NUM_CATEGORIES];
        for c in categories {
            f[c.index()] = true;
        }
        f
    }

    const T: Category = Category::HarassmentThreatening;

    #[test]
    fn the_strongest_chunk_explains_and_others_only_above_the_threshold() {
        let evidence = vec![
            piece(0..10, Source::Model, &[(T, 0.2)]),
            piece(10..20, Source::Model, &[(T, 0.9)]),
            piece(20..30, Source::Model, &[(T, 0.6)]),
            piece(30..40, Source::Model, &[(T, 0.4)]),
        ];
        let whole = piece(0..40, Source::Model, &[(T, 0.9)]);
        let got = explain(&evidence, &flags(&[T]), &uniform(0.5), &whole);
        let places: Vec<_> = got.iter().map(|e| e.place.clone()).collect();
        assert_eq!(places, [10..20, 20..30]);
        assert_eq!(got[0].score, 0.9);
        // Nothing else reaches the threshold: the strongest alone.
        let got = explain(&evidence, &flags(&[T]), &uniform(0.95), &whole);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].place, 10..20);
    }

    #[test]
    fn unflagged_categories_are_not_explained() {
        let evidence = vec![piece(0..10, Source::Model, &[(T, 0.9)])];
        let whole = piece(0..10, Source::Model, &[(T, 0.9)]);
        assert!(explain(&evidence, &flags(&[]), &uniform(0.5), &whole).is_empty());
    }

    #[test]
    fn matched_terms_explain_the_categories_they_count_towards() {
        let evidence = vec![
            piece(0..10, Source::Model, &[(T, 0.8)]),
            piece(3..9, Source::Lexicon, &[(T, 0.6)]),
            piece(12..15, Source::Lexicon, &[(Category::Hate, 0.7)]),
        ];
        let whole = piece(0..20, Source::Model, &[]);
        let got = explain(&evidence, &flags(&[T]), &uniform(0.5), &whole);
        let sources: Vec<_> = got.iter().map(|e| (e.place.clone(), e.source)).collect();
        assert_eq!(sources, [(0..10, Source::Model), (3..9, Source::Lexicon)]);
    }

    #[test]
    fn a_flag_without_evidence_is_explained_by_the_whole_text() {
        let whole = piece(0..20, Source::Lexicon, &[(Category::HateThreatening, 0.7)]);
        let got = explain(
            &[],
            &flags(&[Category::HateThreatening]),
            &uniform(0.5),
            &whole,
        );
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].place.clone(), got[0].score), (0..20, 0.7));
    }

    #[test]
    fn the_same_place_is_given_once() {
        let evidence = vec![
            piece(0..10, Source::Model, &[(T, 0.8)]),
            piece(0..10, Source::Model, &[(T, 0.7)]),
            piece(10..20, Source::Model, &[(T, 0.6)]),
        ];
        let got = explain(&evidence, &flags(&[T]), &uniform(0.5), &evidence[0]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].score, 0.8);
    }

    /// Property: over many texts and byte ranges, every span lies inside its
    /// text, and every flagged category has at least one explanation.
    #[test]
    fn spans_lie_inside_their_text_and_every_flag_is_explained() {
        let texts = [
            "",
            "a",
            "héllo wörld",
            "ＫＩＬＬ you",
            "日本語のテキスト",
            "k\u{200B}ill",
        ];
        let mut seed = 0x2545_f491_u64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % (n as u64 + 1)) as usize
        };
        for text in texts {
            for _ in 0..200 {
                let (a, b) = (next(text.len() + 3), next(text.len() + 3));
                let span = Span::of(text, a.min(b)..a.max(b));
                let chars = text.chars().count();
                assert!(
                    span.start() <= span.end() && span.end() <= chars,
                    "{text:?} {a} {b} {span:?}"
                );
            }
        }
        for _ in 0..500 {
            let evidence: Vec<_> = (0..next(4))
                .map(|i| {
                    let c = Category::ALL[next(NUM_CATEGORIES - 1)];
                    let source = if next(1) == 0 {
                        Source::Model
                    } else {
                        Source::Lexicon
                    };
                    piece(i..i + 1, source, &[(c, next(100) as f32 / 100.0)])
                })
                .collect();
            let flagged: Vec<Category> =
                Category::ALL.into_iter().filter(|_| next(2) == 0).collect();
            let whole = piece(0..9, Source::Model, &[]);
            let got = explain(&evidence, &flags(&flagged), &uniform(0.5), &whole);
            for c in &flagged {
                assert!(
                    got.iter().any(|e| e.category == *c),
                    "{c} unexplained: {evidence:?}"
                );
            }
            assert!(got.iter().all(|e| flagged.contains(&e.category)));
        }
    }

    #[test]
    fn item_ranges_drop_empty_parts_and_keep_item_order() {
        let r = ItemRanges::new([
            ItemRange {
                item: 1,
                bytes: 0..3,
            },
            ItemRange {
                item: 0,
                bytes: 5..9,
            },
            ItemRange {
                item: 2,
                bytes: 4..4,
            },
        ])
        .expect("two ranges left");
        assert_eq!(
            r.ranges().iter().map(|r| r.item).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(
            ItemRanges::new([ItemRange {
                item: 0,
                bytes: 2..2
            }]),
            None
        );
    }
}
