//! The lexical classifier: the fast first layer of text moderation. Matches
//! curated terms and phrases (assets/lexicon/*.txt, compiled in) by whole
//! tokens on the normalised text, and turns the matches into per-category
//! scores. Context and negation are the embedding model's job; this layer
//! only avoids the classic substring and idiom false positives.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use super::normalize::{self, normalize, tokens};
use crate::moderation::category::{Category, CategoryScores, Thresholds, NUM_CATEGORIES};
use crate::moderation::classifier::{ExplainedScores, TextClassifier, TextEvidence};
use crate::moderation::explain::Source;
use crate::moderation::Deadline;

/// Longest phrase, in tokens, that a lexicon line may have.
const MAX_PHRASE_TOKENS: usize = 10;
/// Doubled letters tried as single per token (2^this lookups at most).
const MAX_DEDOUBLE_RUNS: usize = 4;
/// Multi-token phrases are also matched written as one word (`#killyourself`)
/// when the joined form is at least this long; shorter joins collide with
/// real words.
const MIN_JOINED_PHRASE_LEN: usize = 6;
/// Weight of an age under 18 (`12 year old`, `12yo`) as a minor signal.
const AGE_MINOR_WEIGHT: f32 = 0.9;
/// Ceiling of any lexical score: a word list never knows for certain.
const MAX_SCORE: f32 = 0.99;

/// The category files, compiled into the binary.
const CATEGORY_LISTS: [(Category, &str); 10] = [
    (
        Category::Harassment,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/harassment.txt"
        )),
    ),
    (
        Category::HarassmentThreatening,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/harassment_threatening.txt"
        )),
    ),
    (
        Category::Hate,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/hate.txt"
        )),
    ),
    (
        Category::HateThreatening,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/hate_threatening.txt"
        )),
    ),
    (
        Category::SelfHarm,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/self_harm.txt"
        )),
    ),
    (
        Category::SelfHarmIntent,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/self_harm_intent.txt"
        )),
    ),
    (
        Category::SelfHarmInstructions,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/self_harm_instructions.txt"
        )),
    ),
    (
        Category::Sexual,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/sexual.txt"
        )),
    ),
    (
        Category::Violence,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/violence.txt"
        )),
    ),
    (
        Category::ViolenceGraphic,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/violence_graphic.txt"
        )),
    ),
];
/// Phrases that count only when a group of people is mentioned.
const GROUP_DIRECTED_LISTS: [(Category, &str); 2] = [
    (
        Category::Hate,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/hate_group.txt"
        )),
    ),
    (
        Category::HateThreatening,
        include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/assets/lexicon/hate_threatening_group.txt"
        )),
    ),
];
const GROUPS_LIST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/lexicon/groups.txt"
));
const MINORS_LIST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/lexicon/minors.txt"
));
const ALLOW_LIST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/lexicon/allow.txt"
));
const NOT_ELONGATED_LIST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/assets/lexicon/not_elongated.txt"
));

/// Every word of the category lists' terms, as written there (lower case):
/// the words worth disguising, which the normaliser restores from masked
/// spellings such as `m*rder` or `f#ck`.
pub(crate) fn category_list_words() -> impl Iterator<Item = &'static str> {
    CATEGORY_LISTS
        .iter()
        .chain(GROUP_DIRECTED_LISTS.iter())
        .flat_map(|(_, text)| text.lines())
        .filter_map(parse_line)
        .flat_map(|(term, _)| term.split_whitespace())
}

/// Weight of a lexicon line that gives none.
const DEFAULT_WEIGHT: f32 = 0.5;

/// What a lexicon entry signals.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Signal {
    Category(Category),
    /// Counts towards the category only when a group is mentioned too
    /// (`should be exterminated` is about termites until it is about people).
    GroupDirected(Category),
    /// A mention of a group of people (protected characteristic).
    Group,
    Minor,
    Allow,
}

#[derive(Clone, Debug)]
struct Entry {
    signal: Signal,
    weight: f32,
    /// The term, normalised, for explanations.
    term: String,
}

/// One lexicon hit in a text.
#[derive(Clone, Debug, PartialEq)]
pub struct LexicalMatch {
    /// The lexicon term that matched, normalised.
    pub term: String,
    /// The category the term counts towards; `None` for the group and minor
    /// signals, which are not categories of their own.
    pub category: Option<Category>,
    /// `category`, `group-directed` (counts only with a group mention),
    /// `group` or `minor`.
    pub kind: &'static str,
    pub weight: f32,
    /// Token positions `[start, end)` in `normalize::tokens(normalized)`.
    pub tokens: (usize, usize),
}

/// A fast non-cryptographic hasher (the FxHash mix). Safe here although it
/// is not collision-resistant: client text only ever *looks up* keys, and
/// the stored keys are our own lists, so crafted input cannot build long
/// collision chains.
#[derive(Default, Clone, Copy)]
struct FxHasher {
    hash: u64,
}

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
type FastSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// Token-level phrase matcher: a trie over token ids, so a text costs one
/// hash lookup per token plus a walk only where a phrase could start.
pub struct LexicalClassifier {
    vocab: FastMap<String, u32>,
    /// (node, token id) → child node; node 0 is the root.
    edges: FastMap<(u32, u32), u32>,
    /// Entries ending at each node.
    ends: Vec<Vec<u32>>,
    entries: Vec<Entry>,
    /// Real words never read as elongations (`assess` is not `asses`).
    not_elongated: FastSet<String>,
    /// While building: (signal, normalised term) → entry, so that spellings
    /// that normalise alike (`retarded`, `r3t@rded`) are one piece of evidence.
    by_form: HashMap<(SignalKey, String), u32>,
}

/// [`Signal`] as a hashable key.
type SignalKey = (u8, usize);

fn signal_key(signal: Signal) -> SignalKey {
    match signal {
        Signal::Category(c) => (0, c.index()),
        Signal::GroupDirected(c) => (1, c.index()),
        Signal::Group => (2, 0),
        Signal::Minor => (3, 0),
        Signal::Allow => (4, 0),
    }
}

impl Default for LexicalClassifier {
    fn default() -> Self {
        Self::new()
    }
}

impl LexicalClassifier {
    /// Builds the matcher from the compiled-in lists (a few milliseconds;
    /// build once and share).
    pub fn new() -> LexicalClassifier {
        let mut lc = LexicalClassifier {
            vocab: FastMap::default(),
            edges: FastMap::default(),
            ends: vec![Vec::new()],
            entries: Vec::new(),
            not_elongated: NOT_ELONGATED_LIST
                .lines()
                .filter_map(parse_line)
                .map(|(word, _)| normalize(word))
                .collect(),
            by_form: HashMap::new(),
        };
        for (category, text) in CATEGORY_LISTS {
            lc.add_list(text, Signal::Category(category));
        }
        for (category, text) in GROUP_DIRECTED_LISTS {
            lc.add_list(text, Signal::GroupDirected(category));
        }
        lc.add_list(GROUPS_LIST, Signal::Group);
        lc.add_list(MINORS_LIST, Signal::Minor);
        lc.add_list(ALLOW_LIST, Signal::Allow);
        lc.by_form = HashMap::new();
        lc
    }

    pub fn model_id(&self) -> String {
        "lexical-1".to_string()
    }

    /// Thresholds for lexical scores alone. A score is 1 − Π(1 − w) over
    /// distinct matched terms, so a threshold says how much evidence is
    /// enough; the weights in the lists are set against these values.
    pub fn default_thresholds(&self) -> Thresholds {
        let mut t = Thresholds::uniform(0.55);
        // One mild insult (0.3–0.5) should not flag; a strong insult (≥ 0.6),
        // an insulting phrase aimed at "you", or two mild insults should.
        t.set(Category::Harassment, 0.55);
        // Threat phrases are explicit ("i will kill you" 0.9); the bare
        // "kill you" (0.6) flags too, since it rarely appears harmlessly.
        t.set(Category::HarassmentThreatening, 0.55);
        // Slurs are 0.6–0.95; reclaimed or ambiguous words are below 0.55.
        t.set(Category::Hate, 0.55);
        // Composed from hate × threat or explicit calls for violence.
        t.set(Category::HateThreatening, 0.55);
        // A bare "suicide" (0.5, news, prevention) must not flag;
        // first-person phrases ("kill myself" 0.85) must.
        t.set(Category::SelfHarm, 0.55);
        t.set(Category::SelfHarmIntent, 0.6);
        t.set(Category::SelfHarmInstructions, 0.6);
        // Anatomy words with ordinary uses are ≤ 0.45; explicit terms ≥ 0.6.
        t.set(Category::Sexual, 0.55);
        // min(sexual, minor) with both clearly present. Lower than sexual
        // because a miss costs far more here than a false alarm.
        t.set(Category::SexualMinors, 0.5);
        // Single verbs ("kill" 0.3) never flag; a human object does.
        t.set(Category::Violence, 0.55);
        t.set(Category::ViolenceGraphic, 0.6);
        t
    }

    /// Scores of a text already passed through [`normalize::normalize`].
    /// Exposed as model features; `score_batch` is `features(&normalize(t))`.
    pub fn features(&self, normalized: &str) -> CategoryScores {
        let toks: Vec<&str> = tokens(normalized).collect();
        let hits = self.find(&toks);
        scores_from_hits(&self.entries, &hits, age_minor_signal(&toks))
    }

    /// The minor signal of a normalised text, in [0, 1] (ages under 18 and
    /// words about children). Not a category; exposed for the model.
    pub fn minor_signal(&self, normalized: &str) -> f32 {
        self.features_and_minor_signal(normalized).1
    }

    /// [`LexicalClassifier::features`] and [`LexicalClassifier::minor_signal`]
    /// from one pass over the text.
    pub fn features_and_minor_signal(&self, normalized: &str) -> (CategoryScores, f32) {
        let toks: Vec<&str> = tokens(normalized).collect();
        let hits = self.find(&toks);
        let age = age_minor_signal(&toks);
        let minor = minor_words_score(&self.entries, &hits).max(age);
        (scores_from_hits(&self.entries, &hits, age), minor)
    }

    /// The terms that matched a normalised text, allow phrases applied.
    pub fn explain(&self, normalized: &str) -> Vec<LexicalMatch> {
        let toks: Vec<&str> = tokens(normalized).collect();
        self.find(&toks)
            .into_iter()
            .map(|h| {
                let e = &self.entries[h.entry as usize];
                LexicalMatch {
                    term: e.term.clone(),
                    category: match e.signal {
                        Signal::Category(c) | Signal::GroupDirected(c) => Some(c),
                        _ => None,
                    },
                    kind: match e.signal {
                        Signal::Category(_) => "category",
                        Signal::GroupDirected(_) => "group-directed",
                        Signal::Group => "group",
                        Signal::Minor | Signal::Allow => "minor",
                    },
                    weight: e.weight,
                    tokens: (h.start, h.end),
                }
            })
            .collect()
    }

    // -- building ------------------------------------------------------------

    fn add_list(&mut self, text: &str, signal: Signal) {
        for line in text.lines() {
            if let Some((term, weight)) = parse_line(line) {
                self.add_term(term, weight, signal);
            }
        }
    }

    fn add_term(&mut self, term: &str, weight: f32, signal: Signal) {
        let forms = term_forms(term);
        let key = (signal_key(signal), forms[0].clone());
        if let Some(&existing) = self.by_form.get(&key) {
            let e = &mut self.entries[existing as usize];
            e.weight = e.weight.max(weight);
            return;
        }
        let entry = self.entries.len() as u32;
        self.by_form.insert(key, entry);
        self.entries.push(Entry {
            signal,
            weight,
            term: term.to_string(),
        });
        for form in forms {
            let toks: Vec<&str> = tokens(&form).collect();
            if toks.is_empty() || toks.len() > MAX_PHRASE_TOKENS || is_unsafe_single(&toks) {
                continue;
            }
            self.insert(&toks, entry);
            if toks.len() == 1 {
                if let Some(plural) = plural(toks[0]) {
                    self.insert(&[plural.as_str()], entry);
                }
            } else {
                let joined: String = toks.concat();
                if joined.chars().count() >= MIN_JOINED_PHRASE_LEN {
                    self.insert(&[joined.as_str()], entry);
                }
            }
        }
    }

    fn insert(&mut self, toks: &[&str], entry: u32) {
        let mut node = 0u32;
        for tok in toks {
            let id = self.intern(tok);
            node = match self.edges.get(&(node, id)) {
                Some(&child) => child,
                None => {
                    let child = self.ends.len() as u32;
                    self.ends.push(Vec::new());
                    self.edges.insert((node, id), child);
                    child
                }
            };
        }
        let ends = &mut self.ends[node as usize];
        if !ends.contains(&entry) {
            ends.push(entry);
        }
    }

    fn intern(&mut self, tok: &str) -> u32 {
        if let Some(&id) = self.vocab.get(tok) {
            return id;
        }
        let id = self.vocab.len() as u32;
        self.vocab.insert(tok.to_string(), id);
        id
    }

    // -- matching ------------------------------------------------------------

    /// Ids a text token may stand for: itself if known, else the known
    /// spellings among its doubled-letter variants (`kiill` → `kill`).
    fn candidates(&self, tok: &str, buf: &mut String, out: &mut Vec<u32>) {
        out.clear();
        if let Some(&id) = self.vocab.get(tok) {
            out.push(id);
            return;
        }
        if self.not_elongated.contains(tok) {
            return;
        }
        normalize::for_each_dedouble_variant(tok, MAX_DEDOUBLE_RUNS, buf, |v| {
            if let Some(&id) = self.vocab.get(v) {
                if !out.contains(&id) {
                    out.push(id);
                }
            }
        });
    }

    /// All entry hits, minus category and minor hits inside an allow phrase.
    fn find(&self, toks: &[&str]) -> Vec<Hit> {
        // Candidate ids of every token, flattened: ids[bounds[i]..bounds[i + 1]].
        let mut buf = String::new();
        let mut scratch = Vec::new();
        let mut ids: Vec<u32> = Vec::new();
        let mut bounds: Vec<usize> = Vec::with_capacity(toks.len() + 1);
        bounds.push(0);
        for tok in toks {
            self.candidates(tok, &mut buf, &mut scratch);
            ids.extend_from_slice(&scratch);
            bounds.push(ids.len());
        }
        let cands = |i: usize| &ids[bounds[i]..bounds[i + 1]];

        let mut hits = Vec::new();
        let mut active: Vec<u32> = Vec::new();
        let mut next: Vec<u32> = Vec::new();
        for start in 0..toks.len() {
            if cands(start).is_empty() {
                continue;
            }
            active.clear();
            active.push(0);
            for end in start..toks.len().min(start + MAX_PHRASE_TOKENS) {
                next.clear();
                for &node in &active {
                    for &id in cands(end) {
                        if let Some(&child) = self.edges.get(&(node, id)) {
                            if !next.contains(&child) {
                                next.push(child);
                            }
                        }
                    }
                }
                if next.is_empty() {
                    break;
                }
                for &node in &next {
                    for &entry in &self.ends[node as usize] {
                        hits.push(Hit {
                            start,
                            end: end + 1,
                            entry,
                        });
                    }
                }
                std::mem::swap(&mut active, &mut next);
            }
        }
        self.apply_allow(hits)
    }

    /// Drops hits lying inside an allow phrase. Linear: hits and allow spans
    /// both come in order of their start, so one sweep keeps the furthest end
    /// of the allow spans started so far (a text made of nothing but allow
    /// phrases must not cost hits × spans).
    fn apply_allow(&self, hits: Vec<Hit>) -> Vec<Hit> {
        let is_allow = |h: &Hit| self.entries[h.entry as usize].signal == Signal::Allow;
        let allowed: Vec<(usize, usize)> = hits
            .iter()
            .filter(|h| is_allow(h))
            .map(|h| (h.start, h.end))
            .collect();
        let mut next_span = 0;
        let mut covered_until = 0;
        hits.into_iter()
            .filter(|h| !is_allow(h))
            .filter(|h| {
                while let Some(&(start, end)) = allowed.get(next_span) {
                    if start > h.start {
                        break;
                    }
                    covered_until = covered_until.max(end);
                    next_span += 1;
                }
                h.end > covered_until
            })
            .collect()
    }
}

impl TextClassifier for LexicalClassifier {
    fn model_id(&self) -> String {
        LexicalClassifier::model_id(self)
    }

    fn score_batch(&self, texts: &[&str]) -> anyhow::Result<Vec<CategoryScores>> {
        Ok(texts.iter().map(|t| self.features(&normalize(t))).collect())
    }

    /// The scores are the terms': each matched term is its own evidence.
    fn score_items_explained(
        &self,
        items: &[&str],
        deadline: &Deadline,
    ) -> anyhow::Result<ExplainedScores> {
        let (scores, combined) = self.score_items(items, deadline)?;
        let combined_evidence = if items.len() > 1 {
            super::evidence::combined_lexicon_evidence(self, items, deadline)?
        } else {
            Vec::new()
        };
        Ok(ExplainedScores {
            items: scores,
            combined,
            evidence: TextEvidence {
                items: items
                    .iter()
                    .map(|t| super::evidence::lexicon_evidence(self, t, deadline))
                    .collect::<Result<_, _>>()?,
                combined: combined_evidence,
                fallback: Source::Lexicon,
            },
        })
    }

    fn default_thresholds(&self) -> Thresholds {
        LexicalClassifier::default_thresholds(self)
    }
}

#[derive(Clone, Copy, Debug)]
struct Hit {
    start: usize,
    end: usize,
    entry: u32,
}

/// `term<TAB>weight`, `#` comments and blank lines skipped; a missing or
/// unreadable weight falls back to [`DEFAULT_WEIGHT`].
fn parse_line(line: &str) -> Option<(&str, f32)> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (term, weight) = match line.rsplit_once('\t') {
        Some((term, w)) => (
            term.trim(),
            w.trim().parse::<f32>().unwrap_or(DEFAULT_WEIGHT),
        ),
        None => (line, DEFAULT_WEIGHT),
    };
    let weight = if weight.is_finite() {
        weight.clamp(0.0, 1.0)
    } else {
        DEFAULT_WEIGHT
    };
    (!term.is_empty()).then_some((term, weight))
}

/// The spellings a lexicon line is matched under: normalised as written,
/// and without apostrophes (`you're` is often written `youre`; `i'll` as `ill`).
fn term_forms(term: &str) -> Vec<String> {
    let mut forms = vec![normalize(term)];
    if term.contains('\'') {
        forms.push(normalize(&term.replace('\'', "")));
    }
    forms.dedup();
    forms
}

/// A one-token term of one or two characters would match far too much text
/// (a variant like `sh!+` normalises to `sh`).
fn is_unsafe_single(toks: &[&str]) -> bool {
    toks.len() == 1 && toks[0].chars().count() < 3
}

/// Regular plural of a single alphabetic word, so lists need not spell both.
fn plural(word: &str) -> Option<String> {
    if word.chars().count() < 3 || !word.chars().all(char::is_alphabetic) || word.ends_with('s') {
        return None;
    }
    let es = ["x", "z", "ch", "sh"].iter().any(|s| word.ends_with(s));
    Some(format!("{word}{}", if es { "es" } else { "s" }))
}

/// 1 − Π(1 − w): independent pieces of evidence, each able to flag alone.
fn combine(weights: impl Iterator<Item = f32>) -> f32 {
    let miss: f32 = weights.map(|w| 1.0 - w.clamp(0.0, 1.0)).product();
    (1.0 - miss).clamp(0.0, MAX_SCORE)
}

/// sexual/minors from its two ingredients: both must be present, so it is
/// the weaker of the two. Never a term list of its own.
pub fn compose_sexual_minors(sexual: f32, minor_signal: f32) -> f32 {
    sexual.min(minor_signal).clamp(0.0, 1.0)
}

/// Raw score of every category from its own list, in one pass over the
/// hits: overlapping hits of a category (`kill you` inside `i will kill you`,
/// `have sex` and `sex with`) are one piece of evidence worth their strongest
/// weight; a term repeated elsewhere adds nothing; distinct pieces combine
/// by [`combine`].
fn raw_category_scores(
    entries: &[Entry],
    hits: &[Hit],
    category_of: impl Fn(Signal) -> Option<Category>,
) -> [f32; NUM_CATEGORIES] {
    // (category, start, end, entry), sorted so each category's hits are
    // contiguous and in text order.
    let mut mine: Vec<(usize, usize, usize, u32)> = hits
        .iter()
        .filter_map(|h| {
            let c = category_of(entries[h.entry as usize].signal)?;
            Some((c.index(), h.start, h.end, h.entry))
        })
        .collect();
    mine.sort_unstable();
    let mut out = [0.0; NUM_CATEGORIES];
    let mut best: Vec<u32> = Vec::new();
    for group in mine.chunk_by(|a, b| a.0 == b.0) {
        best.clear();
        let mut cluster_end = 0;
        for &(_, start, end, entry) in group {
            match best.last_mut() {
                Some(top) if start < cluster_end => {
                    cluster_end = cluster_end.max(end);
                    if entries[entry as usize].weight > entries[*top as usize].weight {
                        *top = entry;
                    }
                }
                _ => {
                    cluster_end = end;
                    best.push(entry);
                }
            }
        }
        best.sort_unstable();
        best.dedup();
        out[group[0].0] = combine(best.iter().map(|&e| entries[e as usize].weight));
    }
    out
}

/// The strongest single hit of a signal. Used for the minor and group
/// signals: several weak words (`boy or girl`) must not add up to a child.
fn strongest(entries: &[Entry], hits: &[Hit], signal: Signal) -> f32 {
    hits.iter()
        .map(|h| &entries[h.entry as usize])
        .filter(|e| e.signal == signal)
        .map(|e| e.weight)
        .fold(0.0, f32::max)
}

fn minor_words_score(entries: &[Entry], hits: &[Hit]) -> f32 {
    strongest(entries, hits, Signal::Minor)
}

fn scores_from_hits(entries: &[Entry], hits: &[Hit], age_signal: f32) -> CategoryScores {
    let own = raw_category_scores(entries, hits, |s| match s {
        Signal::Category(c) => Some(c),
        _ => None,
    });
    let directed = raw_category_scores(entries, hits, |s| match s {
        Signal::GroupDirected(c) => Some(c),
        _ => None,
    });
    let group = strongest(entries, hits, Signal::Group);
    let raw = |c: Category| own[c.index()].max(directed[c.index()].min(group));
    let minor = minor_words_score(entries, hits).max(age_signal);

    let threat = raw(Category::HarassmentThreatening);
    let hate = raw(Category::Hate).max(raw(Category::HateThreatening));
    let violence = raw(Category::Violence).max(raw(Category::ViolenceGraphic));
    let sexual = raw(Category::Sexual);

    let mut s = CategoryScores::default();
    // Subcategories imply their parent.
    s.set(Category::Harassment, raw(Category::Harassment).max(threat));
    s.set(Category::HarassmentThreatening, threat);
    s.set(Category::Hate, hate);
    // A slur together with a threat is a threat against a group.
    s.set(
        Category::HateThreatening,
        raw(Category::HateThreatening).max(hate.min(threat.max(raw(Category::Violence)))),
    );
    s.set(
        Category::SelfHarm,
        raw(Category::SelfHarm)
            .max(raw(Category::SelfHarmIntent))
            .max(raw(Category::SelfHarmInstructions)),
    );
    s.set(Category::SelfHarmIntent, raw(Category::SelfHarmIntent));
    s.set(
        Category::SelfHarmInstructions,
        raw(Category::SelfHarmInstructions),
    );
    s.set(Category::Sexual, sexual);
    s.set(Category::SexualMinors, compose_sexual_minors(sexual, minor));
    s.set(Category::Violence, violence);
    s.set(Category::ViolenceGraphic, raw(Category::ViolenceGraphic));
    s
}

const NUMBER_WORDS: [&str; 17] = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
];

/// An age under 18 written as `12 year old`, `12-year-old`, `12 yo`, `12yo`,
/// `12 yrs old`, `twelve year old`, `aged 12`: [`AGE_MINOR_WEIGHT`], else 0.
fn age_minor_signal(toks: &[&str]) -> f32 {
    let found = (0..toks.len()).any(|i| {
        let rest = &toks[i + 1..];
        if let Some((age, suffix)) = split_age(toks[i]) {
            if !(1..18).contains(&age) {
                return false;
            }
            if suffix.is_empty() {
                return is_age_suffix(rest)
                    || i.checked_sub(1)
                        .is_some_and(|p| matches!(toks[p], "age" | "aged"));
            }
            return matches!(suffix, "yo" | "yos")
                || (is_year_word(suffix) && rest.first() == Some(&"old"));
        }
        false
    });
    if found {
        AGE_MINOR_WEIGHT
    } else {
        0.0
    }
}

/// `12` → (12, ""), `12yo` → (12, "yo"), `twelve` → (12, "").
fn split_age(tok: &str) -> Option<(u32, &str)> {
    if let Some(pos) = NUMBER_WORDS.iter().position(|w| *w == tok) {
        return Some((pos as u32 + 1, ""));
    }
    let digits = tok.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 || digits > 3 {
        return None;
    }
    let age = tok[..digits].parse().ok()?;
    Some((age, &tok[digits..]))
}

fn is_year_word(w: &str) -> bool {
    matches!(w, "year" | "years" | "yr" | "yrs")
}

/// What may follow a bare number to make it an age.
fn is_age_suffix(rest: &[&str]) -> bool {
    match rest {
        ["yo", ..] => true,
        ["y", "o", ..] => true,
        [w, "old", ..] if is_year_word(w) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lc() -> &'static LexicalClassifier {
        static LC: std::sync::OnceLock<LexicalClassifier> = std::sync::OnceLock::new();
        LC.get_or_init(LexicalClassifier::new)
    }

    fn score(text: &str) -> CategoryScores {
        lc().features(&normalize(text))
    }

    fn flagged(text: &str) -> Vec<Category> {
        let decided = lc().default_thresholds().decide(&score(text));
        Category::ALL
            .into_iter()
            .filter(|c| decided[c.index()])
            .collect()
    }

    fn assert_flags(text: &str, category: Category) {
        let s = score(text);
        assert!(
            flagged(text).contains(&category),
            "{text:?} should flag {category}: {} (matches {:?})",
            s.get(category),
            lc().explain(&normalize(text))
        );
    }

    fn assert_clean(text: &str) {
        let f = flagged(text);
        assert!(
            f.is_empty(),
            "{text:?} flagged {f:?} (matches {:?})",
            lc().explain(&normalize(text))
        );
    }

    #[test]
    fn lists_load_with_many_terms_per_category() {
        let lc = lc();
        for (category, _) in CATEGORY_LISTS {
            let n = lc
                .entries
                .iter()
                .filter(|e| {
                    e.signal == Signal::Category(category)
                        || e.signal == Signal::GroupDirected(category)
                })
                .count();
            assert!(n >= 15, "{category} has only {n} terms");
        }
        assert!(lc.entries.iter().any(|e| e.signal == Signal::Minor));
        assert!(lc.entries.iter().any(|e| e.signal == Signal::Group));
        assert!(lc.entries.iter().any(|e| e.signal == Signal::Allow));
        for e in &lc.entries {
            assert!((0.0..=1.0).contains(&e.weight), "{e:?}");
        }
    }

    #[test]
    fn plain_threats_and_self_harm_are_flagged() {
        assert_flags("I will kill you", Category::HarassmentThreatening);
        assert_flags("I will kill you", Category::Harassment);
        assert_flags(
            "you're dead, watch your back",
            Category::HarassmentThreatening,
        );
        assert_flags("i want to die", Category::SelfHarmIntent);
        assert_flags("i want to die", Category::SelfHarm);
        assert_flags("I'm going to kill myself tonight", Category::SelfHarmIntent);
        assert_flags(
            "how many pills would it take",
            Category::SelfHarmInstructions,
        );
        assert_flags("kill yourself", Category::Harassment);
        assert_flags("you are a worthless piece of shit", Category::Harassment);
        assert_flags(
            "the floor was a pool of blood and entrails",
            Category::ViolenceGraphic,
        );
        assert_flags(
            "the floor was a pool of blood and entrails",
            Category::Violence,
        );
    }

    #[test]
    fn evasions_score_like_the_plain_text() {
        let plain = score("i will kill you").get(Category::HarassmentThreatening);
        for evasion in [
            "i will kіll you",                 // Cyrillic і
            "i will k\u{200B}i\u{200B}ll you", // zero-width spaces
            "i will k i l l you",
            "i will k-i-l-l you",
            "i will k_i_l_l you",
            "i will k1ll you",
            "i will kiiill you",
            "i will kiiiiilllll you",
            "I WILL KILL YOU",
            "ｉ ｗｉｌｌ ｋｉｌｌ ｙｏｕ",
            "i will kíll yóu",
        ] {
            let s = score(evasion).get(Category::HarassmentThreatening);
            assert_eq!(s, plain, "{evasion:?}: {s} vs {plain}");
        }
        assert_flags(
            "s.u.i.c.i.d.e is my only way out, i want to d.i.e",
            Category::SelfHarmIntent,
        );
        assert_flags("#killyourself", Category::Harassment);
        // Chat spellings.
        assert_flags("ur dead", Category::HarassmentThreatening);
        assert_flags("imma kill u", Category::HarassmentThreatening);
    }

    #[test]
    fn substrings_and_near_words_do_not_match() {
        for text in [
            "The class will assess your skill in the classic assassin game.",
            "Scunthorpe United won; the therapist was at the Essex match.",
            "She passed the assessment; the cocktail had a cockatoo on it.",
            "Grape juice, the skillet, the document and the analyst.",
            "He is a skilled killdeer watcher in Penistone.",
        ] {
            assert_clean(text);
            let m = lc().explain(&normalize(text));
            assert!(m.is_empty(), "{text:?} matched {m:?}");
        }
    }

    #[test]
    fn harmless_idioms_are_allowed() {
        for text in [
            "kill the process and restart the server",
            "this is a killer app",
            "you're killing me, that joke!",
            "she graduated summa cum laude",
            "shoot me an email when you're done",
            "a bath bomb and a photo shoot",
            "we need better suicide prevention in schools",
            "a murder mystery novel",
        ] {
            assert_clean(text);
        }
        // The same words in a threat still count.
        assert_flags(
            "kill the process or i will kill you",
            Category::HarassmentThreatening,
        );
    }

    #[test]
    fn ordinary_sentences_are_clean() {
        for text in [
            "",
            "Hello, how are you today?",
            "The weather in Paris is lovely in the spring.",
            "My son scored two goals at his football match.",
            "The children are playing in the garden.",
            "I am a gay man and proud of it.",
            "Muslims, Jews and Christians met for the interfaith dinner.",
            "Suicide rates fell last year, the report says.",
            "Please remember to save your work before 5pm.",
            "We drove 10 kms to see David Lynch's new film.",
            "I forked the repo and ate chicken nuggets.",
            "I need to assess the soon-to-be-released feed.",
        ] {
            assert_clean(text);
        }
    }

    #[test]
    fn phrases_match_as_token_sequences() {
        let m = lc().explain(&normalize("honestly, you are a dead man."));
        assert!(
            m.iter()
                .any(|x| x.term == "you are a dead man" && x.tokens == (1, 6)),
            "{m:?}"
        );
        // The words of the phrase apart do not make the phrase.
        let m = lc().explain(&normalize("you are a man. he is dead."));
        assert!(!m.iter().any(|x| x.term == "you are a dead man"), "{m:?}");
        // Apostrophe-free spelling of a phrase with an apostrophe.
        assert_flags("youre dead", Category::HarassmentThreatening);
    }

    #[test]
    fn composition_of_sexual_minors_needs_both_signals() {
        assert_eq!(compose_sexual_minors(0.9, 0.0), 0.0);
        assert_eq!(compose_sexual_minors(0.0, 0.95), 0.0);
        assert_eq!(compose_sexual_minors(0.8, 0.9), 0.8);
        assert_eq!(compose_sexual_minors(0.7, 0.4), 0.4);
        assert_eq!(compose_sexual_minors(2.0, 1.5), 1.0);
    }

    #[test]
    fn minor_signal_from_words_and_ages_is_innocuous_alone() {
        let lc = lc();
        for text in [
            "my 12 year old",
            "a 12-year-old",
            "she is 9yo",
            "aged 15",
            "twelve years old",
            "the kids",
        ] {
            assert!(lc.minor_signal(&normalize(text)) >= 0.5, "{text:?}");
            assert_eq!(score(text).get(Category::SexualMinors), 0.0, "{text:?}");
        }
        for text in ["a 35 year old man", "aged 40", "2024", "the adults"] {
            assert_eq!(lc.minor_signal(&normalize(text)), 0.0, "{text:?}");
        }
    }

    fn synthetic(signals: &[(Signal, f32)]) -> CategoryScores {
        let entries: Vec<Entry> = signals
            .iter()
            .map(|&(signal, weight)| Entry {
                signal,
                weight,
                term: String::new(),
            })
            .collect();
        let hits: Vec<Hit> = (0..entries.len())
            .map(|i| Hit {
                start: i,
                end: i + 1,
                entry: i as u32,
            })
            .collect();
        scores_from_hits(&entries, &hits, 0.0)
    }

    #[test]
    fn sexual_minors_is_composed_from_the_scores() {
        // An adult sexual term alone is sexual, never sexual/minors.
        let adult = score("porn");
        assert!(adult.get(Category::Sexual) >= 0.55);
        assert_eq!(adult.get(Category::SexualMinors), 0.0);
        // Synthetic matches: both ingredients present → the weaker of the two.
        let s = synthetic(&[
            (Signal::Category(Category::Sexual), 0.8),
            (Signal::Minor, 0.9),
        ]);
        assert_eq!(
            s.get(Category::SexualMinors),
            compose_sexual_minors(0.8, 0.9)
        );
        assert!((s.get(Category::SexualMinors) - 0.8).abs() < 1e-6);
        let s = synthetic(&[(Signal::Minor, 0.9)]);
        assert_eq!(s.get(Category::SexualMinors), 0.0);
        // The age pattern feeds the same composition.
        let entries = [Entry {
            signal: Signal::Category(Category::Sexual),
            weight: 0.7,
            term: String::new(),
        }];
        let s = scores_from_hits(
            &entries,
            &[Hit {
                start: 0,
                end: 1,
                entry: 0,
            }],
            AGE_MINOR_WEIGHT,
        );
        assert!((s.get(Category::SexualMinors) - 0.7).abs() < 1e-6);
    }

    #[test]
    fn parents_and_hate_threatening_are_composed() {
        let s = synthetic(&[
            (Signal::Category(Category::Hate), 0.9),
            (Signal::Category(Category::HarassmentThreatening), 0.8),
        ]);
        assert!((s.get(Category::HateThreatening) - 0.8).abs() < 1e-6);
        assert!((s.get(Category::Harassment) - 0.8).abs() < 1e-6);
        let s = synthetic(&[(Signal::Category(Category::Hate), 0.9)]);
        assert_eq!(s.get(Category::HateThreatening), 0.0);
        let s = synthetic(&[(Signal::Category(Category::SelfHarmInstructions), 0.7)]);
        assert!((s.get(Category::SelfHarm) - 0.7).abs() < 1e-6);
        let s = synthetic(&[(Signal::Category(Category::ViolenceGraphic), 0.6)]);
        assert!((s.get(Category::Violence) - 0.6).abs() < 1e-6);
        // Two distinct pieces of evidence combine as 1 − (1 − a)(1 − b).
        let s = synthetic(&[
            (Signal::Category(Category::Harassment), 0.5),
            (Signal::Category(Category::Harassment), 0.5),
        ]);
        assert!((s.get(Category::Harassment) - 0.75).abs() < 1e-6);
    }

    #[test]
    fn overlapping_matches_count_once_at_their_strongest() {
        let s = synthetic_spans(&[(0, 4, 0.9), (2, 4, 0.6)]);
        assert!((s - 0.9).abs() < 1e-6, "{s}");
        let s = synthetic_spans(&[(0, 2, 0.5), (1, 3, 0.5)]);
        assert!((s - 0.5).abs() < 1e-6, "{s}");
        let s = synthetic_spans(&[(0, 2, 0.5), (2, 4, 0.5)]);
        assert!((s - 0.75).abs() < 1e-6, "{s}");
        // Real lists: the threat phrase and the `kill you` inside it.
        let t = score("i will kill you").get(Category::HarassmentThreatening);
        let phrase = lc()
            .entries
            .iter()
            .find(|e| e.term == "i will kill you")
            .map(|e| e.weight);
        assert_eq!(Some(t), phrase);
    }

    fn synthetic_spans(spans: &[(usize, usize, f32)]) -> f32 {
        let entries: Vec<Entry> = spans
            .iter()
            .map(|&(_, _, weight)| Entry {
                signal: Signal::Category(Category::Violence),
                weight,
                term: String::new(),
            })
            .collect();
        let hits: Vec<Hit> = spans
            .iter()
            .enumerate()
            .map(|(i, &(start, end, _))| Hit {
                start,
                end,
                entry: i as u32,
            })
            .collect();
        raw_category_scores(&entries, &hits, |s| match s {
            Signal::Category(c) => Some(c),
            _ => None,
        })[Category::Violence.index()]
    }

    #[test]
    fn spellings_that_normalise_alike_are_one_entry() {
        let n = lc()
            .entries
            .iter()
            .filter(|e| {
                e.signal == Signal::Category(Category::Harassment)
                    && normalize(&e.term) == "retarded"
            })
            .count();
        assert_eq!(n, 1);
    }

    #[test]
    fn weak_minor_words_do_not_add_up() {
        let lc = lc();
        let one = lc.minor_signal(&normalize("boy"));
        let both = lc.minor_signal(&normalize("boy or girl"));
        assert!(one > 0.0);
        assert_eq!(both, one.max(lc.minor_signal(&normalize("girl"))));
    }

    #[test]
    fn group_directed_phrases_need_a_group() {
        assert_clean("termites should be exterminated");
        assert_clean("rats are vermin and spread disease");
        assert_flags(
            "all the immigrants should be exterminated",
            Category::HateThreatening,
        );
        assert_flags("all the immigrants should be exterminated", Category::Hate);
        assert_flags("immigrants are vermin", Category::Hate);
        // A group mentioned without a directed phrase is not hate.
        assert_clean("immigrants opened three new shops on our street");
        // Synthetic: the composition is the weaker of group and phrase.
        let s = synthetic(&[
            (Signal::GroupDirected(Category::HateThreatening), 0.9),
            (Signal::Group, 0.7),
        ]);
        assert!((s.get(Category::HateThreatening) - 0.7).abs() < 1e-6);
        let s = synthetic(&[(Signal::GroupDirected(Category::HateThreatening), 0.9)]);
        assert_eq!(s.get(Category::HateThreatening), 0.0);
    }

    #[test]
    fn dehumanising_phrases_are_hate() {
        assert_flags("they are subhuman", Category::Hate);
        assert_clean("the film is about human rights");
    }

    #[test]
    fn scores_are_in_range_and_one_per_input() {
        let inputs = [
            "",
            "fuck you you fucking bitch i will kill you and your family, you worthless piece of shit",
            "hello",
            "kill kill kill kill kill kill kill",
        ];
        let out = TextClassifier::score_batch(lc(), &inputs).unwrap();
        assert_eq!(out.len(), inputs.len());
        for s in &out {
            for (_, v) in s.iter() {
                assert!((0.0..=1.0).contains(&v));
            }
        }
        assert_eq!(out[0], CategoryScores::default());
        // Repeating a term adds nothing: distinct matches only; spellings
        // that normalise alike are one entry.
        assert_eq!(
            out[3].get(Category::Violence),
            score("kill").get(Category::Violence)
        );
    }

    #[test]
    fn huge_input_is_handled() {
        let mut text = "the quick brown fox jumps over the lazy dog ".repeat(25_000);
        text.push_str("i will kill you");
        assert!(text.len() > 1_000_000);
        let out = TextClassifier::score_batch(lc(), &[&text]).unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].get(Category::HarassmentThreatening) >= 0.55);
        // Nothing but allow phrases: must stay linear, and stay clean.
        let allowed = "kill the process ".repeat(70_000);
        let out = TextClassifier::score_batch(lc(), &[&allowed]).unwrap();
        assert_eq!(out[0], CategoryScores::default());
        let spam = "k i l l ".repeat(150_000);
        assert_eq!(
            TextClassifier::score_batch(lc(), &[&spam]).unwrap().len(),
            1
        );
    }

    #[test]
    fn parse_line_reads_weights_and_skips_comments() {
        assert_eq!(
            parse_line("kill yourself\t0.9"),
            Some(("kill yourself", 0.9))
        );
        assert_eq!(parse_line("# comment"), None);
        assert_eq!(parse_line("   "), None);
        assert_eq!(parse_line("phrase"), Some(("phrase", DEFAULT_WEIGHT)));
        assert_eq!(parse_line("x\t7"), Some(("x", 1.0)));
        assert_eq!(parse_line("x\tnan"), Some(("x", DEFAULT_WEIGHT)));
    }

    /// SHA-256 over every term list compiled into `lexical-1`.
    const LISTS_OF_LEXICAL_1: &str =
        "be8b67af2baaba110de6df463783fd90a11e7a1d1ee95c43488fdbcad05ccb8f";

    fn term_lists_digest() -> String {
        use sha2::{Digest, Sha256};
        let mut hasher = Sha256::new();
        let lists = CATEGORY_LISTS
            .iter()
            .chain(GROUP_DIRECTED_LISTS.iter())
            .map(|(_, text)| *text)
            .chain([GROUPS_LIST, MINORS_LIST, ALLOW_LIST, NOT_ELONGATED_LIST]);
        for list in lists {
            hasher.update((list.len() as u64).to_le_bytes());
            hasher.update(list.as_bytes());
        }
        hex::encode(hasher.finalize())
    }

    /// Responses name the lexicon by `model_id`, so clients that cache
    /// verdicts by model see a change of the lists only if the id changes.
    #[test]
    fn the_model_id_changes_with_the_term_lists() {
        assert_eq!(
            (lc().model_id().as_str(), term_lists_digest().as_str()),
            ("lexical-1", LISTS_OF_LEXICAL_1),
            "the term lists changed: name the new lexicon lexical-2 in model_id \
             (and assets/lexicon/README.md) and record its digest here"
        );
    }
}
