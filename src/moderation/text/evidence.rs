//! The lexical layer's evidence: which terms matched, where the client
//! wrote them. Terms are matched on the normalised text (`m*rder` is read
//! as `murder`), so each match is mapped back through the normaliser's
//! [`OffsetMap`](super::normalize::OffsetMap) to the characters as sent.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::lexical::{LexicalClassifier, LexicalMatch};
use super::normalize::{normalize_traced, token_ranges, Options};
use crate::moderation::category::{Category, CategoryScores};
use crate::moderation::deadline::{Deadline, DeadlineExceeded};
use crate::moderation::explain::{Evidence, ItemRange, ItemRanges, Source};

/// Places kept of one matched term (in one category). An explanation shows
/// at most [`MAX_LEXICON_PIECES`](crate::moderation::explain::MAX_LEXICON_PIECES)
/// terms a category, the strongest first: the thousandth `kys` adds nothing
/// to the first few, and keeping every one made `explain` cost the square
/// of the matches (issue #58, D).
pub const MAX_PLACES_PER_TERM: usize = 4;
/// Matched terms kept a category, whichever they are: bounds the evidence
/// of a text made of many different terms.
pub const MAX_MATCHES_PER_CATEGORY: usize = 64;
/// Matches looked at between two deadline checks.
const DEADLINE_EVERY: usize = 256;

/// The terms matched in `text`, each with the byte range of `text` it was
/// written as and its weight in every category it counts towards: at most
/// [`MAX_PLACES_PER_TERM`] places of a term and [`MAX_MATCHES_PER_CATEGORY`]
/// terms a category, the first written first. Stops at `deadline`.
pub fn lexicon_evidence(
    lexical: &LexicalClassifier,
    text: &str,
    deadline: &Deadline,
) -> Result<Vec<Evidence<Range<usize>>>, DeadlineExceeded> {
    let traced = normalize_traced(text, Options::default());
    deadline.check()?;
    let tokens: Vec<Range<usize>> = token_ranges(&traced.text).collect();
    let matches = lexical.explain(&traced.text);
    deadline.check()?;
    let group_mentioned = matches.iter().any(|m| m.kind == "group");
    let mut bound = MatchBound::default();
    let mut out = Vec::new();
    for (n, m) in matches.iter().enumerate() {
        if n % DEADLINE_EVERY == 0 {
            deadline.check()?;
        }
        let Some(scores) = term_scores(m, group_mentioned) else {
            continue;
        };
        if !bound.admit(m) {
            continue;
        }
        let place = (|| {
            let first = tokens.get(m.tokens.0)?;
            let last = tokens.get(m.tokens.1.checked_sub(1)?)?;
            traced.map.to_original(first.start..last.end)
        })();
        if let Some(place) = place {
            out.push(Evidence {
                place,
                scores,
                source: Source::Lexicon,
            });
        }
    }
    Ok(out)
}

/// How many places of each term, and terms of each category, were kept.
#[derive(Default)]
struct MatchBound<'a> {
    per_term: HashMap<(&'static str, Option<Category>, &'a str), usize>,
    per_category: HashMap<(&'static str, Option<Category>), usize>,
}

impl<'a> MatchBound<'a> {
    /// Whether `m` is kept: its term and its category still have room.
    fn admit(&mut self, m: &'a LexicalMatch) -> bool {
        let category = (m.kind, m.category);
        let in_category = self.per_category.entry(category).or_default();
        if *in_category >= MAX_MATCHES_PER_CATEGORY {
            return false;
        }
        let of_term = self
            .per_term
            .entry((m.kind, m.category, m.term.as_str()))
            .or_default();
        if *of_term >= MAX_PLACES_PER_TERM {
            return false;
        }
        *of_term += 1;
        *in_category += 1;
        true
    }
}

/// The terms matched in the items taken together (joined by a line break,
/// and run together, as the combined text is scored), each placed in the
/// items it was written across.
pub fn combined_lexicon_evidence(
    lexical: &LexicalClassifier,
    items: &[&str],
    deadline: &Deadline,
) -> Result<Vec<Evidence<ItemRanges>>, DeadlineExceeded> {
    let mut out: Vec<Evidence<ItemRanges>> = Vec::new();
    // The places already kept: a set, so that the check costs the same
    // however many terms matched (a list scan made it quadratic).
    let mut seen: HashSet<ItemRanges> = HashSet::new();
    for separator in ["\n", ""] {
        let joined = items.join(separator);
        let starts = item_starts(items, separator.len());
        for piece in lexicon_evidence(lexical, &joined, deadline)? {
            let Some(place) = split_by_items(items, &starts, piece.place) else {
                continue;
            };
            if seen.insert(place.clone()) {
                out.push(Evidence {
                    place,
                    scores: piece.scores,
                    source: piece.source,
                });
            }
        }
    }
    Ok(out)
}

/// Where each item starts in the items joined by `separator_len` bytes.
fn item_starts(items: &[&str], separator_len: usize) -> Vec<usize> {
    let mut at = 0;
    items
        .iter()
        .map(|t| {
            let start = at;
            at += t.len() + separator_len;
            start
        })
        .collect()
}

/// A byte range of the joined items as ranges of the items (separators
/// dropped); `None` when it covers no item's text.
fn split_by_items(items: &[&str], starts: &[usize], r: Range<usize>) -> Option<ItemRanges> {
    ItemRanges::new(
        items
            .iter()
            .zip(starts)
            .enumerate()
            .filter_map(|(item, (text, &start))| {
                let (a, b) = (r.start.max(start), r.end.min(start + text.len()));
                (a < b).then(|| ItemRange {
                    item,
                    bytes: a - start..b - start,
                })
            }),
    )
}

/// What a matched term weighs in each category it counts towards: its
/// own, the category it is a kind of (a threat is harassment), and the
/// composed categories it is an ingredient of (`hate/threatening` from
/// hate and threats, `sexual/minors` from sexual terms and words about
/// children). `None` for a term that counts towards nothing: a
/// group-directed phrase with no group mentioned, a group mention alone.
fn term_scores(m: &LexicalMatch, group_mentioned: bool) -> Option<CategoryScores> {
    let mut scores = CategoryScores::default();
    match (m.kind, m.category) {
        ("category", Some(c)) => raise(&mut scores, c, m.weight),
        ("group-directed", Some(c)) if group_mentioned => raise(&mut scores, c, m.weight),
        ("minor", _) => scores.set(Category::SexualMinors, m.weight),
        _ => return None,
    }
    Some(scores)
}

fn raise(scores: &mut CategoryScores, category: Category, weight: f32) {
    scores.set(category, weight);
    if let Some(parent) = category.parent() {
        scores.set(parent, weight);
    }
    let ingredient_of = match category {
        Category::Hate | Category::HarassmentThreatening | Category::Violence => {
            Some(Category::HateThreatening)
        }
        Category::Sexual => Some(Category::SexualMinors),
        _ => None,
    };
    if let Some(composed) = ingredient_of {
        scores.set(composed, scores.get(composed).max(weight));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lexical() -> &'static LexicalClassifier {
        static LEXICAL: std::sync::OnceLock<LexicalClassifier> = std::sync::OnceLock::new();
        LEXICAL.get_or_init(LexicalClassifier::new)
    }

    /// The original text of each matched term counting towards `category`.
    fn terms_for(text: &str, category: Category) -> Vec<&str> {
        lexicon_evidence(lexical(), text, &Deadline::distant())
            .unwrap()
            .into_iter()
            .filter(|e| e.scores.get(category) > 0.0)
            .map(|e| &text[e.place])
            .collect()
    }

    #[test]
    fn a_term_is_placed_where_it_was_written() {
        let text = "Nice weather today. I am going to kill you. See you at the game.";
        let terms = terms_for(text, Category::HarassmentThreatening);
        assert!(terms.iter().any(|t| t.contains("kill you")), "{terms:?}");
    }

    #[test]
    fn disguised_terms_map_back_to_the_disguise() {
        for (text, written) in [
            ("well, I will m*rder you tonight", "m*rder"),
            ("honestly k1ll yourself", "k1ll"),
            ("you should k i l l yourself", "k i l l"),
            ("I will ＫＩＬＬ you", "ＫＩＬＬ"),
            ("go k\u{200B}ill yourself", "k\u{200B}ill"),
        ] {
            let evidence = lexicon_evidence(lexical(), text, &Deadline::distant()).unwrap();
            assert!(
                evidence
                    .iter()
                    .any(|e| text[e.place.clone()].contains(written)),
                "{text:?}: {:?}",
                evidence
                    .iter()
                    .map(|e| &text[e.place.clone()])
                    .collect::<Vec<_>>()
            );
            for e in &evidence {
                assert!(e.place.end <= text.len() && e.place.start < e.place.end);
            }
        }
    }

    #[test]
    fn a_term_split_across_items_names_both() {
        let items = ["ok so I will ki", "ll you tomorrow"];
        let evidence = combined_lexicon_evidence(lexical(), &items, &Deadline::distant()).unwrap();
        let split = evidence
            .iter()
            .find(|e| e.place.ranges().len() == 2)
            .unwrap_or_else(|| panic!("no split term in {evidence:?}"));
        let ranges = split.place.ranges();
        assert_eq!((ranges[0].item, ranges[1].item), (0, 1));
        assert!(items[0][ranges[0].bytes.clone()].ends_with("ki"));
        assert!(items[1][ranges[1].bytes.clone()].starts_with("ll"));
    }

    #[test]
    fn the_joined_items_split_back_without_separators() {
        let items = ["ab", "cd", "ef"];
        let starts = item_starts(&items, 1);
        assert_eq!(starts, [0, 3, 6]);
        let r = split_by_items(&items, &starts, 1..7).expect("covers items");
        let parts: Vec<_> = r
            .ranges()
            .iter()
            .map(|r| (r.item, r.bytes.clone()))
            .collect();
        assert_eq!(parts, [(0, 1..2), (1, 0..2), (2, 0..1)]);
        assert_eq!(
            split_by_items(&items, &starts, 2..3),
            None,
            "the separator alone"
        );
    }

    /// Issue #58, D: a text of one term repeated 25,000 times keeps a few
    /// of its places, not all of them, so the evidence (and the work of
    /// explaining it) stays the same however long the repetition.
    #[test]
    fn a_repeated_term_keeps_a_bounded_number_of_places() {
        let short = "kys ".repeat(100);
        let long = "kys ".repeat(25_000);
        let few = lexicon_evidence(lexical(), &short, &Deadline::distant()).unwrap();
        let many = lexicon_evidence(lexical(), &long, &Deadline::distant()).unwrap();
        assert!(!few.is_empty(), "kys is a lexicon term");
        // "kys" matches a few terms (each counted apart), each kept at most
        // MAX_PLACES_PER_TERM times: 25,000 repetitions keep what 100 do.
        assert!(few.len() <= MAX_MATCHES_PER_CATEGORY, "{}", few.len());
        assert_eq!(few.len(), many.len());
        let items = [long.as_str(), long.as_str(), long.as_str(), long.as_str()];
        let combined = combined_lexicon_evidence(lexical(), &items, &Deadline::distant()).unwrap();
        // Two joinings (with and without line breaks), each bounded.
        assert!(combined.len() <= 2 * few.len(), "{}", combined.len());
    }

    #[test]
    fn many_different_terms_are_bounded_per_category() {
        let mut bound = MatchBound::default();
        let terms: Vec<LexicalMatch> = (0..1000)
            .map(|i| LexicalMatch {
                term: format!("term{i}"),
                category: Some(Category::Harassment),
                kind: "category",
                weight: 1.0,
                tokens: (i, i + 1),
            })
            .collect();
        let kept = terms.iter().filter(|m| bound.admit(m)).count();
        assert_eq!(kept, MAX_MATCHES_PER_CATEGORY);
    }

    #[test]
    fn explaining_stops_at_the_deadline() {
        let over = Deadline::after(std::time::Duration::ZERO);
        let long = "kys ".repeat(1000);
        assert_eq!(
            lexicon_evidence(lexical(), &long, &over),
            Err(DeadlineExceeded)
        );
        assert!(combined_lexicon_evidence(lexical(), &[&long, &long], &over).is_err());
    }
}
