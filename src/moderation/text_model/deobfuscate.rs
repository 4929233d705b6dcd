//! A compact de-obfuscation pass for the model's second view of a text.
//!
//! Stand-in until the shared normaliser (`moderation::normalize`, branch
//! `text`) is merged: it undoes the common tricks — invisible characters,
//! accents and compatibility forms, letters spelt out with separators
//! (`k i l l`, `s.u.i.c.i.d.e`), digit swaps inside words (`k1ll`) and
//! elongations (`kiiiill`) — and otherwise leaves text alone but for case.

use unicode_normalization::UnicodeNormalization;

/// Runs of single letters shorter than this (`e.g.`, `u s`) are left alone.
const MIN_SPELT_OUT: usize = 3;

pub fn normalize(text: &str) -> String {
    normalize_with(text, 2)
}

/// [`normalize`] with elongations cut to one letter (`kiiiill` → `kil`,
/// `killll` → `kil`); the model gets both forms since the right length is
/// unknown.
pub fn normalize_single_repeats(text: &str) -> String {
    normalize_with(text, 1)
}

fn normalize_with(text: &str, keep: usize) -> String {
    let folded: String = text
        .nfkd()
        .filter(|c| !is_invisible(*c) && !unicode_normalization::char::is_combining_mark(*c))
        .flat_map(char::to_lowercase)
        .collect();
    let words = rejoin_spelt_out(&folded);
    words
        .iter()
        .map(|w| collapse_repeats(&undigit(w), keep))
        .collect::<Vec<_>>()
        .join(" ")
}

fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200F}' | '\u{2060}'..='\u{2064}' | '\u{FEFF}' | '\u{00AD}' | '\u{180E}'
    )
}

/// Splits on whitespace, then glues runs of one-letter pieces (`k i l l`)
/// and dotted spellings (`s.u.i.c.i.d.e`) back into words.
fn rejoin_spelt_out(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut run: Vec<String> = Vec::new();
    for word in text.split_whitespace() {
        let letters = spelt_letters(word);
        match letters {
            Some(ls) if ls.len() == 1 => run.push(ls.concat()),
            Some(ls) if ls.len() >= MIN_SPELT_OUT => {
                flush(&mut run, &mut out);
                out.push(ls.concat());
            }
            _ => {
                flush(&mut run, &mut out);
                out.push(word.to_string());
            }
        }
    }
    flush(&mut run, &mut out);
    out
}

/// The letters of a word made of single characters joined by `.`, `-`,
/// `_` or `*` (or of a lone letter), if it is one.
fn spelt_letters(word: &str) -> Option<Vec<String>> {
    let pieces: Vec<&str> = word
        .split(['.', '-', '_', '*'])
        .filter(|p| !p.is_empty())
        .collect();
    let single = |p: &&str| p.chars().count() == 1 && p.chars().all(char::is_alphanumeric);
    if !pieces.is_empty() && pieces.iter().all(single) {
        Some(pieces.iter().map(|p| p.to_string()).collect())
    } else {
        None
    }
}

fn flush(run: &mut Vec<String>, out: &mut Vec<String>) {
    if run.len() >= MIN_SPELT_OUT {
        out.push(run.concat());
    } else {
        out.append(run);
    }
    run.clear();
}

/// Digit and symbol swaps, only inside words that also have letters, so
/// numbers stay numbers.
fn undigit(word: &str) -> String {
    if !word.chars().any(char::is_alphabetic) {
        return word.to_string();
    }
    let last = word.chars().count().saturating_sub(1);
    word.chars()
        .enumerate()
        .map(|(i, c)| match c {
            '0' => 'o',
            '1' => 'i',
            '3' => 'e',
            '4' => 'a',
            '5' => 's',
            '7' => 't',
            // Symbols only inside a word: `h@te`, not `you@` or `$5`.
            '@' if i > 0 && i < last => 'a',
            '$' if i > 0 && i < last => 's',
            other => other,
        })
        .collect()
}

/// Runs of three or more of the same letter become `keep` letters; shorter
/// runs (`ll` in `kill`) are spelling and stay.
fn collapse_repeats(word: &str, keep: usize) -> String {
    let mut out = String::with_capacity(word.len());
    let mut chars = word.chars().peekable();
    while let Some(c) = chars.next() {
        let mut run = 1;
        while chars.peek() == Some(&c) {
            chars.next();
            run += 1;
        }
        let n = if run >= 3 && c.is_alphabetic() {
            keep.min(run)
        } else {
            run
        };
        out.extend(std::iter::repeat_n(c, n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalize;

    #[test]
    fn undoes_common_evasions() {
        assert_eq!(normalize("I will k i l l you"), "i will kill you");
        assert_eq!(normalize("s.u.i.c.i.d.e"), "suicide");
        assert_eq!(normalize("k1ll"), "kill");
        assert_eq!(normalize("kiiiiill"), "kiill");
        assert_eq!(super::normalize_single_repeats("kiiiiill"), "kill");
        assert_eq!(super::normalize_single_repeats("killll"), "kil");
        assert_eq!(normalize("k\u{200B}ill"), "kill");
        assert_eq!(normalize("kíll"), "kill");
    }

    #[test]
    fn leaves_ordinary_text_alone_but_for_case() {
        assert_eq!(
            normalize("Meet me at 10 on Route 66, e.g. near the U.S. border"),
            "meet me at 10 on route 66, e.g. near the u.s. border"
        );
        assert_eq!(normalize("I am a cat"), "i am a cat");
    }
}
