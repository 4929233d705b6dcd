//! `POST /v1/moderations`: OpenAI's moderation API, so that a team using an
//! OpenAI SDK switches by changing the base URL and the key.
//!
//! Same keys, limits, metering and signatures as `/v1/moderate` (the auth
//! layer and [`pipeline`] are shared); only the request's and response's
//! shapes are OpenAI's. Unknown fields are ignored here, because OpenAI's
//! clients send extras; the body's size, the item and character limits and
//! the deadline still apply.

use std::fmt;

use axum::extract::State;
use axum::response::Response;
use axum::Extension;
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

use super::auth::AuthenticatedKey;
use super::error::ApiError;
use super::extract::JsonBody;
use super::pipeline::{self, ItemKind, PolicyBody};
use super::request_id::RequestId;
use super::AppState;
use crate::moderation::engine::{Explain, ImageSource, Item, ItemOutcome, Moderation, Verdict};
use crate::moderation::image::remote::RemoteImages;
use crate::moderation::{Category, CategoryScores, NUM_CATEGORIES};

/// OpenAI's categories that Moderato does not judge: always `false` and 0,
/// with no input type applied, so a client reading them gets an honest
/// "not evaluated" rather than an invented verdict.
pub const NOT_EVALUATED: [&str; 2] = ["illicit", "illicit/violent"];

/// OpenAI's moderation request. Unknown fields are ignored.
#[derive(Debug, Deserialize, ToSchema)]
pub struct ModerationsRequest {
    input: Input,
    /// Accepted and not used: the response names the model that judged.
    #[serde(default)]
    #[allow(dead_code)]
    #[schema(nullable = false)]
    model: Option<String>,
}

/// The three shapes of OpenAI's `input`.
#[derive(Debug)]
enum Input {
    /// One text: one result.
    One(String),
    /// Texts: one result each, in order.
    Texts(Vec<String>),
    /// Content parts (text and images): one result for the whole.
    Parts(Vec<Part>),
}

#[derive(Debug)]
enum Part {
    Text(String),
    /// A `data:image/...;base64,...` URL.
    Image(String),
    /// An `http(s)://` URL: fetched only if the operator's rules allow it.
    RemoteImage(String),
}

/// How the input was shaped, kept after its content went to the engine:
/// it names fields in errors and decides how results are grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    One,
    Texts,
    Parts,
}

impl Input {
    /// The engine's items; remote image URLs are checked against the
    /// operator's rules here, before any other work (no DNS look-up, no
    /// connection: those wait for the engine).
    fn into_items(self, remote: &RemoteImages) -> Result<(Shape, Vec<Item>), ApiError> {
        Ok(match self {
            Input::One(text) => (Shape::One, vec![Item::Text(text)]),
            Input::Texts(texts) => (Shape::Texts, texts.into_iter().map(Item::Text).collect()),
            Input::Parts(parts) => {
                let items = parts
                    .into_iter()
                    .enumerate()
                    .map(|(index, part)| part.into_item(index, remote))
                    .collect::<Result<_, _>>()?;
                (Shape::Parts, items)
            }
        })
    }
}

impl Part {
    fn into_item(self, index: usize, remote: &RemoteImages) -> Result<Item, ApiError> {
        Ok(match self {
            Part::Text(text) => Item::Text(text),
            Part::Image(url) => Item::Image(ImageSource::DataUri(url)),
            Part::RemoteImage(url) => {
                let checked = remote.check(&url).map_err(|error| {
                    let field = Shape::Parts.field_name(index, ItemKind::Image);
                    pipeline::fetch_error(&field, error)
                })?;
                Item::Image(ImageSource::Remote(checked))
            }
        })
    }
}

impl Shape {
    /// The request field an item came from, for error messages.
    fn field_name(self, index: usize, kind: ItemKind) -> String {
        match (self, kind) {
            (Shape::One, _) => "input".into(),
            (Shape::Texts, _) => format!("input[{index}]"),
            (Shape::Parts, ItemKind::Text) => format!("input[{index}].text"),
            (Shape::Parts, ItemKind::Image) => format!("input[{index}].image_url.url"),
        }
    }

    fn results(self, moderation: Moderation) -> Vec<ModerationResult> {
        match self {
            Shape::One | Shape::Texts => moderation
                .items
                .iter()
                .map(|outcome| {
                    let mut result = ModerationResult::default();
                    result.add(outcome);
                    result
                })
                .collect(),
            Shape::Parts => {
                let mut result = ModerationResult::default();
                for outcome in &moderation.items {
                    result.add(outcome);
                }
                if let Some((verdict, _)) = &moderation.combined_text {
                    result.add_text(verdict);
                }
                vec![result]
            }
        }
    }
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(InputVisitor)
    }
}

struct InputVisitor;

impl<'de> Visitor<'de> for InputVisitor {
    type Value = Input;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string, an array of strings, or an array of content parts")
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Input, E> {
        Ok(Input::One(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Input, E> {
        Ok(Input::One(text))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Input, A::Error> {
        let mut texts = Vec::new();
        let mut parts = Vec::new();
        while let Some(element) = seq.next_element::<Element>()? {
            match element {
                Element::Text(text) => texts.push(text),
                Element::Part(part) => parts.push(part),
            }
            if !texts.is_empty() && !parts.is_empty() {
                return Err(de::Error::custom(
                    ": mixes strings and content parts; send an array of strings (one result each) or an array of content parts (one result for all)",
                ));
            }
        }
        Ok(if parts.is_empty() {
            Input::Texts(texts)
        } else {
            Input::Parts(parts)
        })
    }
}

/// One element of an input array.
enum Element {
    Text(String),
    Part(Part),
}

impl<'de> Deserialize<'de> for Element {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ElementVisitor)
    }
}

struct ElementVisitor;

impl<'de> Visitor<'de> for ElementVisitor {
    type Value = Element;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(
            "a string or a content part ({\"type\":\"text\",\"text\":...} or {\"type\":\"image_url\",\"image_url\":{\"url\":...}})",
        )
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<Element, E> {
        Ok(Element::Text(text.to_owned()))
    }

    fn visit_string<E: de::Error>(self, text: String) -> Result<Element, E> {
        Ok(Element::Text(text))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Element, A::Error> {
        let object = serde_json::Map::<String, serde_json::Value>::deserialize(
            de::value::MapAccessDeserializer::new(map),
        )?;
        parse_part(object)
            .map(Element::Part)
            .map_err(<A::Error as de::Error>::custom)
    }
}

/// `Err` continues the element's path: `.type: ...`, `.image_url.url: ...`.
fn parse_part(mut part: serde_json::Map<String, serde_json::Value>) -> Result<Part, String> {
    use serde_json::Value;
    let kind = match part.remove("type") {
        Some(Value::String(kind)) => kind,
        Some(_) => return Err(".type: must be the string \"text\" or \"image_url\"".into()),
        None => return Err(": missing field `type` (\"text\" or \"image_url\")".into()),
    };
    match kind.as_str() {
        "text" => match part.remove("text") {
            Some(Value::String(text)) => Ok(Part::Text(text)),
            Some(_) => Err(".text: expected a string".into()),
            None => Err(": missing field `text` for a text part".into()),
        },
        "image_url" => {
            let url = match part.remove("image_url") {
                Some(Value::Object(mut image)) => image.remove("url"),
                Some(_) => return Err(".image_url: expected an object {\"url\": ...}".into()),
                None => return Err(": missing field `image_url` for an image_url part".into()),
            };
            match url {
                Some(Value::String(url)) => image_url(url),
                Some(_) => Err(".image_url.url: expected a string".into()),
                None => Err(".image_url: missing field `url`".into()),
            }
        }
        other => Err(format!(
            ".type: unknown content part type {other:?}; expected \"text\" or \"image_url\""
        )),
    }
}

/// An inline image, or a remote one, which the handler checks against the
/// operator's rules (the parser has no configuration).
fn image_url(url: String) -> Result<Part, String> {
    let scheme = url
        .split_once(':')
        .map(|(scheme, _)| scheme.to_ascii_lowercase());
    match scheme.as_deref() {
        Some("data") => Ok(Part::Image(url)),
        Some("http" | "https") => Ok(Part::RemoteImage(url)),
        _ => Err(".image_url.url: expected a data URL (data:image/png;base64,...)".into()),
    }
}

/// The schema of what the hand-written deserialiser of [`Input`] accepts.
impl PartialSchema for Input {
    fn schema() -> RefOr<Schema> {
        let string = || ObjectBuilder::new().schema_type(Type::String);
        let text_part = ObjectBuilder::new()
            .property("type", string().enum_values(Some(["text"])))
            .property("text", string())
            .required("type")
            .required("text");
        let url = ObjectBuilder::new()
            .property(
                "url",
                string().description(Some(
                    "A data URL, `data:image/<png|jpeg|gif|webp>;base64,<data>`. An `https://` URL is fetched only when the operator enabled fetching and allowed its host (never from private or loopback addresses); otherwise it is refused with 400.",
                )),
            )
            .required("url");
        let image_part = ObjectBuilder::new()
            .property("type", string().enum_values(Some(["image_url"])))
            .property("image_url", url)
            .required("type")
            .required("image_url");
        let parts = OneOfBuilder::new().item(text_part).item(image_part);
        OneOfBuilder::new()
            .description(Some(
                "A text (one result), texts (one result each, in order), or content parts (one result for the whole).",
            ))
            .item(string())
            .item(ArrayBuilder::new().items(string()).min_items(Some(1)))
            .item(ArrayBuilder::new().items(parts).min_items(Some(1)))
            .into()
    }
}

impl ToSchema for Input {
    fn name() -> std::borrow::Cow<'static, str> {
        "ModerationsInput".into()
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ModerationsResponse {
    /// `modr_...`, equal to the `X-Request-Id` header.
    id: String,
    /// Moderato's model id (not the one asked for).
    model: String,
    results: Vec<ModerationResult>,
    /// Moderato's addition: the policy the request was judged under (the
    /// key's own, else its account's default); `null`: none, the shipped
    /// thresholds.
    /// Always present.
    #[schema(required = true)]
    policy: Option<PolicyBody>,
}

/// One result in OpenAI's shape: per category the strongest score and any
/// flag of the items it covers, and which input types were judged for it.
#[derive(Debug, Default, Serialize, ToSchema)]
struct ModerationResult {
    flagged: bool,
    categories: Flags,
    category_scores: Scores,
    category_applied_input_types: AppliedTypes,
}

impl ModerationResult {
    fn add(&mut self, outcome: &ItemOutcome) {
        match outcome {
            ItemOutcome::Text { verdict, .. } => self.add_text(verdict),
            ItemOutcome::Image {
                verdict,
                evaluated,
                text,
                ..
            } => {
                self.merge(verdict);
                // The image models' categories, and those the image's text
                // raised (flagged): the image is why they are set.
                let raised = text.iter().flat_map(|t| t.categories());
                for category in evaluated.iter().copied().chain(raised) {
                    self.category_applied_input_types.0[category.index()].image = true;
                }
            }
        }
    }

    /// The text model judges every category.
    fn add_text(&mut self, verdict: &Verdict) {
        self.merge(verdict);
        for applied in &mut self.category_applied_input_types.0 {
            applied.text = true;
        }
    }

    fn merge(&mut self, verdict: &Verdict) {
        self.flagged |= verdict.flagged;
        self.category_scores.0 = self.category_scores.0.max_with(&verdict.scores);
        for (flag, flagged) in self.categories.0.iter_mut().zip(verdict.categories) {
            *flag |= flagged;
        }
    }
}

#[derive(Debug, Default)]
struct Flags([bool; NUM_CATEGORIES]);

#[derive(Debug, Default)]
struct Scores(CategoryScores);

#[derive(Clone, Copy, Debug, Default)]
struct Applied {
    text: bool,
    image: bool,
}

#[derive(Debug, Default)]
struct AppliedTypes([Applied; NUM_CATEGORIES]);

/// An object with every category and the ones not evaluated as required
/// properties, each of `value`'s schema.
fn categories_schema(value: impl Fn() -> RefOr<Schema>, description: &str) -> RefOr<Schema> {
    let names = Category::ALL
        .iter()
        .map(|c| c.as_str())
        .chain(NOT_EVALUATED);
    let mut object = ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description));
    for name in names {
        object = object.property(name, value()).required(name);
    }
    object.into()
}

const NOT_EVALUATED_NOTE: &str =
    "`illicit` and `illicit/violent` are not evaluated by Moderato: always false, 0 and [].";

impl PartialSchema for Flags {
    fn schema() -> RefOr<Schema> {
        categories_schema(
            || ObjectBuilder::new().schema_type(Type::Boolean).into(),
            NOT_EVALUATED_NOTE,
        )
    }
}

impl ToSchema for Flags {
    fn name() -> std::borrow::Cow<'static, str> {
        "ModerationsCategories".into()
    }
}

impl PartialSchema for Scores {
    fn schema() -> RefOr<Schema> {
        let score = || {
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .minimum(Some(0))
                .maximum(Some(1))
                .into()
        };
        categories_schema(score, NOT_EVALUATED_NOTE)
    }
}

impl ToSchema for Scores {
    fn name() -> std::borrow::Cow<'static, str> {
        "ModerationsCategoryScores".into()
    }
}

impl PartialSchema for AppliedTypes {
    fn schema() -> RefOr<Schema> {
        let types = || {
            ArrayBuilder::new()
                .items(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .enum_values(Some(["text", "image"])),
                )
                .into()
        };
        categories_schema(types, NOT_EVALUATED_NOTE)
    }
}

impl ToSchema for AppliedTypes {
    fn name() -> std::borrow::Cow<'static, str> {
        "ModerationsAppliedInputTypes".into()
    }
}

/// Every category in the API's order, then the ones not evaluated.
fn serialize_categories<S: Serializer, T: Serialize, U: Serialize>(
    serializer: S,
    value: impl Fn(Category) -> T,
    not_evaluated: U,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(NUM_CATEGORIES + NOT_EVALUATED.len()))?;
    for category in Category::ALL {
        map.serialize_entry(category.as_str(), &value(category))?;
    }
    for name in NOT_EVALUATED {
        map.serialize_entry(name, &not_evaluated)?;
    }
    map.end()
}

impl Serialize for Flags {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serialize_categories(serializer, |c| self.0[c.index()], false)
    }
}

impl Serialize for Scores {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Six decimals, as on /v1/moderate.
        let score = |c: Category| (f64::from(self.0.get(c)) * 1e6).round() / 1e6;
        serialize_categories(serializer, score, 0.0)
    }
}

impl Serialize for AppliedTypes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let types = |c: Category| {
            let applied = self.0[c.index()];
            let mut types = Vec::with_capacity(2);
            if applied.text {
                types.push("text");
            }
            if applied.image {
                types.push("image");
            }
            types
        };
        serialize_categories(serializer, types, Vec::<&str>::new())
    }
}

/// OpenAI-compatible moderation.
///
/// Takes the same API key as `Authorization: Bearer <key>` (or in
/// `X-API-Key`), with the same limits, metering and signatures as
/// `/v1/moderate`. Errors come in OpenAI's shape.
#[utoipa::path(
    post,
    path = "/v1/moderations",
    tag = "moderation",
    request_body = ModerationsRequest,
    security(("Bearer" = []), ("ApiKey" = [])),
    responses((
        status = 200,
        description = "OpenAI's moderation response",
        body = ModerationsResponse,
        headers(
            ("X-RateLimit-Limit-Characters" = u32, description = "The key's text characters per minute (when the request has text)."),
            ("X-RateLimit-Remaining-Characters" = u32, description = "Text characters that can be sent right now (when the request has text)."),
        ),
    )),
)]
pub async fn moderations(
    State(state): State<AppState>,
    Extension(request_id): Extension<RequestId>,
    Extension(key): Extension<AuthenticatedKey>,
    JsonBody(request): JsonBody<ModerationsRequest>,
) -> Result<Response, ApiError> {
    let (shape, items) = request.input.into_items(&state.remote_images)?;
    let field = |index: usize, kind: ItemKind| shape.field_name(index, kind);
    let scored = match pipeline::moderate(&state, &key, items, false, Explain::No, &field).await? {
        Ok(scored) => scored,
        Err(refused) => return Ok(refused),
    };
    let model = state.engine.model_id(pipeline::key_speed(&key));
    let policy = PolicyBody::of(&key);
    Ok(scored.respond(|moderation| ModerationsResponse {
        id: request_id.0,
        model,
        results: shape.results(moderation),
        policy,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::extract::parse_json;

    fn parse(body: &str) -> Result<Input, String> {
        parse_json::<ModerationsRequest>(body.as_bytes())
            .map(|r| r.input)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn the_three_input_shapes() {
        assert!(
            matches!(parse(r#"{"input":"hi","model":"omni-moderation-latest","extra":1}"#), Ok(Input::One(t)) if t == "hi")
        );
        assert!(matches!(parse(r#"{"input":["a","b"]}"#), Ok(Input::Texts(t)) if t == ["a", "b"]));
        let parts = parse(
            r#"{"input":[{"type":"text","text":"a","x":1},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA==","detail":"low"}}]}"#,
        )
        .unwrap();
        let Input::Parts(parts) = parts else {
            panic!("{parts:?}")
        };
        assert!(
            matches!(&parts[..], [Part::Text(t), Part::Image(u)] if t == "a" && u.starts_with("data:"))
        );
    }

    #[test]
    fn remote_urls_are_checked_against_the_rules_and_named() {
        let Ok(Input::Parts(parts)) = parse(
            r#"{"input":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"HTTPS://example.com/a.png"}}]}"#,
        ) else {
            panic!("an https URL parses")
        };
        assert!(matches!(&parts[1], Part::RemoteImage(u) if u.ends_with("/a.png")));
        let input = Input::Parts(parts);
        let Err(error) = input.into_items(&RemoteImages::Disabled) else {
            panic!("refused while fetching is off")
        };
        let message = error.to_string();
        assert!(
            message.starts_with("input[1].image_url.url: remote image URLs are not fetched"),
            "{message}"
        );
        assert_eq!(error.code(), crate::http::error::ErrorCode::InvalidRequest);
    }

    #[test]
    fn errors_name_the_field() {
        let err = parse(
            r#"{"input":[{"type":"image_url","image_url":{"url":"ftp://example.com/a.png"}}]}"#,
        )
        .unwrap_err();
        assert!(
            err.starts_with("input[0].image_url.url: expected a data URL"),
            "{err}"
        );
        let err = parse(r#"{"input":["a",{"type":"text","text":"b"}]}"#).unwrap_err();
        assert!(
            err.starts_with("input: mixes strings and content parts"),
            "{err}"
        );
        let err = parse(r#"{"input":["a",5]}"#).unwrap_err();
        assert!(err.starts_with("input[1]: invalid type"), "{err}");
        let err = parse(r#"{"input":[{"type":"video"}]}"#).unwrap_err();
        assert!(
            err.starts_with("input[0].type: unknown content part type"),
            "{err}"
        );
        let err = parse(r#"{"input":5}"#).unwrap_err();
        assert!(err.starts_with("input: invalid type"), "{err}");
        let err = parse(r#"{"model":"x"}"#).unwrap_err();
        assert!(err.contains("missing field `input`"), "{err}");
    }
}
