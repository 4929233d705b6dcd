//! Policies per key (issue 24): an account's policy turns categories off or
//! sets their thresholds, keys follow their account's default or name their
//! own, every response names the policy it was judged under, a change
//! reaches every replica within the key cache's TTL, and another account's
//! policy is refused everywhere. Scores never change with a policy.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::dash_client::{cli_json, create_account, moderato, Session, PASSWORD};
use crate::helpers::*;
use crate::on_both_backends;

const CATEGORIES: [&str; 11] = [
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
];

/// Categories without a parent: lowering one of these flags nothing else.
const TOP_LEVEL: [&str; 5] = ["harassment", "hate", "self-harm", "sexual", "violence"];

const VIOLENT: &str = "I will find you and kill you, you worthless piece of garbage";
const BENIGN: &str = "The weather is lovely today, let's have a picnic in the park";

/// `moderato args…`, asserting failure; its standard error.
fn cli_error(app: &TestApp, args: &[&str]) -> String {
    let out = moderato(app, args, "");
    assert!(!out.success, "moderato {args:?} succeeded: {}", out.stdout);
    out.stderr
}

fn account_key(app: &TestApp, email: &str, name: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "keys",
        "create",
        "--name",
        name,
        "--account",
        email,
        "--json",
    ];
    args.extend_from_slice(extra);
    cli_json(app, &args)["key"].as_str().unwrap().to_owned()
}

async fn moderate(base: &str, client: &reqwest::Client, key: &str, texts: &[&str]) -> Value {
    let input: Vec<Value> = texts
        .iter()
        .map(|t| json!({"type": "text", "text": t}))
        .collect();
    let response = client
        .post(format!("{base}/v1/moderate"))
        .header("x-api-key", key)
        .json(&json!({ "input": input }))
        .send()
        .await
        .unwrap();
    let (status, _, body) = parts(response).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// What a policy of `off` categories and one `lowered` threshold must make
/// of a baseline verdict (`flagged`, `categories`, `category_scores`):
/// the same scores, the off categories false, the lowered one flagged from
/// its new threshold on.
fn expected_verdict(baseline: &Value, off: &BTreeSet<&str>, lowered: (&str, f64)) -> Value {
    let mut verdict = baseline.clone();
    for c in CATEGORIES {
        let score = baseline["category_scores"][c].as_f64().unwrap();
        let was = baseline["categories"][c].as_bool().unwrap();
        let now = if off.contains(c) {
            false
        } else if c == lowered.0 {
            was || score >= lowered.1
        } else {
            was
        };
        verdict["categories"][c] = json!(now);
    }
    let any = CATEGORIES
        .iter()
        .any(|c| verdict["categories"][*c].as_bool().unwrap());
    verdict["flagged"] = json!(any);
    verdict
}

/// The whole expected body of `/v1/moderate` under the policy.
fn expected_body(baseline: &Value, off: &BTreeSet<&str>, lowered: (&str, f64)) -> Value {
    let mut body = baseline.clone();
    let results: Vec<Value> = baseline["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| expected_verdict(r, off, lowered))
        .collect();
    let mut flagged = results.iter().any(|r| r["flagged"] == true);
    body["results"] = json!(results);
    if baseline.get("combined_text").is_some() {
        let combined = expected_verdict(&baseline["combined_text"], off, lowered);
        flagged |= combined["flagged"] == true;
        body["combined_text"] = combined;
    }
    body["flagged"] = json!(flagged);
    body
}

fn without_id_and_policy(body: &Value) -> Value {
    let mut body = body.clone();
    let object = body.as_object_mut().unwrap();
    object.remove("id");
    object.remove("policy");
    body
}

/// One account, two keys made before its policy exists: both follow the
/// account's default once it is made, a third key names the policy itself,
/// and the responses differ from the shipped ones only in `flagged`,
/// `categories` and `policy`.
async fn off_and_lowered_thresholds_seen_by_two_keys(backend: Backend) {
    let app = spawn_app(backend).await;
    create_account(&app, "ada@example.com", "customer", &["--tier", "pro"]);
    let first = account_key(&app, "ada@example.com", "first", &[]);
    let second = account_key(&app, "ada@example.com", "second", &[]);
    let texts = [VIOLENT, BENIGN];

    let baseline = moderate(&app.base, &app.client, &first, &texts).await;
    assert_eq!(baseline["policy"], Value::Null, "no policy: null");
    // The violent text is flagged with the shipped thresholds: turn off
    // every category that flagged it (in the item or the combined text).
    let mut off = BTreeSet::new();
    for verdict in [&baseline["results"][0], &baseline["combined_text"]] {
        for c in CATEGORIES {
            if verdict["categories"][c] == true {
                off.insert(c);
            }
        }
    }
    assert!(!off.is_empty(), "the violent text is flagged: {baseline}");
    // The benign text's strongest top-level category not turned off gets a
    // threshold just under its score.
    let benign = &baseline["results"][1];
    assert_eq!(benign["flagged"], false, "{benign}");
    let (lowered, score) = TOP_LEVEL
        .iter()
        .filter(|c| !off.contains(*c))
        .map(|c| (*c, benign["category_scores"][*c].as_f64().unwrap()))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert!(score > 0.0, "{benign}");
    let threshold = format!("{:.6}", (score * 0.9).max(0.000_001));
    let threshold_value: f64 = threshold.parse().unwrap();

    let mut args = vec![
        "policies".to_owned(),
        "create".into(),
        "--name".into(),
        "strict".into(),
        "--account".into(),
        "ada@example.com".into(),
        "--threshold".into(),
        format!("{lowered}={threshold}"),
        "--default".into(),
        "--json".into(),
    ];
    for c in &off {
        args.extend(["--off".to_owned(), c.to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let policy = cli_json(&app, &args);
    let policy_id = policy["id"].as_str().unwrap().to_owned();
    assert_eq!(policy["version"], 1);
    assert_eq!(policy["default"], true);
    assert_eq!(policy["rules"][lowered], threshold_value);
    let made = Instant::now();

    // A third key names the policy itself.
    let third = account_key(&app, "ada@example.com", "third", &["--policy", &policy_id]);

    // Past the key cache's TTL every key reads the new default.
    let ttl = Duration::from_millis(app.config.auth.key_cache_ttl_ms);
    tokio::time::sleep(ttl.saturating_sub(made.elapsed())).await;
    let expected = expected_body(&baseline, &off, (lowered, threshold_value));
    assert_eq!(expected["results"][0]["flagged"], false);
    assert_eq!(expected["results"][1]["flagged"], true);
    for key in [&first, &second, &third] {
        let body = moderate(&app.base, &app.client, key, &texts).await;
        assert_eq!(
            body["policy"],
            json!({"id": policy_id, "name": "strict", "version": 1, "speed": "accurate"}),
            "{body}"
        );
        assert_eq!(
            without_id_and_policy(&body),
            without_id_and_policy(&expected),
            "only flagged and categories change"
        );
    }

    // The OpenAI-compatible route names it too, and judges the same way.
    let response = app
        .client
        .post(format!("{}/v1/moderations", app.base))
        .bearer_auth(&second)
        .json(&json!({"input": VIOLENT}))
        .send()
        .await
        .unwrap();
    let (status, _, body) = parts(response).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["policy"]["id"], policy_id.as_str());
    assert_eq!(body["policy"]["version"], 1);
    for c in &off {
        assert_eq!(body["results"][0]["categories"][*c], false, "{c}: {body}");
    }

    // Usage rows name the policy.
    let events = app.usage_events(5).await;
    let with_policy = events
        .iter()
        .filter(|e| e.policy_id.as_ref().map(|p| p.as_str()) == Some(policy_id.as_str()))
        .count();
    assert_eq!(with_policy, 4, "{events:?}");
    assert_eq!(events.iter().filter(|e| e.policy_id.is_none()).count(), 1);
}

/// Two replicas, each with a warm key cache: a change (CLI) is judged by
/// both once the TTL has passed, with the next version named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_reaches_a_second_replica_within_the_ttl() {
    let first = spawn_app(Backend::Postgres).await;
    let (second, shutdown) = spawn_second_replica(&first).await;
    create_account(&first, "kim@example.com", "customer", &["--tier", "pro"]);
    let policy = cli_json(
        &first,
        &[
            "policies",
            "create",
            "--name",
            "calm",
            "--account",
            "kim@example.com",
            "--default",
            "--json",
        ],
    );
    let id = policy["id"].as_str().unwrap();
    let key = account_key(&first, "kim@example.com", "k", &[]);
    let ttl = Duration::from_millis(first.config.auth.key_cache_ttl_ms);
    let bases = [first.base.clone(), second];
    // Both caches hold the key with version 1.
    for base in &bases {
        let body = moderate(base, &first.client, &key, &[VIOLENT]).await;
        assert_eq!(body["policy"]["version"], 1, "{body}");
    }
    let baseline = moderate(&bases[1], &first.client, &key, &[VIOLENT]).await;
    let flagged: Vec<&str> = CATEGORIES
        .iter()
        .copied()
        .filter(|c| baseline["results"][0]["categories"][*c] == true)
        .collect();
    assert!(!flagged.is_empty(), "{baseline}");

    let mut args = vec![
        "policies",
        "update",
        id,
        "--account",
        "kim@example.com",
        "--json",
    ];
    for c in &flagged {
        args.extend(["--off", c]);
    }
    let updated = cli_json(&first, &args);
    assert_eq!(updated["version"], 2);
    let changed = Instant::now();

    // Poll the second replica: version 2 appears, and by the TTL at the latest.
    loop {
        // When the request was sent: an answer from a cache entry read
        // before the change may arrive a little after the TTL.
        let sent = changed.elapsed();
        let body = moderate(&bases[1], &first.client, &key, &[VIOLENT]).await;
        if body["policy"]["version"] == 2 {
            assert_eq!(body["results"][0]["flagged"], false, "{body}");
            break;
        }
        assert!(
            sent < ttl,
            "the second replica still judged by version 1 {sent:?} after the change: {body}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    tokio::time::sleep(ttl.saturating_sub(changed.elapsed())).await;
    for base in &bases {
        let body = moderate(base, &first.client, &key, &[VIOLENT]).await;
        assert_eq!(body["policy"]["version"], 2, "{base}: {body}");
        assert_eq!(
            body["results"][0]["category_scores"], baseline["results"][0]["category_scores"],
            "scores never change"
        );
    }

    // The change is kept: version, who, when.
    let shown = cli_json(
        &first,
        &[
            "policies",
            "show",
            id,
            "--account",
            "kim@example.com",
            "--json",
        ],
    );
    let history = shown["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{shown}");
    assert_eq!(history[0]["version"], 2);
    assert_eq!(history[0]["changed_by"], "cli");
    assert_eq!(history[1]["version"], 1);
    assert!(history[0]["changed_at"].is_string());
    shutdown.cancel();
}

/// Another account's policy is refused by the CLI and the dashboard (404
/// in the dashboard, as for another account's key); bad rules are refused
/// naming the field.
async fn another_accounts_policy_and_bad_rules_are_refused(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.text_classifier = moderato::config::TextClassifierKind::Lexical;
    })
    .await;
    create_account(&app, "alice@example.com", "customer", &[]);
    create_account(&app, "bob@example.com", "customer", &[]);
    let bobs = cli_json(
        &app,
        &[
            "policies",
            "create",
            "--name",
            "bob's",
            "--account",
            "bob@example.com",
            "--off",
            "hate",
            "--json",
        ],
    )["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The CLI.
    let err = cli_error(
        &app,
        &[
            "keys",
            "create",
            "--name",
            "x",
            "--account",
            "alice@example.com",
            "--policy",
            &bobs,
        ],
    );
    assert!(err.contains("--policy: no policy"), "{err}");
    let err = cli_error(
        &app,
        &["policies", "show", &bobs, "--account", "alice@example.com"],
    );
    assert!(err.contains("no policy"), "{err}");
    // The operator account's policies are for the CLI's own keys.
    let operators = cli_json(
        &app,
        &[
            "policies", "create", "--name", "ops", "--off", "sexual", "--json",
        ],
    );
    let operators = operators["id"].as_str().unwrap();
    let key = cli_json(
        &app,
        &[
            "keys", "create", "--name", "ops", "--tier", "free", "--policy", operators, "--json",
        ],
    )["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = moderate(&app.base, &app.client, &key, &["hello"]).await;
    assert_eq!(body["policy"]["id"], operators);
    let err = cli_error(
        &app,
        &[
            "keys",
            "create",
            "--name",
            "x",
            "--account",
            "alice@example.com",
            "--policy",
            operators,
        ],
    );
    assert!(err.contains("--policy: no policy"), "{err}");
    // Not the operator's either.
    let err = cli_error(
        &app,
        &[
            "keys", "create", "--name", "x", "--tier", "free", "--policy", &bobs,
        ],
    );
    assert!(err.contains("--policy: no policy"), "{err}");
    for (args, says) in [
        (vec!["--threshold", "hate=1.5"], "--threshold hate: "),
        (vec!["--threshold", "hate=0"], "--threshold hate: "),
        (
            vec!["--threshold", "hat=0.5"],
            "--threshold: unknown category \"hat\"",
        ),
        (
            vec!["--off", "violent"],
            "--off: unknown category \"violent\"",
        ),
    ] {
        let mut all = vec![
            "policies",
            "create",
            "--name",
            "bad",
            "--account",
            "alice@example.com",
        ];
        all.extend(args);
        let err = cli_error(&app, &all);
        assert!(err.contains(says), "{err}");
    }

    // The dashboard.
    let mut alice = Session::signed_in(&app, "alice@example.com", PASSWORD).await;
    let (key_id, _) = alice.create_key("mine").await;
    assert_eq!(
        alice
            .get(&format!("/dashboard/policies/{bobs}"))
            .await
            .status,
        404
    );
    let csrf = alice.csrf("/dashboard/policies").await;
    let page = alice
        .post(
            &format!("/dashboard/keys/{key_id}/policy"),
            &[("policy", bobs.as_str()), ("csrf_token", &csrf)],
        )
        .await;
    assert_eq!(page.status, 404, "{}", page.body);
    let page = alice
        .post(
            &format!("/dashboard/policies/{bobs}"),
            &[("name", "mine now"), ("csrf_token", &csrf)],
        )
        .await;
    assert_eq!(page.status, 404);
    let page = alice
        .post(
            "/dashboard/keys",
            &[
                ("name", "k2"),
                ("policy", bobs.as_str()),
                ("csrf_token", &csrf),
            ],
        )
        .await;
    assert_eq!(page.status, 400, "{}", page.body);
    assert!(page
        .testid_text("error")
        .unwrap()
        .contains("policy: no policy"));
    // Bad rules: 400 naming the field, and nothing made.
    for (form, says) in [
        (
            vec![("rule.hate", "threshold"), ("threshold.hate", "1.5")],
            "threshold.hate: ",
        ),
        (vec![("rule.hat", "off")], "rule.hat: unknown category"),
    ] {
        let mut all = vec![("name", "bad"), ("csrf_token", csrf.as_str())];
        all.extend(form);
        let page = alice.post("/dashboard/policies", &all).await;
        assert_eq!(page.status, 400, "{}", page.body);
        let error = page.testid_text("error").unwrap();
        assert!(error.contains(says), "{error}");
    }
    // Without the session's token: 403.
    let page = alice
        .post("/dashboard/policies", &[("name", "no token")])
        .await;
    assert_eq!(page.status, 403);
    let listed = cli_json(
        &app,
        &[
            "policies",
            "list",
            "--account",
            "alice@example.com",
            "--json",
        ],
    );
    assert_eq!(listed, json!([]));
    // Bob's policy is untouched.
    let bob = cli_json(
        &app,
        &[
            "policies",
            "show",
            &bobs,
            "--account",
            "bob@example.com",
            "--json",
        ],
    );
    assert_eq!(bob["version"], 1);
    assert_eq!(bob["name"], "bob's");
}

/// The dashboard makes a policy, changes it (its history shows who and
/// when), sets it on a key, and the API names it.
async fn the_dashboard_makes_changes_and_assigns_a_policy(backend: Backend) {
    let app = spawn_app_with(backend, |c| {
        c.text_classifier = moderato::config::TextClassifierKind::Lexical;
    })
    .await;
    create_account(&app, "cy@example.com", "customer", &[]);
    let mut cy = Session::signed_in(&app, "cy@example.com", PASSWORD).await;
    let (key_id, secret) = cy.create_key("main").await;
    let page = cy.get("/dashboard/policies").await;
    assert_eq!(page.status, 200);
    assert_eq!(page.body.matches("data-category=").count(), 11);
    let csrf = page.csrf();
    let made = cy
        .post(
            "/dashboard/policies",
            &[
                ("name", "forum"),
                ("rule.violence", "off"),
                ("rule.hate", "threshold"),
                ("threshold.hate", "0.2"),
                ("rule.sexual", "shipped"),
                ("csrf_token", &csrf),
            ],
        )
        .await;
    assert_eq!(made.status, 303, "{}", made.body);
    let path = made.location().to_owned();
    let id = path.rsplit('/').next().unwrap().to_owned();
    let shown = cy.get(&path).await;
    assert_eq!(shown.status, 200);
    assert!(
        shown.body.contains("hate 0.2, violence off"),
        "{}",
        shown.body
    );

    let changed = cy
        .post(
            &path,
            &[
                ("name", "forum"),
                ("rule.violence", "off"),
                ("rule.hate", "shipped"),
                ("default", "on"),
                ("csrf_token", &csrf),
            ],
        )
        .await;
    assert_eq!(changed.status, 303, "{}", changed.body);
    let shown = cy.get(&path).await;
    assert!(
        shown
            .body
            .contains(r#"<td data-col="by">cy@example.com</td>"#),
        "{}",
        shown.body
    );
    assert_eq!(shown.body.matches("data-version=").count(), 2);

    let shown = cy.get(&path).await;
    assert!(shown.body.contains(r#"name="default" value="on" checked"#));

    // The key follows the default; then names the policy itself.
    let body = moderate(&app.base, &app.client, &secret, &["hello"]).await;
    let until = Instant::now() + Duration::from_secs(5);
    let mut body = body;
    while body["policy"]["version"] != 2 && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
        body = moderate(&app.base, &app.client, &secret, &["hello"]).await;
    }
    assert_eq!(
        body["policy"],
        json!({"id": id, "name": "forum", "version": 2, "speed": "accurate"})
    );
    let set = cy
        .post(
            &format!("/dashboard/keys/{key_id}/policy"),
            &[("policy", id.as_str()), ("csrf_token", &csrf)],
        )
        .await;
    assert_eq!(set.status, 303, "{}", set.body);
    let keys = cy.get("/dashboard/keys").await;
    assert!(keys.body.contains("forum (v2)"), "{}", keys.body);
    assert!(keys
        .body
        .contains(&format!("<option value=\"{id}\" selected>")));

    // The usage CSV names the policy of each day's requests.
    let csv = cy.get("/dashboard/usage.csv").await;
    assert!(csv
        .body
        .starts_with("day,requests,items,rate_limited,policy\n"));
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    let mut found = false;
    for _ in 0..100 {
        let csv = cy.get("/dashboard/usage.csv").await;
        if csv
            .body
            .lines()
            .any(|l| l.starts_with(&today) && l.ends_with(&id))
        {
            found = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(found, "the CSV names the policy");
}

/// Explanations follow the policy's flags: a category the policy turns
/// off is neither flagged nor explained, and one it raises by a lowered
/// threshold is explained like any other flag.
async fn explanations_follow_the_policys_flags(backend: Backend) {
    let app = spawn_app(backend).await;
    create_account(&app, "eve@example.com", "customer", &["--tier", "pro"]);
    let key = account_key(&app, "eve@example.com", "k", &[]);
    let explained = |key: String| {
        let app = &app;
        async move {
            let response = app
                .client
                .post(format!("{}/v1/moderate", app.base))
                .header("x-api-key", key)
                .json(&json!({"input": [{"type": "text", "text": VIOLENT}, {"type": "text", "text": BENIGN}], "explain": true}))
                .send()
                .await
                .unwrap();
            let (status, _, body) = parts(response).await;
            assert_eq!(status, 200, "{body}");
            body
        }
    };
    let explained_categories = |result: &Value| -> BTreeSet<String> {
        result["explanations"]
            .as_array()
            .expect("explanations asked for")
            .iter()
            .map(|e| e["category"].as_str().unwrap().to_owned())
            .collect()
    };
    let flagged_categories = |result: &Value| -> BTreeSet<String> {
        CATEGORIES
            .iter()
            .filter(|c| result["categories"][**c] == true)
            .map(|c| (*c).to_owned())
            .collect()
    };
    let baseline = explained(key.clone()).await;
    let violent = &baseline["results"][0];
    let flagged = flagged_categories(violent);
    assert!(flagged.contains("harassment"), "{violent}");
    assert_eq!(explained_categories(violent), flagged);

    // Harassment off; the benign text's top score in a lowered category.
    let benign = &baseline["results"][1];
    let (lowered, score) = ["hate", "self-harm", "sexual", "violence"]
        .iter()
        .map(|c| (*c, benign["category_scores"][*c].as_f64().unwrap()))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    let threshold = format!("{lowered}={:.6}", (score * 0.9).max(0.000_001));
    let policy = cli_json(
        &app,
        &[
            "policies",
            "create",
            "--name",
            "p",
            "--account",
            "eve@example.com",
            "--off",
            "harassment",
            "--off",
            "harassment/threatening",
            "--threshold",
            &threshold,
            "--default",
            "--json",
        ],
    );
    assert!(policy["id"].is_string(), "{policy}");
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = loop {
        let body = explained(key.clone()).await;
        if body["policy"]["name"] == "p" {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the policy did not apply: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for result in [
        &body["results"][0],
        &body["results"][1],
        &body["combined_text"],
    ] {
        let flagged = flagged_categories(result);
        assert!(!flagged.contains("harassment"), "{result}");
        assert_eq!(explained_categories(result), flagged, "{result}");
    }
    assert!(
        flagged_categories(&body["results"][1]).contains(lowered),
        "{body}"
    );
}

on_both_backends!(
    explanations_follow_the_policys_flags,
    off_and_lowered_thresholds_seen_by_two_keys,
    another_accounts_policy_and_bad_rules_are_refused,
    the_dashboard_makes_changes_and_assigns_a_policy,
);

/// The Policies page in headless Chromium: a customer makes a policy with
/// the form, changes it, gives it to a key on the keys page, and the API
/// names it. Screenshots: `policies`, `policy`, `policy-history`,
/// `keys-policy`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_customer_makes_and_assigns_a_policy_in_the_browser() {
    use crate::webdriver::Browser;
    let app = spawn_app_with(Backend::Sqlite, |c| {
        c.text_classifier = moderato::config::TextClassifierKind::Lexical;
    })
    .await;
    create_account(&app, "dee@example.com", "customer", &[]);
    let browser = Browser::start(&app.base).await;
    browser.goto("/dashboard/login").await;
    browser
        .fill(r#"input[name="email"]"#, "dee@example.com")
        .await;
    browser.fill(r#"input[name="password"]"#, PASSWORD).await;
    browser.submit(r#"[data-testid="sign-in"]"#).await;
    browser.wait_for_path("/dashboard/keys").await;
    browser.fill(r#"input[name="name"]"#, "chat").await;
    browser.submit(r#"[data-testid="create-key"]"#).await;
    let secret = browser.text(r#"[data-testid="new-key"]"#).await;

    browser.goto("/dashboard/policies").await;
    let shipped = browser
        .text(r#"tr[data-category="violence"] [data-col="shipped"]"#)
        .await;
    assert!(
        shipped.parse::<f64>().is_ok(),
        "shipped value shown: {shipped:?}"
    );
    browser.fill(r#"input[name="name"]"#, "kids").await;
    browser
        .click(r#"select[name="rule.violence"] option[value="off"]"#)
        .await;
    browser
        .click(r#"select[name="rule.sexual"] option[value="threshold"]"#)
        .await;
    browser
        .fill(r#"input[name="threshold.sexual"]"#, "0.1")
        .await;
    browser.click(r#"input[name="default"]"#).await;
    browser.screenshot("policies").await;
    browser.submit(r#"[data-testid="create-policy"]"#).await;
    let rules = browser
        .text(r#"[data-testid="policy"] [data-col="rules"]"#)
        .await;
    assert_eq!(rules, "sexual 0.1, violence off");
    let path = browser.path().await;
    let id = path.rsplit('/').next().unwrap().to_owned();

    // A change: its history shows two versions, the newest first.
    browser
        .click(r#"select[name="rule.hate"] option[value="threshold"]"#)
        .await;
    browser.fill(r#"input[name="threshold.hate"]"#, "0.3").await;
    browser.submit(r#"[data-testid="update-policy"]"#).await;
    let version = browser
        .text(r#"[data-testid="policy"] [data-col="version"]"#)
        .await;
    assert_eq!(version, "2");
    assert!(browser.exists(r#"tr[data-version="1"]"#).await);
    browser.screenshot("policy").await;
    browser
        .client
        .execute(
            r#"document.querySelector('[data-testid="policy-history"]').scrollIntoView()"#,
            vec![],
        )
        .await
        .expect("scroll to the history");
    browser.screenshot("policy-history").await;

    // The keys page names it and sets it on the key.
    browser.goto("/dashboard/keys").await;
    let key_id = crate::dash_client::key_id_of(&secret);
    let row = format!(r#"tr[data-key-id="{key_id}"] [data-col="policy"]"#);
    let deadline = Instant::now() + Duration::from_secs(5);
    while browser.text(&row).await != "kids (v2)" {
        assert!(Instant::now() < deadline, "the key's policy is not shown");
        tokio::time::sleep(Duration::from_millis(100)).await;
        browser.client.refresh().await.expect("reload");
    }
    browser
        .click(&format!(
            r#"tr[data-policy-of="{key_id}"] option[value="{id}"]"#
        ))
        .await;
    browser
        .click(&format!(
            r#"tr[data-policy-of="{key_id}"] [data-testid="set-key-policy"]"#
        ))
        .await;
    browser.wait_for_path("/dashboard/keys").await;
    browser.screenshot("keys-policy").await;
    browser.close().await;

    let body = moderate(&app.base, &app.client, &secret, &["hello"]).await;
    assert_eq!(
        body["policy"],
        json!({"id": id, "name": "kids", "version": 2, "speed": "accurate"})
    );
}
