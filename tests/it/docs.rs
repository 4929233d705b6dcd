//! The documentation as a newcomer uses it: the README's quick start run as
//! written against the real binary, and every relative link of README.md and
//! docs/*.md followed to a file (and a heading) that exists.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pulldown_cmark::{CodeBlockKind, Event, HeadingLevel, Parser, Tag, TagEnd};
use serde_json::Value;

use crate::child::ChildServer;
use crate::helpers::models_dir;

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------- quick start

/// A fenced block of the quick start: its language and its text.
struct Block {
    lang: String,
    text: String,
}

/// The fenced code blocks between `## Quick start` and the next `##`.
fn quick_start_blocks(readme: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let (mut in_section, mut heading, mut in_heading) = (false, String::new(), false);
    let mut current: Option<Block> = None;
    for event in Parser::new(readme) {
        match event {
            Event::Start(Tag::Heading { level, .. }) if level <= HeadingLevel::H2 => {
                in_heading = true;
                heading.clear();
            }
            Event::End(TagEnd::Heading(level)) if level <= HeadingLevel::H2 => {
                in_heading = false;
                in_section = heading.trim() == "Quick start";
            }
            Event::Text(text) | Event::Code(text) if in_heading => heading.push_str(&text),
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) if in_section => {
                current = Some(Block {
                    lang: lang.to_string(),
                    text: String::new(),
                });
            }
            Event::Text(text) => {
                if let Some(block) = current.as_mut() {
                    block.text.push_str(&text);
                }
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(current.take()),
            _ => {}
        }
    }
    blocks
}

/// A block's shell commands, one per logical line (a trailing `\` joins the
/// next line), without blank lines and comments.
fn commands(script: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut pending = String::new();
    for line in script.lines() {
        match line.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(line);
                let command = pending.trim().to_string();
                pending.clear();
                if !command.is_empty() && !command.starts_with('#') {
                    commands.push(command);
                }
            }
        }
    }
    commands
}

/// `NAME` of a command `NAME=$(...)`: its output is kept for the later ones.
fn assigned_variable(command: &str) -> Option<&str> {
    let (name, rest) = command.split_once('=')?;
    let is_name = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    (is_name && rest.starts_with("$(")).then_some(name)
}

/// Whether `expected` is contained in `actual`: every key of an object with
/// a contained value, arrays of the same length item by item, other values
/// equal. What the README leaves out (ids, scores) is not compared.
fn contains(actual: &Value, expected: &Value, at: &str) -> Result<(), String> {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => {
            for (key, value) in expected {
                let inner = actual
                    .get(key)
                    .ok_or_else(|| format!("{at}.{key} is missing"))?;
                contains(inner, value, &format!("{at}.{key}"))?;
            }
            Ok(())
        }
        (Value::Array(actual), Value::Array(expected)) if actual.len() == expected.len() => actual
            .iter()
            .zip(expected)
            .enumerate()
            .try_for_each(|(i, (a, e))| contains(a, e, &format!("{at}[{i}]"))),
        _ if actual == expected => Ok(()),
        _ => Err(format!("{at} is {actual}, the README shows {expected}")),
    }
}

/// The quick start's shell, with what differs from the reader's machine
/// substituted: the service's real address and the binary cargo built.
struct QuickStart {
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    address: Option<String>,
    variables: HashMap<String, String>,
    _server: Option<ChildServer>,
}

impl QuickStart {
    fn new() -> QuickStart {
        let env = vec![
            (
                "MODERATO_MODELS_DIR".into(),
                models_dir().display().to_string(),
            ),
            // The one log format the test can read the address from.
            ("MODERATO_LOG_FORMAT".into(), "json".into()),
            ("MODERATO_LOG".into(), "info".into()),
            // Tests run side by side: no default metrics port.
            ("MODERATO_METRICS_ADDR".into(), String::new()),
        ];
        QuickStart {
            dir: tempfile::tempdir().expect("temp dir"),
            env,
            address: None,
            variables: HashMap::new(),
            _server: None,
        }
    }

    /// `scripts/run.sh`: the binary's `serve` on its embedded defaults, in
    /// a directory of its own, on port 0 instead of 8080.
    fn start_service(&mut self) {
        let mut env = self.env.clone();
        env.push(("MODERATO_ADDR".into(), "127.0.0.1:0".into()));
        let server = ChildServer::start_in(self.dir.path(), &env);
        self.address = Some(server.address.clone());
        self._server = Some(server);
    }

    fn substituted(&self, command: &str) -> String {
        let address = self
            .address
            .as_deref()
            .expect("the quick start starts the service before its other commands");
        let binary = env!("CARGO_BIN_EXE_moderato");
        command
            .replace("cargo run -q --release --", &format!("'{binary}'"))
            .replace("127.0.0.1:8080", address)
    }

    /// Runs one command in bash as the reader's shell would, with the
    /// variables earlier commands set; returns what it printed.
    fn run(&mut self, command: &str) -> String {
        let mut script = format!("set -euo pipefail\n{}\n", self.substituted(command));
        let variable = assigned_variable(command).map(str::to_string);
        if let Some(name) = &variable {
            script.push_str(&format!("printf '%s' \"${name}\"\n"));
        }
        let output: Output = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(self.dir.path())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(&self.variables)
            .output()
            .expect("bash (the README's quick start is a shell session)");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "the README's command failed ({}):\n{command}\nstdout: {stdout}\nstderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        if let Some(name) = variable {
            assert!(!stdout.is_empty(), "{command}\nset {name} to nothing");
            self.variables.insert(name, stdout.clone());
        }
        stdout
    }
}

#[test]
fn the_readme_quick_start_works_as_written() {
    let readme = read(&repository().join("README.md"));
    let blocks = quick_start_blocks(&readme);
    let mut shell = QuickStart::new();
    let mut last: Option<(String, String)> = None;
    let (mut commands_run, mut answers_checked) = (0, 0);
    for block in &blocks {
        match block.lang.as_str() {
            "sh" => {
                for command in commands(&block.text) {
                    if command.starts_with("scripts/run.sh") {
                        shell.start_service();
                        continue;
                    }
                    let output = shell.run(&command);
                    last = Some((command, output));
                    commands_run += 1;
                }
            }
            "json" => {
                let expected: Value = serde_json::from_str(&block.text).unwrap_or_else(|e| {
                    panic!(
                        "the quick start's answer is not JSON ({e}):\n{}",
                        block.text
                    )
                });
                let (command, output) = last.take().expect("a json block follows a command");
                let actual: Value = serde_json::from_str(output.trim())
                    .unwrap_or_else(|e| panic!("{command}\nprinted no JSON ({e}): {output}"));
                if let Err(difference) = contains(&actual, &expected, "answer") {
                    panic!("{command}\n{difference}\nthe whole answer: {actual:#}");
                }
                answers_checked += 1;
            }
            other => panic!("a `{other}` block in the quick start: only sh and json are run"),
        }
    }
    // The section exists and holds what a newcomer needs: a key and a call.
    assert!(shell.address.is_some(), "the quick start starts no service");
    assert!(
        shell.variables.contains_key("KEY"),
        "the quick start makes no KEY"
    );
    assert!(
        commands_run >= 3 && answers_checked >= 2,
        "{commands_run} commands, {answers_checked} answers"
    );
}

// ---------------------------------------------------------------------- links

/// GitHub's anchor for a heading: lower case, punctuation dropped (letters,
/// digits, `-` and `_` kept), spaces as `-`, and `-1`, `-2`... on repeats.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut anchors = BTreeSet::new();
    let mut heading: Option<String> = None;
    for event in Parser::new(markdown) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::Text(text) | Event::Code(text) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&text);
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                let text = heading.take().unwrap_or_default();
                let slug: String = text
                    .to_lowercase()
                    .chars()
                    .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
                    .map(|c| if c == ' ' { '-' } else { c })
                    .collect();
                let repeats = seen.entry(slug.clone()).or_insert(0);
                anchors.insert(match *repeats {
                    0 => slug,
                    n => format!("{slug}-{n}"),
                });
                *repeats += 1;
            }
            _ => {}
        }
    }
    anchors
}

/// Every link and image target of a Markdown text.
fn link_targets(markdown: &str) -> Vec<String> {
    Parser::new(markdown)
        .filter_map(|event| match event {
            Event::Start(Tag::Link { dest_url, .. })
            | Event::Start(Tag::Image { dest_url, .. }) => Some(dest_url.to_string()),
            _ => None,
        })
        .collect()
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

/// README.md and every docs/*.md, relative to the repository.
fn documents() -> Vec<PathBuf> {
    let mut documents = vec![PathBuf::from("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repository().join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .map(|path| {
            path.strip_prefix(repository())
                .expect("inside")
                .to_path_buf()
        })
        .collect();
    docs.sort();
    documents.extend(docs);
    documents
}

/// `a/b/../c` → `a/c`, without touching the file system (a target may be
/// missing, and that is what is checked).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_readme_and_docs_resolves() {
    let root = repository();
    let mut broken = Vec::new();
    let mut reached: BTreeSet<PathBuf> = BTreeSet::new();
    let mut checked = 0;
    for document in documents() {
        let text = read(&root.join(&document));
        let folder = document.parent().unwrap_or(Path::new("")).to_path_buf();
        for target in link_targets(&text) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((path, anchor)) => (path, Some(anchor)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                document.clone()
            } else {
                normalise(&folder.join(path))
            };
            reached.insert(file.clone());
            if !root.join(&file).exists() {
                broken.push(format!(
                    "{}: {target} (no {})",
                    document.display(),
                    file.display()
                ));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if file.extension().is_some_and(|e| e == "md")
                && !anchors(&read(&root.join(&file))).contains(anchor)
            {
                broken.push(format!(
                    "{}: {target} (no heading #{anchor})",
                    document.display()
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that do not resolve:\n{}",
        broken.join("\n")
    );
    assert!(
        checked > 50,
        "only {checked} relative links found: is the parser reading them?"
    );
    // Every page of docs/ is linked from the README or another page, so
    // none is left where nobody finds it.
    let orphans: Vec<_> = documents()
        .into_iter()
        .filter(|d| d != Path::new("README.md") && !reached.contains(d))
        .collect();
    assert!(orphans.is_empty(), "docs no page links to: {orphans:?}");
}

#[test]
fn anchors_follow_github() {
    let found = anchors(
        "# Moderato\n## `POST /v1/moderate`\n### Limits (configurable, `[limits]`)\n\
         ## Explanations (`\"explain\": true`)\n## Errors\n## Errors\n",
    );
    let expected: BTreeSet<String> = [
        "moderato",
        "post-v1moderate",
        "limits-configurable-limits",
        "explanations-explain-true",
        "errors",
        "errors-1",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(found, expected);
}

// ---------------------------------------------------------------------- paths

/// Where the docs name a file of the repository in a code span (`scripts/run.sh`,
/// `tests/it/journal.rs`), it is there: a moved or renamed file shows here.
#[test]
fn every_repository_path_the_docs_name_exists() {
    /// The folders a named path starts with; `models/` and `data/` are
    /// made at run time and not checked.
    const FOLDERS: &[&str] = &[
        ".ci/",
        "assets/",
        "benches/",
        "config/",
        "crates/",
        "deploy/",
        "docs/",
        "eval/",
        "examples/",
        "fuzz/",
        "migrations/",
        "scripts/",
        "src/",
        "templates/",
        "tests/",
        "tools/",
        "train/",
    ];
    /// Made by a run (fuzzing, training), not kept in the repository.
    const GENERATED: &[&str] = &["fuzz/artifacts/", "train/out/"];
    let root = repository();
    let mut missing = Vec::new();
    let mut checked = 0;
    for document in documents() {
        for event in Parser::new(&read(&root.join(&document))) {
            let Event::Code(span) = event else { continue };
            let Some(first) = span.split_whitespace().next() else {
                continue;
            };
            let path = first.trim_end_matches([',', '.', ';', ':', ')']);
            let is_pattern = path.contains(['{', '*', '<']) || path.contains("...");
            if !FOLDERS.iter().any(|f| path.starts_with(f)) || is_pattern {
                continue;
            }
            if GENERATED.contains(&path) {
                continue;
            }
            checked += 1;
            // `examples/latency` names the example `cargo run --example latency` runs.
            let example = path.starts_with("examples/") && root.join(format!("{path}.rs")).exists();
            if !root.join(path).exists() && !example {
                missing.push(format!("{}: `{span}`", document.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths named in the docs that do not exist:\n{}",
        missing.join("\n")
    );
    assert!(
        checked > 50,
        "only {checked} paths found: is the parser reading code spans?"
    );
}
