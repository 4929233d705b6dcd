//! `"explain": true` over real HTTP: each flagged category says which piece
//! of the text gave its score (a chunk the model read, a term the lexicon
//! matched), in Unicode scalar values of the text as sent.

use serde_json::{json, Value};

use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;
use moderato::config::TextClassifierKind;
use moderato::moderation::Speed;

/// Harmless sentences of ordinary length (each well over the chunker's
/// eight-token minimum, so that each is a chunk of its own).
const HARMLESS: [&str; 8] = [
    "The community garden opened its new greenhouse on Saturday morning.",
    "Volunteers brought tomato seedlings, compost and a great deal of coffee.",
    "The committee thanked the local bakery for donating bread to the volunteers.",
    "Next month we will hold a workshop about saving seeds from heirloom vegetables.",
    "Children from the primary school painted signs for each of the raised beds.",
    "Please remember to close the gate behind you so that the rabbits stay out.",
    "The rain barrels are nearly full after the storms we had earlier this week.",
    "Anyone who wants a plot for the spring season can sign up at the library.",
];

const THREAT: &str = "I know where you live and tonight I am going to kill you.";

/// `text`'s characters from `start` to `end`, as the API counts them.
fn chars(text: &str, start: u64, end: u64) -> String {
    text.chars()
        .skip(start as usize)
        .take((end - start) as usize)
        .collect()
}

/// Where `needle` starts and ends in `text`, in characters.
fn char_range(text: &str, needle: &str) -> (u64, u64) {
    let byte = text.find(needle).expect("needle in text");
    let start = text[..byte].chars().count() as u64;
    (start, start + needle.chars().count() as u64)
}

fn span(e: &Value) -> (u64, u64) {
    (
        e["start"].as_u64().expect("start"),
        e["end"].as_u64().expect("end"),
    )
}

/// The invariants of every explained response: explanations only for
/// flagged categories, at least one for each, every span inside its text;
/// the combined text's spans inside the items they name.
fn assert_explanations_hold(body: &Value, texts: &[&str]) {
    let check = |verdict: &Value, explanations: &[Value]| {
        let flagged: Vec<&String> = verdict["categories"]
            .as_object()
            .expect("categories")
            .iter()
            .filter(|(_, v)| v == &&json!(true))
            .map(|(k, _)| k)
            .collect();
        for category in &flagged {
            assert!(
                explanations
                    .iter()
                    .any(|e| e["category"] == category.as_str()),
                "{category} flagged without an explanation: {verdict}"
            );
        }
        for e in explanations {
            let category = e["category"].as_str().expect("category");
            assert!(
                flagged.iter().any(|f| f.as_str() == category),
                "explains {category}, which is not flagged: {verdict}"
            );
            let score = e["score"].as_f64().expect("score");
            assert!((0.0..=1.0).contains(&score), "{e}");
            assert!(e["source"] == "model" || e["source"] == "lexicon", "{e}");
        }
    };
    for (i, result) in body["results"]
        .as_array()
        .expect("results")
        .iter()
        .enumerate()
    {
        let explanations = result["explanations"]
            .as_array()
            .unwrap_or_else(|| panic!("text result {i} without explanations: {body}"));
        check(result, explanations);
        let len = texts[i].chars().count() as u64;
        for e in explanations {
            let (start, end) = span(e);
            assert!(
                start <= end && end <= len,
                "{e} outside text {i} ({len} chars)"
            );
        }
    }
    let combined = &body["combined_text"];
    let explanations = combined["explanations"]
        .as_array()
        .expect("combined explanations");
    check(combined, explanations);
    for e in explanations {
        let spans = e["spans"].as_array().expect("spans");
        assert!(!spans.is_empty(), "{e}");
        for s in spans {
            let item = s["item"].as_u64().expect("item") as usize;
            let (start, end) = span(s);
            let len = texts[item].chars().count() as u64;
            assert!(start <= end && end <= len, "{e} outside item {item}");
        }
    }
}

async fn explained(app: &TestApp, key: &str, texts: &[&str]) -> Value {
    let input: Vec<Value> = texts
        .iter()
        .map(|t| json!({"type": "text", "text": t}))
        .collect();
    let (status, _, body) = parts(
        app.moderate(key, &json!({"input": input, "explain": true}))
            .await,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_explanations_hold(&body, texts);
    body
}

/// A 2,000-character harmless post with one threat in the middle: the
/// threat is explained by its own sentence, not by the whole post.
async fn a_threat_in_a_long_post_is_pinpointed(backend: Backend) {
    threat_in_a_long_post_pinpointed(spawn_app(backend).await).await;
}

/// The same with the second stage on (`text_model.second_stage`), whose
/// reading of the whole post must not dilute the threat.
async fn a_threat_in_a_long_post_is_pinpointed_with_the_second_stage(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.text_model.speed = Speed::Accurate).await;
    threat_in_a_long_post_pinpointed(app).await;
}

async fn threat_in_a_long_post_pinpointed(app: TestApp) {
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let mut sentences: Vec<&str> = HARMLESS.iter().cycle().take(27).copied().collect();
    sentences.insert(sentences.len() / 2, THREAT);
    let post = sentences.join(" ");
    assert!(post.chars().count() > 1_900, "{}", post.chars().count());

    let body = explained(&app, &key, &[&post]).await;
    let result = &body["results"][0];
    assert_eq!(
        result["categories"]["harassment/threatening"], true,
        "{body}"
    );
    let explanations = result["explanations"].as_array().expect("explanations");
    let threat = explanations
        .iter()
        .find(|e| e["category"] == "harassment/threatening" && e["source"] == "model")
        .unwrap_or_else(|| panic!("no model explanation of the threat: {result}"));
    let (start, end) = span(threat);
    let (threat_start, threat_end) = char_range(&post, THREAT);
    assert!(
        start <= threat_start && threat_end <= end,
        "the span {start}..{end} does not hold the threat at {threat_start}..{threat_end}: {:?}",
        chars(&post, start, end)
    );
    assert!(
        end - start < 200,
        "the span is the sentence, not the post: {:?}",
        chars(&post, start, end)
    );
    // The strongest chunk comes first, with its own score.
    assert!(threat["score"].as_f64().unwrap() > 0.0);
}

/// A threat split between two items: the combined text's explanation
/// names both items, each with the part it holds.
async fn a_threat_split_across_items_names_both(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let texts = ["After the meeting tonight I am going to ki", "ll you"];
    let body = explained(&app, &key, &texts).await;
    let combined = &body["combined_text"];
    assert_eq!(
        combined["categories"]["harassment/threatening"], true,
        "{body}"
    );
    let explanations = combined["explanations"].as_array().expect("explanations");
    let across = explanations
        .iter()
        .filter(|e| e["category"] == "harassment/threatening")
        .find(|e| e["spans"].as_array().is_some_and(|s| s.len() == 2))
        .unwrap_or_else(|| panic!("no explanation across the items: {combined}"));
    let spans = across["spans"].as_array().unwrap();
    assert_eq!(
        (spans[0]["item"].as_u64(), spans[1]["item"].as_u64()),
        (Some(0), Some(1))
    );
    let (start, end) = span(&spans[0]);
    assert!(chars(texts[0], start, end).ends_with("ki"), "{across}");
    let (start, end) = span(&spans[1]);
    assert!(chars(texts[1], start, end).starts_with("ll"), "{across}");
    // The parts alone flag no threat, so they explain none.
    for result in body["results"].as_array().unwrap() {
        assert_eq!(
            result["categories"]["harassment/threatening"], false,
            "{body}"
        );
    }
}

/// A term matched on the de-obfuscated text is placed where the client
/// wrote it: `m*rder`, `k1ll`, `k i l l`, full-width letters, an invisible
/// character inside the word.
async fn lexicon_explanations_point_at_what_was_written(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    for (text, written) in [
        ("Ｏｋａｙ… I swear I will m*rder you tonight.", "m*rder"),
        ("Honestly, you should just k1ll yourself.", "k1ll"),
        ("Listen carefully: I will k i l l you", "k i l l"),
        ("I am going to ＫＩＬＬ you", "ＫＩＬＬ"),
        ("Mark my words, I will ki\u{200B}ll you", "ki\u{200B}ll"),
    ] {
        let body = explained(&app, &key, &[text]).await;
        let explanations = body["results"][0]["explanations"].as_array().unwrap();
        let lexicon: Vec<String> = explanations
            .iter()
            .filter(|e| e["source"] == "lexicon")
            .map(|e| {
                let (start, end) = span(e);
                chars(text, start, end)
            })
            .collect();
        assert!(
            lexicon.iter().any(|t| t.contains(written)),
            "{text:?}: no lexicon explanation holds {written:?}: {lexicon:?} in {body}"
        );
    }
}

/// Without `explain`, the response is what it always was: the same bytes
/// as with `"explain": false`, and no `explanations` anywhere.
async fn without_explain_the_response_is_unchanged(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let input = json!([
        {"type": "text", "text": THREAT},
        {"type": "text", "text": "Have a lovely day!"},
    ]);
    let raw = |body: Value| {
        let app = &app;
        let key = &key;
        async move {
            let response = app.moderate(key, &body).await;
            assert_eq!(response.status(), 200);
            let id = response.headers()["x-request-id"]
                .to_str()
                .unwrap()
                .to_string();
            let bytes = response.bytes().await.unwrap();
            String::from_utf8(bytes.to_vec())
                .unwrap()
                .replace(&id, "ID")
        }
    };
    let absent = raw(json!({"input": input})).await;
    let off = raw(json!({"input": input, "explain": false})).await;
    assert_eq!(absent, off);
    assert!(!absent.contains("explanations"), "{absent}");
    let on = raw(json!({"input": input, "explain": true})).await;
    assert!(on.contains("explanations"), "{on}");
}

/// An unflagged text asked to explain gets an empty list: nothing is
/// flagged, so there is nothing to explain.
async fn unflagged_texts_get_empty_explanations(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let texts = ["Have a lovely day!", "See you at the meeting tomorrow."];
    let body = explained(&app, &key, &texts).await;
    assert_eq!(body["flagged"], false, "{body}");
    for result in body["results"].as_array().unwrap() {
        assert_eq!(result["explanations"], json!([]), "{body}");
    }
    assert_eq!(body["combined_text"]["explanations"], json!([]), "{body}");
}

/// Image results never carry explanations (their scores point at no
/// text); the text items beside them do, and the combined text's spans
/// name the input's indices, the image's skipped.
async fn images_get_no_explanations_and_indices_skip_them(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let image = crate::images::data_uri("image/png", &crate::images::png(32, 32));
    let request = json!({"explain": true, "input": [
        {"type": "image", "base64": image},
        {"type": "text", "text": "After the meeting tonight I am going to ki"},
        {"type": "text", "text": "ll you"},
    ]});
    let (status, _, body) = parts(app.moderate(&key, &request).await).await;
    assert_eq!(status, 200, "{body}");
    assert!(body["results"][0].get("explanations").is_none(), "{body}");
    assert_eq!(body["results"][1]["explanations"], json!([]), "{body}");
    let combined = body["combined_text"]["explanations"].as_array().unwrap();
    let items: Vec<u64> = combined
        .iter()
        .flat_map(|e| e["spans"].as_array().unwrap().iter())
        .map(|s| s["item"].as_u64().unwrap())
        .collect();
    assert!(
        !items.is_empty() && items.iter().all(|i| *i == 1 || *i == 2),
        "{body}"
    );
}

/// `explain` must be a boolean; the 400 names the field.
async fn explain_must_be_a_boolean(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    for value in [json!("yes"), json!(1), json!(null)] {
        let request = json!({"input": [{"type": "text", "text": "a"}], "explain": value});
        let (status, _, body) = parts(app.moderate(&key, &request).await).await;
        assert_eq!(status, 400, "{request} → {body}");
        let message = error_message(&body, "invalid_request");
        assert!(message.contains("explain"), "{message}");
    }
}

/// With the lexical classifier the term lists are the whole score: every
/// explanation is a matched term, placed where it was written, across
/// items too.
async fn the_lexical_classifier_explains_by_its_terms(backend: Backend) {
    let app = spawn_app_with(backend, |c| c.text_classifier = TextClassifierKind::Lexical).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let texts = [
        "Ｏｋ… I swear I will m*rder you",
        "I am going to ki",
        "ll you",
    ];
    let body = explained(&app, &key, &texts).await;
    assert_eq!(body["results"][0]["flagged"], true, "{body}");
    let explanations = body["results"][0]["explanations"].as_array().unwrap();
    assert!(
        explanations.iter().all(|e| e["source"] == "lexicon"),
        "{body}"
    );
    assert!(
        explanations.iter().any(|e| {
            let (start, end) = span(e);
            chars(texts[0], start, end).contains("m*rder")
        }),
        "{body}"
    );
    let combined = body["combined_text"]["explanations"].as_array().unwrap();
    assert!(combined.iter().all(|e| e["source"] == "lexicon"), "{body}");
    assert!(
        combined.iter().any(|e| {
            let items: Vec<u64> = e["spans"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s["item"].as_u64().unwrap())
                .collect();
            items == [1, 2]
        }),
        "no term across items 1 and 2: {body}"
    );
}

on_both_backends!(
    the_lexical_classifier_explains_by_its_terms,
    images_get_no_explanations_and_indices_skip_them,
    a_threat_in_a_long_post_is_pinpointed,
    a_threat_in_a_long_post_is_pinpointed_with_the_second_stage,
    a_threat_split_across_items_names_both,
    lexicon_explanations_point_at_what_was_written,
    without_explain_the_response_is_unchanged,
    unflagged_texts_get_empty_explanations,
    explain_must_be_a_boolean,
);
