//! Which language a text is written in, as ISO 639-1 (`"en"`, `"zh"`), or
//! unknown when the detector is unsure: short texts, mixed languages and
//! transliterations (Hinglish, Arabizi) often are.
//!
//! The text path uses it for one decision: only a text that is surely
//! English may skip the multilingual encoder. The first stage's encoder
//! (MiniLM) reads English; on other languages its scores say little, so a
//! text that is not surely English is read by multilingual-e5 whatever the
//! first stage thinks of it (see [`super::model`]).
//!
//! whatlang (trigrams and scripts, no model file, microseconds a text) was
//! chosen over lingua, whose models for every language add about a
//! hundred megabytes to the image for a gain on very short texts that the
//! "unknown" answer already covers here.

/// A detected language, by its ISO 639-1 code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Language(&'static str);

impl Language {
    pub const ENGLISH: Language = Language("en");

    /// The ISO 639-1 code, e.g. `de`.
    pub fn code(self) -> &'static str {
        self.0
    }
}

impl std::fmt::Display for Language {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// What the detector says of a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detected {
    /// Surely this language.
    Sure(Language),
    /// Too short, mixed, transliterated or in a language the detector does
    /// not know: treated as possibly not English.
    Unsure,
}

impl Detected {
    /// The language to report: `None` when unsure.
    pub fn language(self) -> Option<Language> {
        match self {
            Detected::Sure(language) => Some(language),
            Detected::Unsure => None,
        }
    }

    /// Whether the text is surely English.
    pub fn is_english(self) -> bool {
        self == Detected::Sure(Language::ENGLISH)
    }
}

/// Texts with fewer letters than this are reported unsure: on one or two
/// words trigram statistics guess.
const MIN_LETTERS: usize = 8;

/// The detector reads at most this many bytes of a text (at a character
/// boundary): its cost is linear, and the start of a text says its
/// language as well as the whole.
const MAX_BYTES: usize = 2048;

/// The language of `text`.
pub fn detect(text: &str) -> Detected {
    let sample = prefix(text, MAX_BYTES);
    if sample.chars().filter(|c| c.is_alphabetic()).count() < MIN_LETTERS {
        return Detected::Unsure;
    }
    match whatlang::detect(sample) {
        Some(info) if info.is_reliable() => iso_639_1(info.lang().code())
            .map(|code| Detected::Sure(Language(code)))
            .unwrap_or(Detected::Unsure),
        _ => Detected::Unsure,
    }
}

fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// whatlang's ISO 639-3 codes as ISO 639-1 (`None` for a language with no
/// two-letter code).
fn iso_639_1(code: &str) -> Option<&'static str> {
    Some(match code {
        "afr" => "af",
        "aka" => "ak",
        "amh" => "am",
        "ara" => "ar",
        "aze" => "az",
        "bel" => "be",
        "ben" => "bn",
        "bul" => "bg",
        "cat" => "ca",
        "ces" => "cs",
        "cmn" => "zh",
        "cym" => "cy",
        "dan" => "da",
        "deu" => "de",
        "ell" => "el",
        "eng" => "en",
        "epo" => "eo",
        "est" => "et",
        "fin" => "fi",
        "fra" => "fr",
        "guj" => "gu",
        "heb" => "he",
        "hin" => "hi",
        "hrv" => "hr",
        "hun" => "hu",
        "hye" => "hy",
        "ind" => "id",
        "ita" => "it",
        "jav" => "jv",
        "jpn" => "ja",
        "kan" => "kn",
        "kat" => "ka",
        "khm" => "km",
        "kor" => "ko",
        "lat" => "la",
        "lav" => "lv",
        "lit" => "lt",
        "mal" => "ml",
        "mar" => "mr",
        "mkd" => "mk",
        "mya" => "my",
        "nep" => "ne",
        "nld" => "nl",
        "nob" => "nb",
        "ori" => "or",
        "pan" => "pa",
        "pes" => "fa",
        "pol" => "pl",
        "por" => "pt",
        "ron" => "ro",
        "rus" => "ru",
        "sin" => "si",
        "slk" => "sk",
        "slv" => "sl",
        "sna" => "sn",
        "spa" => "es",
        "srp" => "sr",
        "swe" => "sv",
        "tam" => "ta",
        "tel" => "te",
        "tgl" => "tl",
        "tha" => "th",
        "tuk" => "tk",
        "tur" => "tr",
        "ukr" => "uk",
        "urd" => "ur",
        "uzb" => "uz",
        "vie" => "vi",
        "yid" => "yi",
        "zul" => "zu",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code(text: &str) -> Option<&'static str> {
        detect(text).language().map(Language::code)
    }

    #[test]
    fn sentences_in_several_scripts_are_named() {
        let cases = [
            ("The weather is lovely today and we are going to the beach.", "en"),
            ("Ich habe heute keine Zeit, weil ich arbeiten muss.", "de"),
            ("No tengo tiempo hoy porque tengo que trabajar mucho.", "es"),
            ("Je n'ai pas le temps aujourd'hui parce que je travaille.", "fr"),
            ("Сегодня у меня нет времени, потому что я работаю.", "ru"),
            ("اليوم ليس لدي وقت لأنني يجب أن أعمل كثيرا.", "ar"),
            ("आज मेरे पास समय नहीं है क्योंकि मुझे काम करना है।", "hi"),
            ("我今天没有时间，因为我必须工作到很晚。", "zh"),
            ("오늘은 일을 해야 해서 시간이 없습니다.", "ko"),
        ];
        for (text, expected) in cases {
            assert_eq!(code(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn short_or_unreadable_texts_are_unsure() {
        assert_eq!(detect("ok"), Detected::Unsure);
        assert_eq!(detect("lol 😂😂"), Detected::Unsure);
        assert_eq!(detect("12345 !!! ???"), Detected::Unsure);
        assert!(!detect("").is_english());
    }

    #[test]
    fn only_sure_english_is_english() {
        assert!(detect("Please send me the report before the meeting tomorrow.").is_english());
        assert!(!detect("Bitte schicken Sie mir den Bericht vor dem Treffen.").is_english());
    }

    #[test]
    fn a_long_text_is_read_from_its_start_only() {
        let long = format!("{}{}", "Das ist ein ganz normaler Satz. ".repeat(200), "é");
        assert_eq!(code(&long), Some("de"));
        assert!(prefix(&long, MAX_BYTES).len() <= MAX_BYTES);
        let multibyte = "ж".repeat(3000);
        assert!(multibyte.is_char_boundary(prefix(&multibyte, 2047).len()));
    }
}
