//! The lexical layer's evidence: which terms matched, where the client
//! wrote them. Terms are matched on the normalised text (`m*rder` is read
//! as `murder`), so each match is mapped back through the normaliser's
//! [`OffsetMap`](super::normalize::OffsetMap) to the characters as sent.

use std::ops::Range;

use super::lexical::{LexicalClassifier, LexicalMatch};
use super::normalize::{normalize_traced, token_ranges, Options};
use crate::moderation::category::{Category, CategoryScores};
use crate::moderation::explain::{Evidence, ItemRange, ItemRanges, Source};

/// The terms matched in `text`, each with the byte range of `text` it was
/// written as and its weight in every category it counts towards.
pub fn lexicon_evidence(lexical: &LexicalClassifier, text: &str) -> Vec<Evidence<Range<usize>>> {
    let traced = normalize_traced(text, Options::default());
    let tokens: Vec<Range<usize>> = token_ranges(&traced.text).collect();
    let matches = lexical.explain(&traced.text);
    let group_mentioned = matches.iter().any(|m| m.kind == "group");
    matches
        .iter()
        .filter_map(|m| {
            let scores = term_scores(m, group_mentioned)?;
            let first = tokens.get(m.tokens.0)?;
            let last = tokens.get(m.tokens.1.checked_sub(1)?)?;
            let place = traced.map.to_original(first.start..last.end)?;
            Some(Evidence {
                place,
                scores,
                source: Source::Lexicon,
            })
        })
        .collect()
}

/// The terms matched in the items taken together (joined by a line break,
/// and run together, as the combined text is scored), each placed in the
/// items it was written across.
pub fn combined_lexicon_evidence(
    lexical: &LexicalClassifier,
    items: &[&str],
) -> Vec<Evidence<ItemRanges>> {
    let mut out: Vec<Evidence<ItemRanges>> = Vec::new();
    for separator in ["\n", ""] {
        let joined = items.join(separator);
        let starts = item_starts(items, separator.len());
        for piece in lexicon_evidence(lexical, &joined) {
            let Some(place) = split_by_items(items, &starts, piece.place) else {
                continue;
            };
            if !out.iter().any(|o| o.place == place) {
                out.push(Evidence {
                    place,
                    scores: piece.scores,
                    source: piece.source,
                });
            }
        }
    }
    out
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
        lexicon_evidence(lexical(), text)
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
            let evidence = lexicon_evidence(lexical(), text);
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
        let evidence = combined_lexicon_evidence(lexical(), &items);
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
}
