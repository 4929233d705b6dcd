//! Which language a text is written in, as ISO 639-1 (`"en"`, `"zh"`), or
//! unknown when the detector is unsure: short texts, mixed languages and
//! transliterations (Hinglish, Arabizi) often are.
//!
//! The text path uses it to route a text ([`Route`]): only a text that
//! reads as English may skip the multilingual encoder. The first stage's
//! encoder (MiniLM) reads English; on other languages its scores say
//! little, so any other text is read by multilingual-e5 whatever the first
//! stage thinks of it, and a text that reads as another language is judged
//! by e5's heads for other languages alone (see [`super::model`]).
//!
//! whatlang (trigrams and scripts, no model file, microseconds a text) was
//! chosen over lingua, whose models for every language add about a
//! hundred megabytes to the image for a gain on very short texts that the
//! "unknown" answer already covers here.

use super::normalize::truncate_at_char_boundary;

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

/// What the detector says of a text: the language to report, and how the
/// text path reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Detected {
    /// Surely this language; `None` when unsure (short, mixed or
    /// transliterated text, or a language the detector does not know).
    pub language: Option<Language>,
    pub route: Route,
}

/// How the text path reads a text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The detector's best guess is English: the first stage decides
    /// whether the multilingual encoder reads it again.
    English,
    /// Its best guess is another language, or its script is not Latin:
    /// judged by the multilingual encoder's heads for other languages.
    Other,
    /// Too short to tell: read by both encoders, mixed as English is.
    Unsure,
}

impl Detected {
    /// The language to report: `None` when unsure.
    pub fn language(self) -> Option<Language> {
        self.language
    }

    /// Whether the text reads as English (the detector's best guess).
    pub fn is_english(self) -> bool {
        self.route == Route::English
    }
}

/// Texts with fewer letters than this are reported unsure: on one or two
/// words trigram statistics guess.
const MIN_LETTERS: usize = 8;

/// The detector's confidence from which its answer is taken. Measured on
/// Multilingual HateCheck's validation half (10 languages, 18,389 short
/// sentences) and the English validation half (842 texts): at 0.5 every
/// language's answers were at least 98 % right (German, French, Polish,
/// Portuguese, Chinese 99.9-100 %), no non-English sentence was taken for
/// English, and 94 % of the English texts were answered (whatlang's own
/// "reliable", 0.9, answered 88 % of the English texts and 11 % of the
/// Arabic ones).
const MIN_CONFIDENCE: f64 = 0.5;

/// Languages the detector is not asked about: on romanised Hindi
/// ("mai tum jaise ...") and short English it answers Welsh, Javanese, Shona,
/// Akan, Zulu, Turkmen, Esperanto or Latin with confidence, and those are
/// rare in the traffic a moderation service sees. A text in one of them
/// is then unsure, so it is still read by the multilingual encoder.
const NOT_ASKED: [whatlang::Lang; 8] = [
    whatlang::Lang::Cym,
    whatlang::Lang::Jav,
    whatlang::Lang::Sna,
    whatlang::Lang::Aka,
    whatlang::Lang::Zul,
    whatlang::Lang::Tuk,
    whatlang::Lang::Epo,
    whatlang::Lang::Lat,
];

fn detector() -> &'static whatlang::Detector {
    static DETECTOR: std::sync::OnceLock<whatlang::Detector> = std::sync::OnceLock::new();
    DETECTOR.get_or_init(|| whatlang::Detector::with_denylist(NOT_ASKED.to_vec()))
}

/// The detector reads at most this many bytes of a text (at a character
/// boundary): its cost is linear, and the start of a text says its
/// language as well as the whole.
const MAX_BYTES: usize = 2048;

const UNSURE: Detected = Detected {
    language: None,
    route: Route::Unsure,
};

/// The language of `text`, and its route.
///
/// Trigram statistics misjudge short English: "Can you recommend a good
/// recipe for banana bread?" reads as Welsh to whatlang and "kill yourself
/// you worthless loser" as French. So the route also counts English
/// function words, which other languages' sentences rarely hold: a text
/// whose words are at least a fifth such words (two or more) reads as
/// English whatever the trigrams say. Measured on English HateCheck (3,728
/// short sentences), the English validation half, and Multilingual
/// HateCheck's validation half (10 languages) by `train/language_routes.py`;
/// its table is in docs/models.md.
pub fn detect(text: &str) -> Detected {
    let raw = detect_raw(text);
    if raw.route == Route::English {
        return raw;
    }
    // Spelt-out or disguised English (`k i l l   y o u r s e l f`) reads as
    // English once the normaliser has undone the disguise.
    let sample = truncate_at_char_boundary(text, MAX_BYTES);
    let undone = super::normalize::normalize(sample);
    if undone != sample.to_lowercase() && detect_raw(&undone).route == Route::English {
        return Detected {
            language: Some(Language::ENGLISH),
            route: Route::English,
        };
    }
    raw
}

fn detect_raw(text: &str) -> Detected {
    let sample = truncate_at_char_boundary(text, MAX_BYTES);
    let latin = whatlang::detect_script(sample).is_none_or(|s| s == whatlang::Script::Latin);
    if sample.chars().filter(|c| c.is_alphabetic()).count() < MIN_LETTERS {
        // Too short to name; a few letters of another script are still
        // not English (a four-character Chinese insult).
        return if latin {
            UNSURE
        } else {
            Detected {
                language: None,
                route: Route::Other,
            }
        };
    }
    // Latin text with English function words reads as English whatever the
    // trigrams would say (below), so they are not asked: their scoring was
    // 28 % of a short English request's CPU time with the null classifier.
    if latin && reads_as_english(sample, true) {
        return Detected {
            language: Some(Language::ENGLISH),
            route: Route::English,
        };
    }
    let Some(info) = detector().detect(sample) else {
        return UNSURE;
    };
    let language = iso_639_1(info.lang().code())
        .filter(|_| info.confidence() >= MIN_CONFIDENCE)
        .map(Language);
    let guessed_english = info.lang() == whatlang::Lang::Eng;
    let route = if info.script() != whatlang::Script::Latin {
        Route::Other
    } else if reads_as_english(sample, info.confidence() >= MIN_CONFIDENCE)
        || (guessed_english && info.confidence() >= MIN_ENGLISH_CONFIDENCE)
    {
        Route::English
    } else if guessed_english {
        Route::Unsure
    } else {
        Route::Other
    };
    // A text routed as English by its words is reported as English when
    // the trigrams were unsure of anything.
    let language = match (route, language) {
        (Route::English, None) => Some(Language::ENGLISH),
        (_, language) => language,
    };
    Detected { language, route }
}

/// Below this confidence a trigram guess of English alone is unsure
/// (romanised Hindi was guessed English at 0.1-0.3 now and then).
const MIN_ENGLISH_CONFIDENCE: f64 = 0.3;

/// Words common in English and rare as words of other Latin-script
/// languages (no `a`, `no`, `in`, `so`, `do`, `was`, `will`, `die`, `man`,
/// `me`, which are words of Spanish, Portuguese, Italian, German or Dutch
/// too). `I` counts only as a capital: `i` is an Italian article.
const ENGLISH_WORDS: [&str; 66] = [
    "the", "you", "your", "yourself", "you're", "youre", "and", "is", "are", "were", "i'm", "im",
    "my", "to", "of", "for", "with", "that", "this", "these", "those", "what", "how", "why", "can",
    "should", "would", "could", "not", "don't", "dont", "it", "it's", "be", "have", "has", "they",
    "them", "their", "we", "our", "he", "she", "his", "her", "at", "from", "by", "or", "if",
    "just", "all", "get", "people", "know", "like", "want", "think", "some", "about", "who",
    "there", "been", "any", "because", "make",
];

/// Whether a fifth of the words of `text` are [`ENGLISH_WORDS`], at least
/// one of them, or two when the trigrams are `confident` of another
/// language.
fn reads_as_english(text: &str, confident: bool) -> bool {
    let (mut words, mut english) = (0usize, 0usize);
    for word in text
        .split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .filter(|w| !w.is_empty())
    {
        words += 1;
        let lower = word.to_lowercase();
        english += usize::from(
            ENGLISH_WORDS.contains(&lower.as_str()) || word == "I" || word.starts_with("I'"),
        );
    }
    english >= if confident { 2 } else { 1 } && english * 5 >= words
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
            (
                "No tengo tiempo hoy porque tengo que trabajar mucho en la oficina y después cuidar a mis hijos.",
                "es",
            ),
            ("Je n'ai pas le temps aujourd'hui parce que je travaille.", "fr"),
            (
                "Сегодня у меня совсем нет времени, потому что я должен работать весь день в офисе, а вечером забрать детей из школы.",
                "ru",
            ),
            ("اليوم ليس لدي وقت لأنني يجب أن أعمل كثيرا.", "ar"),
            (
                "आज मेरे पास बिल्कुल समय नहीं है क्योंकि मुझे पूरे दिन दफ़्तर में काम करना है और शाम को बच्चों को स्कूल से लाना है।",
                "hi",
            ),
            ("我今天没有时间，因为我必须工作到很晚。", "zh"),
            ("오늘은 일을 해야 해서 시간이 없습니다.", "ko"),
        ];
        for (text, expected) in cases {
            assert_eq!(code(text), Some(expected), "{text}");
        }
    }

    #[test]
    fn short_or_unreadable_texts_are_unsure() {
        assert_eq!(detect("ok"), UNSURE);
        assert_eq!(
            detect("你这个废物").route,
            Route::Other,
            "short, but not English"
        );
        assert_eq!(detect("lol 😂😂"), UNSURE);
        assert_eq!(detect("12345 !!! ???"), UNSURE);
        assert!(!detect("").is_english());
    }

    #[test]
    fn other_scripts_and_languages_take_the_other_route() {
        // Short sentences the detector cannot name with confidence (Russian
        // taken for Bulgarian at 0.04, Hindi at 0.43) are still not English.
        for text in [
            "Сегодня у меня нет времени, потому что я работаю.",
            "आज मेरे पास समय नहीं है क्योंकि मुझे काम करना है।",
            "No tengo tiempo hoy porque tengo que trabajar mucho.",
            "Ich habe heute keine Zeit, weil ich arbeiten muss.",
            "我今天没有时间，因为我必须工作到很晚。",
            "اليوم ليس لدي وقت لأنني يجب أن أعمل كثيرا.",
        ] {
            assert_eq!(detect(text).route, Route::Other, "{text}");
        }
        assert_eq!(
            detect("The weather is lovely today and we are going to the beach.").route,
            Route::English
        );
        // Short English that trigrams take for Welsh or French reads as
        // English by its words, disguised English once undone.
        for text in [
            "Can you recommend a good recipe for banana bread?",
            "kill yourself you worthless loser",
            "k i l l   y o u r s e l f you worthless loser",
            "k1ll y0urs3lf you w0rthless l0ser",
        ] {
            let detected = detect(text);
            assert_eq!(detected.route, Route::English, "{text}");
            assert_eq!(detected.language, Some(Language::ENGLISH), "{text}");
        }
    }

    #[test]
    fn romanised_hindi_is_not_taken_for_javanese() {
        assert_ne!(
            code("mai tum jaise logon ko bardasht nahi kar sakta."),
            Some("jv")
        );
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
        assert!(truncate_at_char_boundary(&long, MAX_BYTES).len() <= MAX_BYTES);
        let multibyte = "ж".repeat(3000);
        assert!(multibyte.is_char_boundary(truncate_at_char_boundary(&multibyte, 2047).len()));
    }
}
