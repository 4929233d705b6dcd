use std::sync::OnceLock;

use super::*;

#[path = "../../../../tests/support/render_text.rs"]
mod render;

fn models_dir() -> PathBuf {
    std::env::var_os("MODERATO_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models"))
}

/// Loaded once for all the tests here (optimising the graphs takes a while).
fn ocr() -> &'static Ocr {
    static OCR: OnceLock<Ocr> = OnceLock::new();
    OCR.get_or_init(|| Ocr::load(&models_dir(), 2).expect("run scripts/setup.sh"))
}

const LIMITS: ReadLimits = ReadLimits {
    max_side: 1280,
    max_regions: 50,
    max_chars: 2_000,
};

fn read(image: &RgbImage) -> String {
    ocr()
        .read(image, &LIMITS, &Deadline::distant())
        .expect("reads")
        .map(|t| t.text())
        .unwrap_or_default()
}

#[test]
fn lines_are_cut_at_the_character_limit() {
    let lines = vec!["abc".to_string(), String::new(), "defg".into(), "h".into()];
    assert_eq!(truncate_chars(lines.clone(), 5), vec!["abc", "de"]);
    assert_eq!(truncate_chars(lines.clone(), 3), vec!["abc"]);
    assert_eq!(truncate_chars(lines, 100), vec!["abc", "defg", "h"]);
}

#[test]
fn read_text_is_never_empty() {
    assert_eq!(ReadText::new(vec![String::new()]), None);
    let text = ReadText::new(vec!["ab".into(), "".into(), "c".into()]).unwrap();
    assert_eq!(text.text(), "ab\nc");
    assert_eq!(text.chars(), 4);
}

#[test]
fn a_missing_model_says_how_to_fetch_it() {
    let error = Ocr::load(Path::new("/nonexistent"), 2)
        .err()
        .expect("missing");
    assert!(matches!(error, OcrError::Missing { .. }), "{error}");
    assert!(error.to_string().contains("scripts/setup.sh"));
}

/// A models directory with the real OCR models and `library` (if any) as
/// the ONNX Runtime library.
fn models_without_runtime(library: Option<&[u8]>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ppocr")).unwrap();
    for file in [DETECTOR_FILE, RECOGNISER_FILE] {
        std::os::unix::fs::symlink(models_dir().join(file), dir.path().join(file)).unwrap();
    }
    if let Some(bytes) = library {
        std::fs::create_dir(dir.path().join("onnxruntime")).unwrap();
        std::fs::write(dir.path().join(RUNTIME_FILE), bytes).unwrap();
    }
    dir
}

#[test]
fn a_missing_runtime_library_says_how_to_fetch_it() {
    let dir = models_without_runtime(None);
    let error = Ocr::load(dir.path(), 2).err().expect("missing");
    assert!(matches!(error, OcrError::RuntimeMissing { .. }), "{error}");
    assert!(error.to_string().contains("scripts/setup.sh"), "{error}");
    assert!(error.to_string().contains(RUNTIME_FILE), "{error}");
}

#[test]
fn a_wrong_runtime_library_is_refused_before_loading() {
    let dir = models_without_runtime(Some(b"not a library"));
    let error = Ocr::load(dir.path(), 2).err().expect("refused");
    assert!(matches!(error, OcrError::RuntimeLoad { .. }), "{error}");
    assert!(error.to_string().contains("scripts/setup.sh"), "{error}");
}

#[test]
fn reads_a_rendered_sentence() {
    let text = read(&render::line(
        "I will murder you and your whole family",
        24.0,
    ));
    assert_eq!(text, "I will murder you and your whole family");
}

#[test]
fn an_image_without_text_reads_nothing() {
    let blank = RgbImage::from_pixel(640, 480, image::Rgb([120, 160, 200]));
    assert_eq!(read(&blank), "");
}

#[test]
fn reads_lines_in_order_and_stops_at_the_limits() {
    let image = render::screenshot(&["first line here", "second line there", "third one"]);
    assert_eq!(
        read(&image),
        "first line here\nsecond line there\nthird one"
    );
    let limits = ReadLimits {
        max_chars: 8,
        ..LIMITS
    };
    let text = ocr()
        .read(&image, &limits, &Deadline::distant())
        .unwrap()
        .unwrap();
    assert!(text.chars() <= 8, "{text:?}");
}

/// Levenshtein distance in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitution.min(row[j] + 1).min(row[j + 1] + 1);
        }
    }
    row[b.len()]
}

#[test]
fn edit_distance_counts_insertions_deletions_and_substitutions() {
    assert_eq!(edit_distance("kitten", "sitting"), 3);
    assert_eq!(edit_distance("", "abc"), 3);
    assert_eq!(edit_distance("same", "same"), 0);
}

/// 120 lines of 4 to 9 words (mixed case, digits, punctuation), chosen by
/// a fixed sequence, rendered at 16 to 32 px: the characters misread
/// (Levenshtein) over the characters written. The goal is 3 %; measured
/// 0.09 % (4 spaces between words not read). It was 3.21 %, nearly all of
/// it spaces not read, while lines were cut out as tight as the detector's
/// boxes: the recogniser reads spaces when its crop has the margin above
/// and below the text it was trained with (see `rec::LINE_MARGIN`). Prints
/// the figure.
#[test]
fn reading_accuracy_on_rendered_lines() {
    const WORDS: [&str; 48] = [
        "the", "meeting", "starts", "at", "9:30", "tomorrow", "Please", "bring", "your", "laptop",
        "and", "charger", "Invoice", "#4721", "is", "due", "on", "Friday,", "March", "14.", "We",
        "shipped", "3", "boxes", "to", "Berlin", "London", "Paris", "call", "me", "back", "when",
        "you", "can!", "Total:", "$129.99", "order", "number", "password", "reset", "link",
        "expires", "in", "24", "hours.", "Thanks", "family", "weekend",
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    let (mut errors, mut total) = (0, 0);
    let mut worst = Vec::new();
    for i in 0..120 {
        let count = 4 + next(6);
        let line: Vec<&str> = (0..count).map(|_| WORDS[next(WORDS.len())]).collect();
        let line = line.join(" ");
        let px = 16.0 + (i % 9) as f32 * 2.0;
        let read = read(&render::line(&line, px));
        let distance = edit_distance(&read, &line);
        if distance > 0 {
            worst.push(format!("{px} px: {line:?} read as {read:?}"));
        }
        errors += distance;
        total += line.chars().count();
    }
    let cer = errors as f64 / total as f64;
    eprintln!(
        "character error rate {:.2} % over {total} characters",
        cer * 100.0
    );
    assert!(cer <= 0.03, "CER {:.2} %: {worst:#?}", cer * 100.0);
}
