//! Moderation beyond English (issue #56), over HTTP on the default (accurate)
//! path: a hateful and a harmless sentence in six scripts, each result
//! naming its language, the hateful one flagged for hate, the harmless one
//! not flagged; and explanations whose offsets fall on the text as sent.

use serde_json::{json, Value};

use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;

/// (language, a hateful sentence, a harmless one).
const PAIRS: [(&str, &str, &str); 7] = [
    (
        "de",
        "Ich hasse alle Ausländer, sie sind Ungeziefer und sollten aus unserem Land verschwinden.",
        "Das Wetter ist heute schön, wir gehen nachmittags mit den Kindern in den Park.",
    ),
    (
        "es",
        "Odio a todos los inmigrantes, son animales sucios y deberían largarse de nuestro país.",
        "Hoy hace buen tiempo, por la tarde vamos al parque con los niños.",
    ),
    (
        "ru",
        "Я ненавижу всех мигрантов, они грязные животные и должны убраться из нашей страны.",
        "Сегодня хорошая погода, после обеда мы пойдём гулять в парк.",
    ),
    (
        "ar",
        "أنا أكره كل المهاجرين، إنهم حيوانات قذرة ويجب طردهم من بلدنا.",
        "الطقس جميل اليوم، سنذهب إلى الحديقة بعد الظهر.",
    ),
    (
        "hi",
        "मुझे सभी मुसलमानों से नफ़रत है, वे गंदे जानवर हैं और उन्हें देश से निकाल देना चाहिए।",
        "आज मौसम बहुत अच्छा है, हम दोपहर में पार्क जाएंगे।",
    ),
    (
        "zh",
        "我讨厌所有的黑人，他们都是肮脏的畜生，应该滚出我们的国家。",
        "今天天气很好，下午我们去公园散步。",
    ),
    (
        "ko",
        "모든 이민자들은 더러운 짐승이고 우리나라에서 쫓아내야 한다.",
        "오늘 날씨가 좋아서 오후에 공원에 산책하러 갈 거예요.",
    ),
];

async fn hate_is_flagged_in_six_scripts_and_harmless_text_is_not(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    for (language, hateful, harmless) in PAIRS {
        let input = json!([{"type": "text", "text": hateful}, {"type": "text", "text": harmless}]);
        let (status, _, body) = parts(app.moderate(&key, &json!({"input": input})).await).await;
        assert_eq!(status, 200, "{body}");
        let (hate, calm) = (&body["results"][0], &body["results"][1]);
        // Arabic's was only scored high (0.63 against the hate threshold of
        // 0.67) by heads .21; since .22, with rows written in each language,
        // it is flagged (0.68).
        assert_eq!(hate["categories"]["hate"], true, "{language}: {hate}");
        assert_eq!(calm["flagged"], false, "{language}: {calm}");
        assert_eq!(hate["language"], language, "{hate}");
        assert!(
            calm["language"] == language || calm["language"] == Value::Null,
            "{language}: a harmless sentence is named right or not at all: {calm}"
        );
        assert!(
            body["model"]
                .as_str()
                .unwrap()
                .starts_with("minilm-l6+e5-small-heads-"),
            "{body}"
        );
    }
}

/// Explanations in other scripts point into the text as sent: offsets in
/// Unicode scalar values, inside the text, on its words.
async fn explanations_point_into_text_in_other_scripts(backend: Backend) {
    let app = spawn_app(backend).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    // Explanations are given for flagged categories only: every hateful
    // sentence above is flagged for hate since heads .22 (Arabic's was not).
    for (language, hateful, _) in PAIRS {
        let padded = format!("\u{200b}{hateful}");
        let input = json!([{"type": "text", "text": padded}]);
        let (status, _, body) = parts(
            app.moderate(&key, &json!({"input": input, "explain": true}))
                .await,
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let explanations = body["results"][0]["explanations"].as_array().unwrap();
        let hate: Vec<&Value> = explanations
            .iter()
            .filter(|e| e["category"] == "hate")
            .collect();
        assert!(!hate.is_empty(), "{language}: {body}");
        let chars: Vec<char> = padded.chars().collect();
        for e in hate {
            let (start, end) = (
                e["start"].as_u64().unwrap() as usize,
                e["end"].as_u64().unwrap() as usize,
            );
            assert!(start < end && end <= chars.len(), "{language}: {e}");
            let piece: String = chars[start..end].iter().collect();
            assert!(
                piece.chars().any(char::is_alphabetic),
                "{language}: the span holds letters of the text: {piece:?}"
            );
        }
    }
}

on_both_backends!(
    hate_is_flagged_in_six_scripts_and_harmless_text_is_not,
    explanations_point_into_text_in_other_scripts,
);
