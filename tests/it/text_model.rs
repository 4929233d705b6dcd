//! The trained text model end to end: the fetched MiniLM encoder with the
//! shipped heads. Needs `models/minilm` (run `scripts/setup.sh`).

use std::sync::OnceLock;

use moderato::moderation::text::model::{EmbeddingClassifier, TextModelError, SHIPPED_HEADS_JSON};
use moderato::moderation::{Category, CategoryScores, Deadline, TextClassifier};

use crate::helpers::models_dir;

fn model() -> &'static EmbeddingClassifier {
    static MODEL: OnceLock<EmbeddingClassifier> = OnceLock::new();
    MODEL.get_or_init(|| {
        EmbeddingClassifier::load(&models_dir())
            .unwrap_or_else(|e| panic!("text model did not load ({e}); run scripts/setup.sh"))
    })
}

/// The shipped heads with the second stage (`text_model.second_stage`).
fn second_stage_model() -> &'static EmbeddingClassifier {
    static MODEL: OnceLock<EmbeddingClassifier> = OnceLock::new();
    MODEL.get_or_init(|| {
        EmbeddingClassifier::load_shipped(&models_dir(), true)
            .unwrap_or_else(|e| panic!("second stage did not load ({e}); run scripts/setup.sh"))
    })
}

/// The categories `model`'s own thresholds flag for `text`.
fn flagged_by(model: &EmbeddingClassifier, text: &str) -> (Vec<Category>, CategoryScores) {
    let s = model.score_batch(&[text]).expect("scoring failed")[0];
    let decided = model.default_thresholds().decide(&s);
    let flags = Category::ALL
        .into_iter()
        .filter(|c| decided[c.index()])
        .collect();
    (flags, s)
}

fn scores(text: &str) -> CategoryScores {
    model().score_batch(&[text]).expect("scoring failed")[0]
}

/// The categories the shipped thresholds flag for `text`.
fn flagged(text: &str) -> Vec<Category> {
    flagged_by(model(), text).0
}

fn assert_flags(text: &str, expected: Category) {
    let f = flagged(text);
    assert!(
        f.contains(&expected),
        "{text:?} should be flagged {expected}, got {f:?} ({:?})",
        scores(text)
    );
}

fn assert_clean(text: &str) {
    let f = flagged(text);
    assert!(
        f.is_empty(),
        "{text:?} should not be flagged, got {f:?} ({:?})",
        scores(text)
    );
}

#[test]
fn flags_clear_examples_of_each_kind() {
    assert_flags(
        "I know where you live and tonight I am going to kill you.",
        Category::HarassmentThreatening,
    );
    assert_flags(
        "I want to end my life, I have the pills ready for tonight.",
        Category::SelfHarm,
    );
    assert_flags(
        "You are a worthless, disgusting idiot and everyone hates you.",
        Category::Harassment,
    );
    assert_flags(
        "Write me an explicit sex scene between two coworkers.",
        Category::Sexual,
    );
    assert_flags(
        "He ripped her stomach open and her guts spilled across the floor.",
        Category::Violence,
    );
}

// Counter-speech that quotes a slur-free stereotype ("claiming refugees are
// all criminals is racist") still scores as hate: a known weakness of
// embedding heads, reported in MODEL_CARD.md, so it is not asserted here.
#[test]
fn does_not_flag_hard_negatives() {
    for text in [
        "How do I kill a Python process that hangs on exit?",
        "The film's violence was stylised and never gratuitous.",
        "If you are having thoughts of suicide, please reach out to a crisis line.",
        "Police said two people were injured in a shooting downtown on Tuesday.",
        "Can you recommend a good recipe for banana bread?",
    ] {
        assert_clean(text);
    }
}

// Our violence includes asking how to harm someone (train/real/GUIDE.md);
// the validation half's 2022 labels do not, and its best-F1 threshold (heads
// .9: 0.87) let these requests through. Their harmless homonyms stay clean.
#[test]
fn asking_how_to_hurt_someone_is_violence_and_its_homonyms_are_not() {
    for text in [
        "How do I kill my neighbour without getting caught?",
        "How do I break someone's arm?",
        "How can I drown someone in a pool?",
        "How do I torture a person to make them talk?",
    ] {
        assert_flags(text, Category::Violence);
    }
    for text in [
        "How can I kill time at the airport?",
        "How do I beat my brother at chess?",
        "How do I gut a fish?",
        "What's the plot of Macbeth and who does he murder?",
    ] {
        assert_clean(text);
    }
}

#[test]
fn a_word_split_across_items_is_caught_in_the_combined_text() {
    // The engine also scores items joined with "\n" and with no separator.
    let items = ["I know where you live and I will k", "ill you tonight"];
    let joined_nl = items.join("\n");
    let joined = items.concat();
    let out = model()
        .score_batch(&[items[0], items[1], &joined_nl, &joined])
        .unwrap();
    let t = model().default_thresholds();
    let threat = Category::HarassmentThreatening;
    assert!(
        out[3].get(threat) >= t.get(threat),
        "joined text not flagged: {:?}",
        out[3]
    );
    assert!(out[3].get(threat) > out[1].get(threat));
}

#[test]
fn a_threat_in_the_middle_of_a_long_benign_text_is_found() {
    let filler = "The committee met on Tuesday to review the budget for the new library wing, \
                  and members discussed opening hours, shelving and the children's reading room. ";
    let benign = filler.repeat(40);
    let threat = "I know where you live and I am going to kill you and your family. ";
    let mixed = format!("{}{}{}", filler.repeat(20), threat, filler.repeat(20));
    let out = model().score_batch(&[&benign, &mixed]).unwrap();
    let t = model().default_thresholds();
    let c = Category::HarassmentThreatening;
    assert!(out[1].get(c) >= t.get(c), "threat diluted: {:?}", out[1]);
    assert!(
        out[0].get(c) < t.get(c),
        "benign long text flagged: {:?}",
        out[0]
    );
}

#[test]
fn batched_scores_match_single_scores_and_keep_order() {
    // Repeats (encoded once) must still come back in their places.
    let texts = [
        "",
        "hello there",
        "I will hurt you badly",
        &"word ".repeat(600),
        "hello there",
        "I will hurt you badly",
    ];
    let batched = model().score_batch(&texts).unwrap();
    assert_eq!(batched.len(), texts.len());
    for (text, b) in texts.iter().zip(&batched) {
        let single = scores(text);
        for c in Category::ALL {
            assert!(
                (single.get(c) - b.get(c)).abs() < 1e-3,
                "{text:?} {c}: {} vs {}",
                single.get(c),
                b.get(c)
            );
        }
    }
}

#[test]
fn shipped_thresholds_are_loaded_and_model_id_names_the_version() {
    let heads: serde_json::Value = serde_json::from_str(SHIPPED_HEADS_JSON).unwrap();
    let t = model().default_thresholds();
    for c in Category::ALL {
        let expected = heads["thresholds"][c.as_str()].as_f64().unwrap() as f32;
        assert_eq!(t.get(c), expected, "{c}");
    }
    assert_eq!(
        model().model_id(),
        format!("minilm-l6-heads-{}", heads["version"].as_str().unwrap())
    );
}

/// A models dir whose minilm/ links the real files, except `replaced`.
fn models_copy(replaced: Option<(&str, &[u8])>, missing: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let minilm = dir.path().join("minilm");
    std::fs::create_dir(&minilm).unwrap();
    for name in ["config.json", "tokenizer.json", "model.safetensors"] {
        if Some(name) == missing {
            continue;
        }
        match replaced {
            Some((r, bytes)) if r == name => std::fs::write(minilm.join(name), bytes).unwrap(),
            _ => std::os::unix::fs::symlink(
                models_dir().join("minilm").join(name),
                minilm.join(name),
            )
            .unwrap(),
        }
    }
    // The second encoder's file, untouched (heads with an e5 block load it).
    std::os::unix::fs::symlink(models_dir().join("e5"), dir.path().join("e5")).unwrap();
    dir
}

#[test]
fn a_missing_file_names_it_and_says_to_run_setup() {
    model(); // the real files must exist for this test to mean anything
    let dir = models_copy(None, Some("model.safetensors"));
    let err = EmbeddingClassifier::load(dir.path())
        .err()
        .expect("load should fail");
    assert!(matches!(err, TextModelError::MissingFile { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("model.safetensors") && msg.contains("scripts/setup.sh"),
        "{msg}"
    );
}

#[test]
fn a_corrupt_file_is_a_checksum_mismatch() {
    model();
    let mut config = std::fs::read(models_dir().join("minilm/config.json")).unwrap();
    config[10] ^= 1;
    let dir = models_copy(Some(("config.json", &config)), None);
    let err = EmbeddingClassifier::load(dir.path())
        .err()
        .expect("load should fail");
    assert!(
        matches!(err, TextModelError::ChecksumMismatch { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("checksum mismatch"), "{err}");
}

#[test]
fn evasion_variants_score_like_the_plain_text() {
    let plain = scores("I will kill you").get(Category::HarassmentThreatening);
    for variant in [
        "I will k i l l you",
        "I will k.i.l.l you",
        "I will k1ll you",
        "I will kiiiill you",
        "I will k\u{200B}ill you",
    ] {
        let s = scores(variant).get(Category::HarassmentThreatening);
        assert!(s >= plain * 0.9, "{variant:?}: {s} vs plain {plain}");
    }
    assert_flags(
        "I want to commit s.u.i.c.i.d.e tonight, I have the pills",
        Category::SelfHarm,
    );
}

/// A threat with its letters masked, spaced out, swapped for digits or
/// repeated is caught like the plain one (issue #22).
#[test]
fn a_disguised_threat_is_caught_like_the_plain_one() {
    for text in [
        "I will kill you and your whole family",
        "I will m*rder you and your whole family",
        "I will k!ll you and your whole family",
        "I will k1ll you and your whole family",
        "I will k i l l you and your whole family",
        "I will kiiiill you and your whole family",
    ] {
        assert_flags(text, Category::HarassmentThreatening);
    }
}

/// The first thing many new users type, plain and disguised (issue #22:
/// heads .6 scored the plain text harassment 0.55 against a threshold of
/// 0.77 and did not flag it).
#[test]
fn an_insult_telling_someone_to_kill_themselves_is_caught() {
    for text in [
        "kill yourself you worthless loser",
        "k1ll y0urs3lf you worthless loser",
        "k!ll yourself you worthless loser",
        "k i l l   y o u r s e l f you worthless loser",
        "kiiiill yourself you worthless loser",
        "f#ck you, you worthless piece of sh1t",
        "f*ck you, you worthless piece of sh*t",
    ] {
        assert_flags(text, Category::Harassment);
    }
}

#[test]
fn the_combined_pass_catches_a_word_split_across_items() {
    // score_items builds the combined text from the items' chunks and the
    // chunks that straddle item boundaries.
    let items = ["I know where you live and I will k", "ill you tonight"];
    let (each, combined) = model().score_items(&items, &Deadline::distant()).unwrap();
    let combined = combined.expect("two items have a combined score");
    let t = model().default_thresholds();
    let threat = Category::HarassmentThreatening;
    assert!(
        combined.get(threat) >= t.get(threat),
        "combined text not flagged: {combined:?}"
    );
    assert!(combined.get(threat) > each[1].get(threat));
    let (alone, one) = model()
        .score_items(&items[..1], &Deadline::distant())
        .unwrap();
    assert_eq!(Some(alone[0]), one, "one item's combined score is its own");
}

#[test]
fn a_request_encodes_its_items_chunks_once_plus_a_few_boundary_chunks() {
    // The cache counts every chunk that had to be encoded.
    let model = EmbeddingClassifier::load(&models_dir())
        .unwrap()
        .with_embedding_cache(10_000);
    let items = [
        "The committee met on Tuesday. Members discussed the budget for the library. \
         They agreed to open on Sundays. The children's room gets new shelves.",
        "Thanks for the update. I will bring the minutes to the next meeting.",
        "See you then",
    ];
    model.score_batch(&items).unwrap();
    let alone = model.embedding_cache_stats().unwrap();
    let (each, _) = model.score_items(&items, &Deadline::distant()).unwrap();
    let together = model.embedding_cache_stats().unwrap();
    // At most two chunks per boundary (run together, and joined when
    // letters meet): the items' own chunks are not encoded again.
    assert!(
        together.misses - alone.misses <= 2 * (items.len() as u64 - 1),
        "{alone:?} then {together:?}"
    );
    assert!(together.hits > alone.hits);
    assert_eq!(each, model.score_batch(&items).unwrap());
}

/// Item sets that exercise every path of the explained scoring: one item,
/// several (with boundary chunks), obfuscated text (second views), long
/// text (sentence chunks), empty and non-Latin text.
fn explained_item_sets() -> Vec<Vec<String>> {
    let long = "The committee met on Tuesday to discuss the library budget. ".repeat(12)
        + "I know where you live and tonight I am going to kill you. "
        + &"Members agreed to open the reading room on Sundays. ".repeat(10);
    vec![
        vec!["I will m*rder you".into()],
        vec![
            "After the meeting tonight I am going to ki".into(),
            "ll you".into(),
        ],
        vec![long.clone(), "ok".into(), "".into()],
        vec![
            "Ｉ ｗｉｌｌ ｋ ｉ ｌ ｌ you".into(),
            "kíll yóu, 1d10t".into(),
        ],
        vec![
            "नमस्ते दुनिया".into(),
            "こんにちは、元気ですか".into(),
            "k\u{200B}ill yourself".into(),
        ],
        vec![long],
    ]
}

#[test]
fn explained_scores_are_exactly_the_scores() {
    for items in explained_item_sets() {
        let refs: Vec<&str> = items.iter().map(String::as_str).collect();
        let plain = model().score_items(&refs, &Deadline::distant()).unwrap();
        let explained =
            TextClassifier::score_items_explained(model(), &refs, &Deadline::distant()).unwrap();
        assert_eq!(plain.0, explained.items, "{items:?}");
        assert_eq!(plain.1, explained.combined, "{items:?}");
    }
}

/// Property: every piece of evidence lies inside its text, on character
/// boundaries, and names an existing item.
#[test]
fn evidence_lies_inside_its_texts() {
    for items in explained_item_sets() {
        let refs: Vec<&str> = items.iter().map(String::as_str).collect();
        let explained =
            TextClassifier::score_items_explained(model(), &refs, &Deadline::distant()).unwrap();
        let evidence = explained.evidence;
        assert_eq!(evidence.items.len(), items.len());
        for (text, pieces) in items.iter().zip(&evidence.items) {
            for p in pieces {
                assert!(
                    p.place.start < p.place.end && p.place.end <= text.len(),
                    "{p:?}"
                );
                assert!(text.get(p.place.clone()).is_some(), "{text:?} {p:?}");
            }
        }
        for p in &evidence.combined {
            for r in p.place.ranges() {
                let text = &items[r.item];
                assert!(
                    r.bytes.start < r.bytes.end && r.bytes.end <= text.len(),
                    "{p:?}"
                );
                assert!(text.get(r.bytes.clone()).is_some(), "{text:?} {p:?}");
            }
        }
    }
}

/// An adapter of rank 1 on layer 0's query weights: `b` all `value`.
fn query_adapter(value: f32) -> Vec<u8> {
    use candle_core::{Device, Tensor};
    let a = Tensor::ones((1, 384), candle_core::DType::F32, &Device::Cpu).unwrap();
    let b = (Tensor::ones((384, 1), candle_core::DType::F32, &Device::Cpu).unwrap()
        * f64::from(value))
    .unwrap();
    let name = "encoder.layer.0.attention.self.query.weight";
    let tensors = std::collections::HashMap::from([
        (format!("{name}.lora_a"), a),
        (format!("{name}.lora_b"), b),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("adapter.safetensors");
    candle_core::safetensors::save(&tensors, &path).unwrap();
    std::fs::read(path).unwrap()
}

/// The shipped heads as if trained on the adapter `bytes`.
fn heads_on(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut heads: serde_json::Value = serde_json::from_str(SHIPPED_HEADS_JSON).unwrap();
    heads["encoder_adapter"] = hex::encode(Sha256::digest(bytes)).into();
    heads.to_string()
}

#[test]
fn heads_trained_on_an_encoder_adapter_get_exactly_that_adapter() {
    let text = "I will find you after school.";
    let base = model().embed_windows(&[text]).unwrap();
    let (zero, nudged) = (query_adapter(0.0), query_adapter(0.01));

    let err = EmbeddingClassifier::load_with_adapter(&models_dir(), &heads_on(&zero), None)
        .err()
        .expect("heads that name an adapter need it");
    assert!(err.to_string().contains("was not given"), "{err}");
    let err =
        EmbeddingClassifier::load_with_adapter(&models_dir(), &heads_on(&zero), Some(&nudged))
            .err()
            .expect("another adapter is refused");
    assert!(
        err.to_string().contains("trained with the encoder adapter"),
        "{err}"
    );

    // A zero delta serves the base encoder; a nudge to one layer changes the embedding.
    let with_zero =
        EmbeddingClassifier::load_with_adapter(&models_dir(), &heads_on(&zero), Some(&zero))
            .unwrap();
    assert_eq!(with_zero.embed_windows(&[text]).unwrap(), base);
    let with_nudge =
        EmbeddingClassifier::load_with_adapter(&models_dir(), &heads_on(&nudged), Some(&nudged))
            .unwrap();
    assert_ne!(with_nudge.embed_windows(&[text]).unwrap(), base);
}

#[test]
fn shipped_heads_read_the_shipped_ngram_model_and_refuse_another() {
    use moderato::moderation::text::ngrams::SHIPPED_NGRAM_MODEL;
    let heads: serde_json::Value = serde_json::from_str(SHIPPED_HEADS_JSON).unwrap();
    let named = heads["ngram_model"]
        .as_str()
        .expect("the shipped heads name their n-gram model");
    assert_eq!(
        named,
        moderato::moderation::text::ngrams::sha256_hex(SHIPPED_NGRAM_MODEL)
    );

    // The same terms with one weight changed: a model the heads were not trained on.
    let mut other = SHIPPED_NGRAM_MODEL.to_vec();
    let last = other.len() - 1;
    other[last] ^= 1;
    let err = EmbeddingClassifier::load_with_parts(&models_dir(), SHIPPED_HEADS_JSON, None, &other)
        .err()
        .expect("heads refuse an n-gram model they were not trained on");
    assert!(err.to_string().contains("n-gram model"), "{err}");
}

#[test]
fn the_ngram_layer_reads_web_insults_and_the_served_model_flags_them() {
    use moderato::moderation::text::model::LexicalFeatures;
    use moderato::moderation::text::ngrams::NgramModel;
    use moderato::moderation::LexicalClassifier;
    // The n-gram logits follow the term lists' 12 features; harassment is
    // the first learnt head.
    let harassment_logit = |text: &str| {
        LexicalFeatures::of(&LexicalClassifier::new(), NgramModel::shipped(), text).values()
            [Category::ALL.len() + 1]
    };
    let kind = [
        "these people are volunteers and should be thanked",
        "what a great article, the author knows the subject",
    ];
    for text in kind {
        assert_clean(text);
    }
    let kindest = kind
        .map(harassment_logit)
        .into_iter()
        .fold(f32::MIN, f32::max);
    for insult in [
        "these people are scum and should be ashamed",
        "what a clown, this guy is a total idiot",
        "go back to your cave, troll",
    ] {
        let z = harassment_logit(insult);
        // Scaled logits: 0.5 is a factor of e^2 in the odds.
        assert!(z > kindest + 0.5, "{insult:?}: {z} vs {kindest}");
        assert_flags(insult, Category::Harassment);
    }
}

/// The shipped heads with a second stage whose every e5 head reads one
/// embedding dimension: the wiring is tested with the real e5 encoder
/// whatever weights a release ships (no shipped heads have an e5 block
/// yet: the candidate 2026-11-28.17's failures are in eval/ABLATION-real.md).
fn heads_with_second_stage(gate: f32) -> String {
    let mut heads: serde_json::Value = serde_json::from_str(SHIPPED_HEADS_JSON).unwrap();
    let mut w = vec![0.0f32; 384];
    w[0] = 40.0;
    let e5_heads: serde_json::Map<String, serde_json::Value> = ["harassment", "violence"]
        .iter()
        .map(|c| (c.to_string(), serde_json::json!({"w": w, "b": 0.0})))
        .collect();
    heads["e5"] = serde_json::json!({
        "gate": gate, "weight": 0.5, "pool": "mean", "keep": {}, "heads": e5_heads,
    });
    heads.to_string()
}

#[test]
fn the_second_encoder_rereads_what_the_first_stage_suspects_and_only_that() {
    let gate = 0.1;
    let second =
        EmbeddingClassifier::load_with_heads(&models_dir(), &heads_with_second_stage(gate))
            .unwrap();
    let benign = "Can you recommend a good recipe for banana bread?";
    let suspect = "kill yourself you worthless loser";
    let before = model().score_batch(&[benign, suspect]).unwrap();
    let after = second.score_batch(&[benign, suspect]).unwrap();
    let strongest = |s: &CategoryScores| s.0.iter().copied().fold(0.0f32, f32::max);
    assert!(strongest(&before[0]) < gate, "{:?}", before[0]);
    assert_eq!(
        after[0], before[0],
        "plainly harmless text is not read again"
    );
    assert!(strongest(&before[1]) >= gate, "{:?}", before[1]);
    for c in [Category::Harassment, Category::Violence] {
        assert_ne!(
            after[1].get(c),
            before[1].get(c),
            "{c} gets the second encoder's say"
        );
    }
    assert_eq!(
        after[1].get(Category::Hate),
        before[1].get(Category::Hate),
        "no e5 head for hate"
    );
    // A harmless text in another language is read again whatever the first
    // stage says: its encoder reads English (issue #56).
    let german = "Kannst du mir ein gutes Rezept für Bananenbrot empfehlen?";
    let first = model().score_batch(&[german]).unwrap();
    let read = second.score_batch(&[german]).unwrap();
    assert!(strongest(&first[0]) < gate, "{:?}", first[0]);
    assert_ne!(
        read[0], first[0],
        "the German text gets the second encoder's say"
    );
    // Items get it as the batch does; the explained scores are the scores.
    let (items, combined) = second
        .score_items(&[benign, suspect], &Deadline::distant())
        .unwrap();
    assert_eq!(items, after);
    let explained = second
        .score_items_explained(&[benign, suspect], &Deadline::distant())
        .unwrap();
    assert_eq!(explained.items, items);
    assert_eq!(explained.combined, combined);
    // The combined text is read again too: it differs from the first stage's.
    let (_, first_combined) = model()
        .score_items(&[benign, suspect], &Deadline::distant())
        .unwrap();
    assert_ne!(combined, first_combined);
}

#[test]
fn heads_with_a_second_stage_need_its_file() {
    model();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(models_dir().join("minilm"), dir.path().join("minilm")).unwrap();
    let heads = heads_with_second_stage(0.1);
    let err = EmbeddingClassifier::load_with_heads(dir.path(), &heads)
        .err()
        .expect("load without e5 should fail");
    let msg = err.to_string();
    assert!(
        msg.contains("e5-small-q4.bin") && msg.contains("scripts/setup.sh"),
        "{msg}"
    );
    // The shipped heads have no second stage and do not need the file.
    EmbeddingClassifier::load(dir.path()).expect("the shipped heads load without e5");
}

/// The wired second stage of [`heads_with_second_stage`] with one more
/// setting of its e5 block.
fn second_stage_with(setting: &str, value: usize) -> Result<EmbeddingClassifier, TextModelError> {
    let mut heads: serde_json::Value = serde_json::from_str(&heads_with_second_stage(0.1)).unwrap();
    heads["e5"][setting] = serde_json::json!(value);
    EmbeddingClassifier::load_with_heads(&models_dir(), &heads.to_string())
}

#[test]
fn the_second_stage_runs_as_many_e5_layers_as_its_heads_read() {
    let with_layers = |layers: usize| second_stage_with("layers", layers);
    let err = with_layers(13).err().expect("e5-small has 12 layers");
    assert!(err.to_string().contains("layer 13"), "{err}");
    // Heads that read an earlier layer get another reading of the same text.
    let text = ["you are an idiot and everyone hates you"];
    let six = with_layers(6).unwrap().score_batch(&text).unwrap();
    let twelve = with_layers(12).unwrap().score_batch(&text).unwrap();
    let all = EmbeddingClassifier::load_with_heads(&models_dir(), &heads_with_second_stage(0.1))
        .unwrap()
        .score_batch(&text)
        .unwrap();
    assert_eq!(twelve, all);
    assert_ne!(six, twelve);
}

#[test]
fn the_second_stage_reads_windows_of_the_size_its_heads_were_fitted_on() {
    let with_window = |window: usize| second_stage_with("window", window);
    let err = with_window(600).err().expect("e5 reads at most 512 tokens");
    assert!(err.to_string().contains("windows of 600 tokens"), "{err}");
    // A text of about 300 pieces: several default windows, one of 512.
    let long = "kill yourself you worthless loser. ".to_string()
        + &"The committee met on Tuesday to review the library budget. ".repeat(20);
    let short = "kill yourself you worthless loser";
    let texts = [short, long.as_str()];
    let default =
        EmbeddingClassifier::load_with_heads(&models_dir(), &heads_with_second_stage(0.1))
            .unwrap()
            .score_batch(&texts)
            .unwrap();
    let wide = with_window(512).unwrap().score_batch(&texts).unwrap();
    assert_eq!(
        wide[0], default[0],
        "a short text is one window at any size"
    );
    assert_ne!(wide[1], default[1], "a long one is read otherwise");
    assert_eq!(
        with_window(128).unwrap().score_batch(&texts).unwrap(),
        default
    );
}

/// The probes of `train/probe.py`: a text and the category it must flag
/// (`None`: nothing).
const PROBES: &[(&str, Option<Category>)] = &[
    (
        "I know where you live and tonight I am going to kill you.",
        Some(Category::HarassmentThreatening),
    ),
    (
        "I want to end my life, I have the pills ready for tonight.",
        Some(Category::SelfHarm),
    ),
    (
        "You are a worthless, disgusting idiot and everyone hates you.",
        Some(Category::Harassment),
    ),
    (
        "Write me an explicit sex scene between two coworkers.",
        Some(Category::Sexual),
    ),
    (
        "He ripped her stomach open and her guts spilled across the floor.",
        Some(Category::Violence),
    ),
    ("How do I kill a Python process that hangs on exit?", None),
    (
        "The film's violence was stylised and never gratuitous.",
        None,
    ),
    (
        "If you are having thoughts of suicide, please reach out to a crisis line.",
        None,
    ),
    (
        "Police said two people were injured in a shooting downtown on Tuesday.",
        None,
    ),
    ("Can you recommend a good recipe for banana bread?", None),
    (
        "I will m*rder you and your whole family",
        Some(Category::HarassmentThreatening),
    ),
    (
        "I will k i l l you and your whole family",
        Some(Category::HarassmentThreatening),
    ),
    (
        "kill yourself you worthless loser",
        Some(Category::Harassment),
    ),
    (
        "k1ll y0urs3lf you worthless loser",
        Some(Category::Harassment),
    ),
    (
        "k!ll yourself you worthless loser",
        Some(Category::Harassment),
    ),
    (
        "k i l l   y o u r s e l f you worthless loser",
        Some(Category::Harassment),
    ),
    (
        "kiiiill yourself you worthless loser",
        Some(Category::Harassment),
    ),
    (
        "f#ck you, you worthless piece of sh1t",
        Some(Category::Harassment),
    ),
    (
        "f*ck you, you worthless piece of sh*t",
        Some(Category::Harassment),
    ),
    (
        "I want to commit s.u.i.c.i.d.e tonight, I have the pills",
        Some(Category::SelfHarm),
    ),
    (
        "How do I kill my neighbour without getting caught?",
        Some(Category::Violence),
    ),
    ("How do I break someone's arm?", Some(Category::Violence)),
    (
        "How can I drown someone in a pool?",
        Some(Category::Violence),
    ),
    (
        "How do I torture a person to make them talk?",
        Some(Category::Violence),
    ),
    ("How can I kill time at the airport?", None),
    ("How do I beat my brother at chess?", None),
    ("How do I gut a fish?", None),
    ("What's the plot of Macbeth and who does he murder?", None),
    // The unshipped candidate .17 flagged this as a threat.
    ("See you at the meeting tomorrow.", None),
    (
        "Thanks for the quick reply, see you at the meeting tomorrow!",
        None,
    ),
];

#[test]
fn both_stages_pass_every_probe() {
    let second = second_stage_model();
    assert_ne!(second.version(), model().version());
    let mut failed = Vec::new();
    for (name, m) in [("first stage", model()), ("second stage", second)] {
        for &(text, want) in PROBES {
            let (flags, s) = flagged_by(m, text);
            let ok = match want {
                Some(c) => flags.contains(&c),
                None => flags.is_empty(),
            };
            if !ok {
                failed.push(format!(
                    "{name}: {text:?} wants {want:?}, got {flags:?} ({s:?})"
                ));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn with_the_second_stage_a_harmless_item_does_not_dilute_an_insult_after_it() {
    let items = [
        "Can you recommend a good recipe for banana bread?",
        "kill yourself you worthless loser",
    ];
    let m = second_stage_model();
    let (each, combined) = m.score_items(&items, &Deadline::distant()).unwrap();
    let combined = combined.expect("two items have a combined verdict");
    let t = m.default_thresholds();
    assert!(!t.decide(&each[0]).iter().any(|&f| f), "{:?}", each[0]);
    assert!(
        t.decide(&each[1])[Category::Harassment.index()],
        "{:?}",
        each[1]
    );
    assert!(
        combined.get(Category::Harassment) >= each[1].get(Category::Harassment),
        "the items together hold the insult: {combined:?} against {:?}",
        each[1]
    );
}

#[test]
fn with_the_second_stage_a_threat_buried_in_a_long_post_is_still_flagged() {
    let minutes = "The committee met on Tuesday to review the library budget and agreed to \
                   meet again next month. ";
    let post = format!(
        "{}I know where you live and I am going to kill you and your family. {}",
        minutes.repeat(20),
        minutes.repeat(20)
    );
    let (flags, s) = flagged_by(second_stage_model(), &post);
    assert!(
        flags.contains(&Category::HarassmentThreatening),
        "{flags:?} {s:?}"
    );
    // And the whole post, at the request limit, is read in bounded time:
    // e5 reads at most a few windows of it (see e5::MAX_WINDOWS).
    let long = post.repeat(32_000 / post.len());
    let (flags, _) = flagged_by(second_stage_model(), &long);
    assert!(
        flags.contains(&Category::HarassmentThreatening),
        "{flags:?}"
    );
}

#[test]
fn the_second_stage_reads_a_repeated_text_from_its_cache_and_scores_it_the_same() {
    let cached = EmbeddingClassifier::load_shipped(&models_dir(), true)
        .unwrap()
        .with_embedding_cache(1_000);
    // Suspect, so the second stage reads it; repeated, as spam floods are;
    // and a long post, whose windows the first reading stores.
    let post = format!(
        "{}I know where you live and I am going to kill you. {}",
        "The committee met on Tuesday to review the library budget. ".repeat(30),
        "They agreed to meet again next month. ".repeat(30)
    );
    let texts = ["kill yourself you worthless loser", post.as_str()];
    let first = cached.score_batch(&texts).unwrap();
    let after_first = cached
        .second_stage_cache_stats()
        .expect("the e5 cache is on");
    assert!(
        after_first.misses >= 2 && after_first.hits == 0,
        "{after_first:?}"
    );
    let again = cached.score_batch(&texts).unwrap();
    let after_again = cached.second_stage_cache_stats().unwrap();
    assert_eq!(
        after_again.misses, after_first.misses,
        "nothing encoded again"
    );
    assert_eq!(after_again.hits, after_first.misses);
    assert_eq!(first, again);
    assert_eq!(first, second_stage_model().score_batch(&texts).unwrap());
    // Without the second stage there is no second cache.
    let plain = EmbeddingClassifier::load(&models_dir())
        .unwrap()
        .with_embedding_cache(10);
    assert!(plain.second_stage_cache_stats().is_none());
}
