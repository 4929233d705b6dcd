//! The OpenAPI document, generated from the handlers' annotations and the
//! types the handlers serialise, and served at `/v1/openapi.json`.
//!
//! What an annotation cannot see is added by [`Modify`] steps from the code's
//! own tables: each route's error codes (statuses from the error table in
//! `error.rs`), the headers every response carries (request id, signature),
//! the rate-limit headers of authenticated routes, and the security schemes.
//! A copy is committed at `docs/openapi.json`; a test fails when it differs.

use std::sync::LazyLock;

use axum::http::StatusCode;
use utoipa::openapi::header::{Header, HeaderBuilder};
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
use utoipa::{Modify, OpenApi, PartialSchema};

use super::error::ErrorCode;
use super::{meta, moderate, openai};

/// The security scheme names used in `security(...)` annotations.
pub const API_KEY_SCHEME: &str = "ApiKey";
pub const BEARER_SCHEME: &str = "Bearer";

/// The error codes each documented operation can answer with, beside its
/// success. Every route can answer 500 (a panic, a response that cannot be
/// signed); 404 and 405 belong to paths and methods that are not operations.
pub fn route_errors(method: &str, path: &str) -> &'static [ErrorCode] {
    match (method, path) {
        // Both routes share the pipeline, hence its errors.
        ("post", "/v1/moderate" | "/v1/moderations") => moderate::ERRORS,
        ("get", "/ready") => meta::READY_ERRORS,
        _ => meta::PUBLIC_ERRORS,
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Moderato",
        description = "Self-hostable content moderation. Every response is signed (RFC 9421, Ed25519); verify with the keys at /v1/signing-keys. Unknown paths answer 404 (`not_found`) and unsupported methods 405 (`method_not_allowed`) with the same error object.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    servers((url = "http://127.0.0.1:8080")),
    paths(
        moderate::moderate,
        openai::moderations,
        meta::signing_keys,
        meta::openapi,
        meta::health,
        meta::ready,
    ),
    components(schemas(super::error::ErrorBody, super::error::OpenAiErrorBody)),
    modifiers(&SecuritySchemes, &ErrorResponses, &ResponseHeaders),
    tags(
        (name = "moderation", description = "Moderating text and images"),
        (name = "service", description = "Public endpoints without an API key"),
    ),
)]
struct ApiDoc;

/// The document as served, rendered once.
pub fn json() -> &'static str {
    static JSON: LazyLock<String> = LazyLock::new(|| {
        ApiDoc::openapi()
            .to_pretty_json()
            .expect("the OpenAPI document serialises")
    });
    &JSON
}

/// The document as a value, for tests and tools.
pub fn document() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            API_KEY_SCHEME,
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                super::auth::API_KEY_HEADER,
                "An API key made by `moderato keys create`.",
            ))),
        );
        components.add_security_scheme(
            BEARER_SCHEME,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The same API key as a bearer token (`Authorization: Bearer <key>`), as OpenAI's clients send it.",
                    ))
                    .build(),
            ),
        );
    }
}

/// Adds to every operation one response per error status it can give,
/// naming the codes, with the error object's schema.
struct ErrorResponses;

impl Modify for ErrorResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for_each_operation(openapi, |method, path, operation| {
            let mut by_status: Vec<(StatusCode, Vec<ErrorCode>)> = Vec::new();
            for &code in route_errors(method, path) {
                match by_status.iter_mut().find(|(s, _)| *s == code.status()) {
                    Some((_, codes)) => codes.push(code),
                    None => by_status.push((code.status(), vec![code])),
                }
            }
            for (status, codes) in by_status {
                let names: Vec<String> =
                    codes.iter().map(|c| format!("`{}`", c.as_str())).collect();
                let mut response = ResponseBuilder::new()
                    .description(format!(
                        "{}: {}",
                        status.canonical_reason().unwrap_or("Error"),
                        names.join(", ")
                    ))
                    .content(
                        "application/json",
                        Content::new(Some(Ref::from_schema_name(error_schema(path)))),
                    );
                if codes.iter().any(|c| c.has_retry_after()) {
                    response = response.header(
                        "Retry-After",
                        integer_header("Whole seconds to wait before retrying."),
                    );
                }
                operation
                    .responses
                    .responses
                    .insert(status.as_str().to_owned(), RefOr::T(response.build()));
            }
        });
    }
}

/// The headers the layers add: on every response the request id and the
/// signature; on responses of authenticated operations the rate limit.
struct ResponseHeaders;

impl Modify for ResponseHeaders {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for_each_operation(openapi, |_, _, operation| {
            let authenticated = operation.security.as_ref().is_some_and(|s| !s.is_empty());
            for (status, response) in operation.responses.responses.iter_mut() {
                let RefOr::T(response) = response else {
                    continue;
                };
                for (name, header) in signed_response_headers() {
                    response.headers.insert(name.into(), header);
                }
                // Refused before the key is known: no allowance to report.
                let before_limiter = status == "401";
                if authenticated && !before_limiter {
                    for (name, header) in rate_limit_headers() {
                        response.headers.insert(name.into(), header);
                    }
                }
            }
        });
    }
}

/// The error body's schema on `path`: OpenAI's shape on its route.
pub fn error_schema(path: &str) -> &'static str {
    match path {
        "/v1/moderations" => "OpenAiErrorBody",
        _ => "ErrorBody",
    }
}

fn for_each_operation(
    openapi: &mut utoipa::openapi::OpenApi,
    mut visit: impl FnMut(&str, &str, &mut Operation),
) {
    for (path, item) in openapi.paths.paths.iter_mut() {
        let operations = [
            ("get", &mut item.get),
            ("put", &mut item.put),
            ("post", &mut item.post),
            ("delete", &mut item.delete),
            ("patch", &mut item.patch),
        ];
        for (method, operation) in operations {
            if let Some(operation) = operation {
                visit(method, path, operation);
            }
        }
    }
}

fn string_header(description: &str) -> Header {
    HeaderBuilder::new()
        .schema(String::schema())
        .description(Some(description))
        .build()
}

fn integer_header(description: &str) -> Header {
    HeaderBuilder::new()
        .schema(u64::schema())
        .description(Some(description))
        .build()
}

fn signed_response_headers() -> [(&'static str, Header); 5] {
    [
        (
            "X-Request-Id",
            string_header("Unique id of the response (`modr_...`), equal to the body's `id` on success."),
        ),
        (
            "Content-Digest",
            string_header("RFC 9530 SHA-256 digest of the body: `sha-256=:<base64>:`."),
        ),
        (
            "Signature-Input",
            string_header("RFC 9421: `sig1=(\"@status\" \"content-type\" \"content-digest\" \"x-request-id\" \"@method\";req \"@path\";req \"content-digest\";req \"x-client-nonce\");created=...;keyid=\"...\";alg=\"ed25519\"`: the response and the request it answers. `\"content-digest\";req` (the SHA-256 of the request body the service read) is left out only when the service answered without reading the body (408, 413, 415); `\"x-client-nonce\"` only when the request sent none."),
        ),
        (
            "X-Client-Nonce",
            string_header("The request's `X-Client-Nonce` (1 to 128 visible ASCII characters, no `\"` or `\\`), echoed and covered by the signature; absent when the request sent none or an invalid one."),
        ),
        (
            "Signature",
            string_header("RFC 9421 Ed25519 signature: `sig1=:<base64>:`. Verify with the keys at /v1/signing-keys."),
        ),
    ]
}

fn rate_limit_headers() -> [(&'static str, Header); 5] {
    [
        (
            "X-RateLimit-Limit",
            integer_header(
                "Requests per minute of the allowance the key draws on: its account's, shared by all the account's keys (an operator key: its own), or the key's own lower limit when that is what binds.",
            ),
        ),
        (
            "X-RateLimit-Remaining",
            integer_header("Requests that can be made right now."),
        ),
        (
            "X-RateLimit-Reset",
            integer_header("Unix time (s) at which the allowance is whole again."),
        ),
        (
            "RateLimit-Policy",
            string_header("IETF draft: `\"requests\";q=<limit>;w=60`."),
        ),
        (
            "RateLimit",
            string_header("IETF draft: `\"requests\";r=<remaining>;t=<seconds to reset>`."),
        ),
    ]
}
