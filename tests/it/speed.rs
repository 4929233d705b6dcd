//! The text path's speed (issue #54): the accurate path (both encoders) by
//! default, `speed = "fast"` (the first stage alone) per policy for a
//! high-volume key, and the operator's default in configuration. Every
//! response's `model` names the path that judged it.

use serde_json::Value;

use crate::dash_client::{cli_json, create_account, moderato, Session, PASSWORD};
use crate::helpers::*;
use crate::on_both_backends;
use moderato::access::Tier;
use moderato::moderation::Speed;

/// A text the first stage finds suspect, so the accurate path reads it again.
const INSULT: &str = "you are a worthless idiot and everyone hates you";

async fn judged(app: &TestApp, key: &str) -> Value {
    let (status, _, body) = parts(app.moderate_text(key, INSULT).await).await;
    assert_eq!(status, 200, "{body}");
    body
}

fn text_model(body: &Value) -> &str {
    body["model"].as_str().unwrap().split('+').next().unwrap()
}

async fn a_fast_policy_takes_the_first_stage_alone(backend: Backend) {
    let app = spawn_app(backend).await;
    create_account(&app, "bo@example.com", "customer", &["--tier", "pro"]);
    let make_key = |name: &str, extra: &[&str]| {
        let mut args = vec![
            "keys",
            "create",
            "--name",
            name,
            "--account",
            "bo@example.com",
            "--json",
        ];
        args.extend_from_slice(extra);
        cli_json(&app, &args)["key"].as_str().unwrap().to_owned()
    };
    let accurate_key = make_key("accurate", &[]);
    let fast = cli_json(
        &app,
        &[
            "policies",
            "create",
            "--name",
            "bulk",
            "--account",
            "bo@example.com",
            "--speed",
            "fast",
            "--json",
        ],
    );
    assert_eq!(fast["speed"], "fast", "{fast}");
    let fast_key = make_key("bulk", &["--policy", fast["id"].as_str().unwrap()]);

    let accurate = judged(&app, &accurate_key).await;
    assert!(
        accurate["model"]
            .as_str()
            .unwrap()
            .starts_with("minilm-l6+e5-small-heads-"),
        "the default path reads with both encoders: {accurate}"
    );
    let fast = judged(&app, &fast_key).await;
    assert!(
        fast["model"]
            .as_str()
            .unwrap()
            .starts_with("minilm-l6-heads-"),
        "a fast policy is judged by the first stage alone: {fast}"
    );
    assert_eq!(fast["policy"]["speed"], "fast");
    assert_ne!(text_model(&accurate), text_model(&fast));
    assert_ne!(
        accurate["results"][0]["category_scores"], fast["results"][0]["category_scores"],
        "the second stage changes the scores of a text it reads again"
    );

    // A bad speed names the option and the values it takes.
    let out = moderato(
        &app,
        &[
            "policies",
            "create",
            "--name",
            "x",
            "--account",
            "bo@example.com",
            "--speed",
            "quick",
        ],
        "",
    );
    assert!(!out.success);
    assert!(
        out.stderr.contains("\"accurate\" or \"fast\""),
        "{}",
        out.stderr
    );

    // Back to accurate: the next version, and the key follows.
    let id = fast["policy"]["id"].as_str().unwrap().to_owned();
    let changed = cli_json(
        &app,
        &[
            "policies",
            "update",
            &id,
            "--account",
            "bo@example.com",
            "--speed",
            "accurate",
            "--json",
        ],
    );
    assert_eq!(
        (changed["version"].as_u64(), changed["speed"].as_str()),
        (Some(2), Some("accurate"))
    );
}

async fn the_dashboard_chooses_a_policys_speed(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.text_classifier = moderato::config::TextClassifierKind::Lexical;
    })
    .await;
    create_account(&app, "di@example.com", "customer", &[]);
    let mut di = Session::signed_in(&app, "di@example.com", PASSWORD).await;
    let page = di.get("/dashboard/policies").await;
    assert!(
        page.body.contains("data-testid=\"policy-speed\""),
        "{}",
        page.body
    );
    let csrf = page.csrf();
    let refused = di
        .post(
            "/dashboard/policies",
            &[("name", "odd"), ("speed", "quick"), ("csrf_token", &csrf)],
        )
        .await;
    assert_eq!(refused.status, 400, "{}", refused.body);
    assert!(
        refused.body.contains("speed: unknown speed"),
        "{}",
        refused.body
    );
    let made = di
        .post(
            "/dashboard/policies",
            &[("name", "bulk"), ("speed", "fast"), ("csrf_token", &csrf)],
        )
        .await;
    assert_eq!(made.status, 303, "{}", made.body);
    let shown = di.get(made.location()).await;
    assert!(
        shown.body.contains("all shipped, speed fast"),
        "{}",
        shown.body
    );
    assert!(
        shown.body.contains("<option value=\"fast\" selected>"),
        "the form shows the policy's speed: {}",
        shown.body
    );
}

on_both_backends!(
    a_fast_policy_takes_the_first_stage_alone,
    the_dashboard_chooses_a_policys_speed,
);

/// An operator may make the fast path the only one; the old setting
/// `second_stage = false` still means it.
#[tokio::test]
async fn the_operator_can_make_fast_the_default() {
    for tweak in [
        (|c: &mut moderato::config::Config| c.text_model.speed = Speed::Fast)
            as fn(&mut moderato::config::Config),
        |c| c.text_model.second_stage = Some(false),
    ] {
        let app = spawn_app_with(Backend::Sqlite, tweak).await;
        let (_, key) = app.create_key(Tier::Pro, None).await;
        let body = judged(&app, &key).await;
        assert!(
            body["model"]
                .as_str()
                .unwrap()
                .starts_with("minilm-l6-heads-"),
            "{body}"
        );
    }
    let app = spawn_app_with(Backend::Sqlite, |c| c.text_model.second_stage = Some(true)).await;
    let (_, key) = app.create_key(Tier::Pro, None).await;
    let body = judged(&app, &key).await;
    assert!(
        body["model"]
            .as_str()
            .unwrap()
            .starts_with("minilm-l6+e5-small-heads-"),
        "{body}"
    );
}
