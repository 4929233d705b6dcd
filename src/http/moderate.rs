//! `POST /v1/moderate`.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use super::auth::AuthenticatedKey;
use super::error::ApiError;
use super::extract::JsonBody;
use super::pipeline::{self, ItemKind};
use super::request_id::RequestId;
use super::AppState;
use crate::moderation::engine::{Item, ItemOutcome, Moderation, Verdict};
use crate::moderation::vision::ImageAnalysis;
use crate::moderation::{Category, CategoryScores, NUM_CATEGORIES};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModerateRequest {
    input: Vec<InputItem>,
    #[serde(default)]
    analyze_images: bool,
}

/// One input item, parsed by hand from JSON so that every error names the
/// exact field (`input[3].text`), which serde's tagged enums cannot.
#[derive(Debug)]
enum InputItem {
    Text { text: String },
    Image { base64: String },
}

impl<'de> Deserialize<'de> for InputItem {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = serde_json::Map::<String, serde_json::Value>::deserialize(deserializer)
            .map_err(|e| D::Error::custom(item_error(&e.to_string())))?;
        parse_item(value).map_err(D::Error::custom)
    }
}

/// Why an item could not be read, continuing its path: a value of the wrong
/// kind is "not an object", but a fault inside it (a string that is not
/// valid UTF-8, a lone surrogate escape) keeps the parser's own words.
fn item_error(parser_message: &str) -> String {
    if parser_message.starts_with("invalid type") {
        return ": each item must be an object with a \"type\" field".into();
    }
    // The position is added again when the error reaches the top.
    let message = parser_message
        .split(" at line ")
        .next()
        .unwrap_or(parser_message);
    if message == "invalid unicode code point" {
        return ": a string is not valid UTF-8 (send the text UTF-8 encoded)".into();
    }
    format!(": {message}")
}

/// `Err` carries a message that continues the item's path: `.text: expected
/// a string`, or `: missing field ...`.
fn parse_item(mut item: serde_json::Map<String, serde_json::Value>) -> Result<InputItem, String> {
    let kind = match item.remove("type") {
        Some(serde_json::Value::String(kind)) => kind,
        Some(_) => return Err(".type: must be the string \"text\" or \"image\"".into()),
        None => return Err(": missing field `type` (\"text\" or \"image\")".into()),
    };
    let field = match kind.as_str() {
        "text" => "text",
        "image" => "base64",
        other => {
            return Err(format!(
                ".type: unknown item type {other:?}; expected \"text\" or \"image\""
            ))
        }
    };
    if let Some(unknown) = item.keys().find(|k| k.as_str() != field) {
        return Err(format!(
            ".{unknown}: unknown field for a {kind} item (expected `type` and `{field}`)"
        ));
    }
    let value = match item.remove(field) {
        Some(serde_json::Value::String(value)) => value,
        Some(other) => {
            return Err(format!(
                ".{field}: expected a string, found {}",
                json_type(&other)
            ))
        }
        None => return Err(format!(": missing field `{field}` for a {kind} item")),
    };
    Ok(if kind == "text" {
        InputItem::Text { text: value }
    } else {
        InputItem::Image { base64: value }
    })
}

fn json_type(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

#[derive(Debug, Serialize)]
pub struct ModerateResponse {
    id: String,
    model: String,
    flagged: bool,
    results: Vec<ItemResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    combined_text: Option<CombinedText>,
}

#[derive(Debug, Serialize)]
struct ItemResult {
    index: usize,
    #[serde(rename = "type")]
    kind: &'static str,
    flagged: bool,
    categories: CategoryFlags,
    category_scores: ScoreMap,
    #[serde(skip_serializing_if = "Option::is_none")]
    evaluated_categories: Option<Vec<&'static str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image_analysis: Option<ImageAnalysis>,
}

#[derive(Debug, Serialize)]
struct CombinedText {
    flagged: bool,
    categories: CategoryFlags,
    category_scores: ScoreMap,
    items: usize,
}

/// Every category, in the API's order, with its decision.
#[derive(Debug)]
struct CategoryFlags([bool; NUM_CATEGORIES]);

/// Every category, in the API's order, with its score.
#[derive(Debug)]
struct ScoreMap(CategoryScores);

impl Serialize for CategoryFlags {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(NUM_CATEGORIES))?;
        for c in Category::ALL {
            map.serialize_entry(c.as_str(), &self.0[c.index()])?;
        }
        map.end()
    }
}

impl Serialize for ScoreMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(NUM_CATEGORIES))?;
        for (c, score) in self.0.iter() {
            // Six decimals are plenty and keep responses short and stable.
            map.serialize_entry(c.as_str(), &((f64::from(score) * 1e6).round() / 1e6))?;
        }
        map.end()
    }
}

pub async fn moderate(
    State(state): State<AppState>,
    Extension(request_id): Extension<RequestId>,
    Extension(key): Extension<AuthenticatedKey>,
    JsonBody(request): JsonBody<ModerateRequest>,
) -> Result<Response, ApiError> {
    let items = request
        .input
        .into_iter()
        .map(InputItem::into_item)
        .collect();
    let scored =
        match pipeline::moderate(&state, &key.0, items, request.analyze_images, &field_name).await?
        {
            Ok(scored) => scored,
            Err(refused) => return Ok(refused),
        };
    let model = state.engine.model_id();
    Ok(scored.respond(|moderation| response_body(request_id.0, model, moderation)))
}

/// `input[3].text` or `input[3].base64`.
fn field_name(index: usize, kind: ItemKind) -> String {
    match kind {
        ItemKind::Text => format!("input[{index}].text"),
        ItemKind::Image => format!("input[{index}].base64"),
    }
}

impl InputItem {
    fn into_item(self) -> Item {
        match self {
            InputItem::Text { text } => Item::Text(text),
            InputItem::Image { base64 } => Item::Image(base64),
        }
    }
}

fn response_body(id: String, model: String, moderation: Moderation) -> ModerateResponse {
    let results = moderation
        .items
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| match outcome {
            ItemOutcome::Text(verdict) => item_result(index, "text", &verdict, None, None),
            ItemOutcome::Image {
                verdict,
                evaluated,
                analysis,
                ..
            } => {
                let evaluated = evaluated.iter().map(|c| c.as_str()).collect();
                item_result(index, "image", &verdict, Some(evaluated), Some(analysis))
            }
        })
        .collect();
    let combined_text = moderation
        .combined_text
        .map(|(verdict, items)| CombinedText {
            flagged: verdict.flagged,
            categories: CategoryFlags(verdict.categories),
            category_scores: ScoreMap(verdict.scores),
            items,
        });
    ModerateResponse {
        id,
        model,
        flagged: moderation.flagged,
        results,
        combined_text,
    }
}

fn item_result(
    index: usize,
    kind: &'static str,
    verdict: &Verdict,
    evaluated: Option<Vec<&'static str>>,
    analysis: Option<ImageAnalysis>,
) -> ItemResult {
    ItemResult {
        index,
        kind,
        flagged: verdict.flagged,
        categories: CategoryFlags(verdict.categories),
        category_scores: ScoreMap(verdict.scores),
        evaluated_categories: evaluated,
        image_analysis: analysis,
    }
}
