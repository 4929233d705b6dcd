//! `POST /v1/moderate`.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use super::auth::AuthenticatedKey;
use super::error::{ApiError, ErrorCode};
use super::extract::JsonBody;
use super::pipeline::{self, ItemKind, PolicyBody};
use super::request_id::RequestId;
use super::AppState;
use crate::moderation::engine::{
    Explain, Explanations, ImageSource, Item, ItemOutcome, Moderation, Verdict,
};
use crate::moderation::explain::{Explanation, ItemSpan, Source, Span};
use crate::moderation::image::vision::{AnalysisError, AnalysisStatus, ImageAnalysis};
use crate::moderation::{Category, CategoryScores, NUM_CATEGORIES};

/// What `POST /v1/moderate` can answer besides 200: every check of the
/// body, the key and the limits, and the engine's refusals.
pub const ERRORS: &[ErrorCode] = &[
    ErrorCode::InvalidRequest,
    ErrorCode::InvalidImage,
    ErrorCode::MissingApiKey,
    ErrorCode::InvalidApiKey,
    ErrorCode::RequestTimeout,
    ErrorCode::PayloadTooLarge,
    ErrorCode::UnsupportedMediaType,
    ErrorCode::RateLimited,
    ErrorCode::Internal,
    ErrorCode::ServiceUnavailable,
];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModerateRequest {
    /// The items, each judged on its own; the text items are also judged
    /// together (`combined_text`). At most `limits.max_items` items (64 by
    /// default) and `limits.max_images` images (8 by default).
    #[schema(min_items = 1)]
    input: Vec<InputItem>,
    /// Ask for the deep analysis of image items by the operator's vision
    /// provider, if one is configured.
    #[serde(default)]
    analyze_images: bool,
    /// Say where each flagged category of a text came from: each text
    /// result and the combined text then carry `explanations`.
    #[serde(default)]
    explain: bool,
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

/// The schema of what [`parse_item`] accepts: it parses by hand, so the
/// schema is written beside it.
impl PartialSchema for InputItem {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(item_schema(
                "text",
                "text",
                "The text, UTF-8; at most `limits.max_text_chars` characters (32000 by default).",
            ))
            .item(item_schema(
                "image",
                "base64",
                "A JPEG, PNG, GIF or WebP image: `data:image/<format>;base64,<data>` or the bare base64 data.",
            ))
            .into()
    }
}

impl ToSchema for InputItem {
    fn name() -> std::borrow::Cow<'static, str> {
        "InputItem".into()
    }
}

fn item_schema(kind: &str, field: &str, description: &str) -> Schema {
    ObjectBuilder::new()
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some([kind])),
        )
        .required("type")
        .property(
            field,
            ObjectBuilder::new()
                .schema_type(Type::String)
                .description(Some(description)),
        )
        .required(field)
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
        .into()
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

#[derive(Debug, Serialize, ToSchema)]
pub struct ModerateResponse {
    /// `modr_...`, equal to the `X-Request-Id` header.
    id: String,
    /// The models that judged, joined by `+`: the text path first
    /// (`minilm-l6+e5-small-heads-V` on the accurate path,
    /// `minilm-l6-heads-V` on the fast one), then the image models.
    model: String,
    /// True when any item or the combined text is flagged.
    flagged: bool,
    /// One result per input item, in order.
    results: Vec<ItemResult>,
    /// All text items judged as one text, so that what shows only across
    /// items is caught; present when the text items were judged together.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    combined_text: Option<CombinedText>,
    /// The policy the request was judged under (the key's own, else its
    /// account's default); `null`: none, the shipped thresholds. A policy
    /// changes `flagged` and `categories`, never the scores.
    /// Always present.
    #[schema(required = true)]
    policy: Option<PolicyBody>,
}

#[derive(Debug, Serialize, ToSchema)]
struct ItemResult {
    /// The item's position in `input`.
    index: usize,
    #[serde(rename = "type")]
    kind: ResultKind,
    flagged: bool,
    categories: CategoryFlags,
    category_scores: ScoreMap,
    /// Text items only: the language the text is surely written in (ISO
    /// 639-1, e.g. `de`), or `null` when unsure (short, mixed or
    /// transliterated text). A text that is not surely English is read by
    /// the multilingual encoder on the accurate path.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, nullable = true, example = "en")]
    language: Option<Option<&'static str>>,
    /// Images only: the categories some model actually judged; the others
    /// are 0 meaning not evaluated.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, value_type = Option<Vec<String>>)]
    evaluated_categories: Option<Vec<&'static str>>,
    /// Images only: the deep analysis by the vision provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    image_analysis: Option<ImageAnalysisBody>,
    /// Text items, with `"explain": true` only: for each flagged category,
    /// the pieces of the text that gave its score (empty when nothing is
    /// flagged).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    explanations: Option<Vec<ExplanationBody>>,
    /// Images only, when text was read in the image (OCR, English and
    /// Chinese): its lines, top to bottom, joined by line breaks. The text
    /// model judges it like a text item (it also joins `combined_text`),
    /// and the image's scores are per category the higher of the image
    /// models' and the text's.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    extracted_text: Option<String>,
    /// Images with `extracted_text` only: the categories the text flagged,
    /// by the text thresholds (possibly none), so a flag can be told to
    /// come from the words rather than the picture.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, value_type = Option<Vec<String>>)]
    text_categories: Option<Vec<&'static str>>,
}

/// A category's API name, one of the eleven.
fn category_name() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some("The flagged category explained."))
        .enum_values(Some(Category::ALL.map(Category::as_str)))
        .into()
}

/// Where a flagged category's score came from in an item's text.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Explanation)]
struct ExplanationBody {
    #[schema(schema_with = category_name)]
    category: &'static str,
    /// Offsets in Unicode scalar values of the item's text as sent:
    /// `text.chars()[start..end]`.
    start: usize,
    end: usize,
    /// The piece's own score for the category in [0, 1] (a chunk's score,
    /// or a matched term's weight), six decimals.
    #[schema(minimum = 0, maximum = 1)]
    score: f64,
    source: SourceBody,
}

/// Where a flagged category's score came from in the combined text.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = CombinedExplanation)]
struct CombinedExplanationBody {
    #[schema(schema_with = category_name)]
    category: &'static str,
    /// Where the piece lies in the input's text items, in order: one span,
    /// or one per item for a piece that runs across neighbouring items
    /// (a threat split between two messages).
    #[schema(min_items = 1)]
    spans: Vec<ItemSpanBody>,
    /// As an item's explanation's.
    #[schema(minimum = 0, maximum = 1)]
    score: f64,
    source: SourceBody,
}

/// A span of one text item, in Unicode scalar values.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ItemSpan)]
struct ItemSpanBody {
    /// The item's position in `input`.
    item: usize,
    start: usize,
    end: usize,
}

/// `model`: a chunk of the text scored by the model; `lexicon`: a term of
/// the term lists matched in the text (found on its de-obfuscated form,
/// placed where it was written).
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = ExplanationSource)]
enum SourceBody {
    Model,
    Lexicon,
}

/// The `type` of a result: its item's.
#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum ResultKind {
    Text,
    Image,
}

#[derive(Debug, Serialize, ToSchema)]
struct CombinedText {
    flagged: bool,
    categories: CategoryFlags,
    category_scores: ScoreMap,
    /// Number of texts taken together: the text items and the texts read
    /// from images (`extracted_text`), in item order.
    items: usize,
    /// With `"explain": true` only: as an item's, placed in the items.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    explanations: Option<Vec<CombinedExplanationBody>>,
}

/// The `image_analysis` object: the engine's [`ImageAnalysis`] as sent, so
/// that the document is derived from the type that is serialised.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ImageAnalysis)]
struct ImageAnalysisBody {
    status: AnalysisStatusBody,
    /// The provider's model, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    model: Option<String>,
    /// Only the categories the provider evaluated, each in [0, 1].
    #[schema(value_type = std::collections::BTreeMap<String, f32>)]
    category_scores: std::collections::BTreeMap<String, f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    rationale: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    error: Option<AnalysisErrorBody>,
}

#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(as = AnalysisStatus)]
enum AnalysisStatusBody {
    Completed,
    Failed,
    NotRequested,
    Unavailable,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = AnalysisError)]
struct AnalysisErrorBody {
    code: String,
    message: String,
}

impl From<ImageAnalysis> for ImageAnalysisBody {
    fn from(analysis: ImageAnalysis) -> ImageAnalysisBody {
        ImageAnalysisBody {
            status: match analysis.status {
                AnalysisStatus::Completed => AnalysisStatusBody::Completed,
                AnalysisStatus::Failed => AnalysisStatusBody::Failed,
                AnalysisStatus::NotRequested => AnalysisStatusBody::NotRequested,
                AnalysisStatus::Unavailable => AnalysisStatusBody::Unavailable,
            },
            model: analysis.model,
            category_scores: analysis.category_scores,
            rationale: analysis.rationale,
            error: analysis
                .error
                .map(|AnalysisError { code, message }| AnalysisErrorBody { code, message }),
        }
    }
}

/// Every category, in the API's order, with its decision.
#[derive(Debug)]
struct CategoryFlags([bool; NUM_CATEGORIES]);

/// Every category, in the API's order, with its score.
#[derive(Debug)]
struct ScoreMap(CategoryScores);

/// An object with every category as a required property of `value`'s schema.
fn category_object(value: impl Fn() -> Schema, description: &str) -> RefOr<Schema> {
    let mut object = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description))
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)));
    for c in Category::ALL {
        object = object.property(c.as_str(), value()).required(c.as_str());
    }
    object.into()
}

impl PartialSchema for CategoryFlags {
    fn schema() -> RefOr<Schema> {
        category_object(
            || ObjectBuilder::new().schema_type(Type::Boolean).into(),
            "Every category with its decision.",
        )
    }
}

impl ToSchema for CategoryFlags {
    fn name() -> std::borrow::Cow<'static, str> {
        "CategoryFlags".into()
    }
}

impl PartialSchema for ScoreMap {
    fn schema() -> RefOr<Schema> {
        category_object(
            || {
                ObjectBuilder::new()
                    .schema_type(Type::Number)
                    .minimum(Some(0))
                    .maximum(Some(1))
                    .into()
            },
            "Every category with its score in [0, 1], six decimals.",
        )
    }
}

impl ToSchema for ScoreMap {
    fn name() -> std::borrow::Cow<'static, str> {
        "CategoryScores".into()
    }
}

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
            map.serialize_entry(c.as_str(), &rounded(score))?;
        }
        map.end()
    }
}

/// Moderate text and image items.
///
/// Needs an API key. The request counts against the key's requests per
/// minute and, for text, its characters per minute.
#[utoipa::path(
    post,
    path = "/v1/moderate",
    tag = "moderation",
    request_body = ModerateRequest,
    security(("ApiKey" = [])),
    responses((
        status = 200,
        description = "One result per item",
        body = ModerateResponse,
        headers(
            ("X-RateLimit-Limit-Characters" = u32, description = "The key's text characters per minute (when the request has text)."),
            ("X-RateLimit-Remaining-Characters" = u32, description = "Text characters that can be sent right now (when the request has text)."),
        ),
    )),
)]
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
    let explain = if request.explain {
        Explain::Yes
    } else {
        Explain::No
    };
    let scored = match pipeline::moderate(
        &state,
        &key,
        items,
        request.analyze_images,
        explain,
        &field_name,
    )
    .await?
    {
        Ok(scored) => scored,
        Err(refused) => return Ok(refused),
    };
    let model = state.engine.model_id(pipeline::key_speed(&key));
    let policy = PolicyBody::of(&key);
    Ok(scored.respond(|moderation| response_body(request_id.0, model, moderation, policy)))
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
            InputItem::Image { base64 } => Item::Image(ImageSource::DataUri(base64)),
        }
    }
}

fn response_body(
    id: String,
    model: String,
    moderation: Moderation,
    policy: Option<PolicyBody>,
) -> ModerateResponse {
    let (mut item_explanations, mut combined_explanations) = match moderation.explanations {
        Some(Explanations { items, combined }) => (items, Some(combined)),
        None => (Vec::new(), None),
    };
    let results = moderation
        .items
        .into_iter()
        .enumerate()
        .map(|(index, outcome)| {
            let explanations = item_explanations
                .get_mut(index)
                .and_then(Option::take)
                .map(|list| list.into_iter().map(ExplanationBody::from).collect());
            match outcome {
                ItemOutcome::Text { verdict, language } => {
                    let mut result = item_result(index, ResultKind::Text, &verdict, None, None);
                    result.explanations = explanations;
                    result.language = Some(language.map(|l| l.code()));
                    result
                }
                ItemOutcome::Image {
                    verdict,
                    evaluated,
                    analysis,
                    text,
                    ..
                } => {
                    // The text model judges every category of the text it reads.
                    let evaluated = if text.is_some() {
                        Category::ALL.iter().map(|c| c.as_str()).collect()
                    } else {
                        evaluated.iter().map(|c| c.as_str()).collect()
                    };
                    let analysis = Some(analysis.into());
                    let mut result = item_result(
                        index,
                        ResultKind::Image,
                        &verdict,
                        Some(evaluated),
                        analysis,
                    );
                    if let Some(text) = text {
                        result.text_categories =
                            Some(text.categories().iter().map(|c| c.as_str()).collect());
                        result.extracted_text = Some(text.text);
                    }
                    result
                }
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
            explanations: combined_explanations.take().map(|list| {
                list.into_iter()
                    .map(CombinedExplanationBody::from)
                    .collect()
            }),
        });
    ModerateResponse {
        id,
        model,
        flagged: moderation.flagged,
        results,
        combined_text,
        policy,
    }
}

fn item_result(
    index: usize,
    kind: ResultKind,
    verdict: &Verdict,
    evaluated: Option<Vec<&'static str>>,
    analysis: Option<ImageAnalysisBody>,
) -> ItemResult {
    ItemResult {
        index,
        kind,
        flagged: verdict.flagged,
        categories: CategoryFlags(verdict.categories),
        category_scores: ScoreMap(verdict.scores),
        evaluated_categories: evaluated,
        language: None,
        image_analysis: analysis,
        extracted_text: None,
        text_categories: None,
        explanations: None,
    }
}

/// Six decimals, as the category scores.
fn rounded(score: f32) -> f64 {
    (f64::from(score) * 1e6).round() / 1e6
}

impl From<Source> for SourceBody {
    fn from(source: Source) -> SourceBody {
        match source {
            Source::Model => SourceBody::Model,
            Source::Lexicon => SourceBody::Lexicon,
        }
    }
}

impl From<Explanation<Span>> for ExplanationBody {
    fn from(e: Explanation<Span>) -> ExplanationBody {
        ExplanationBody {
            category: e.category.as_str(),
            start: e.place.start(),
            end: e.place.end(),
            score: rounded(e.score),
            source: e.source.into(),
        }
    }
}

impl From<Explanation<Vec<ItemSpan>>> for CombinedExplanationBody {
    fn from(e: Explanation<Vec<ItemSpan>>) -> CombinedExplanationBody {
        CombinedExplanationBody {
            category: e.category.as_str(),
            spans: e
                .place
                .into_iter()
                .map(|s| ItemSpanBody {
                    item: s.item,
                    start: s.span.start(),
                    end: s.span.end(),
                })
                .collect(),
            score: rounded(e.score),
            source: e.source.into(),
        }
    }
}
