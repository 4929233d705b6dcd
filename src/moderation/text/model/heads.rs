//! The per-category heads: calibrated logistic regressions on the sentence
//! embedding and the lexical layer's features, trained by
//! `train/train_heads.py` and shipped as `assets/text-model/heads.json`.
//! A head may also carry one hidden layer ([`HiddenLayer`]) whose output is
//! added to its logit: the self-harm head has one, because first-person
//! accounts of self-harm are not linearly apart from talk about it in the
//! embedding (eval/ABLATION-real.md, the hidden-layer entry).
//!
//! `sexual/minors` has no head of its own (it is never learnt from examples):
//! it is the smaller of the `sexual` score and the score of the `minor` head,
//! which recognises text about children and young teenagers.

use std::collections::HashMap;
use std::num::NonZeroUsize;

use serde::Deserialize;

use super::e5::{E5Weights, E5_DIM};
use super::encoder::{WindowConfig, EMBEDDING_DIM};
use super::TextModelError;
use crate::moderation::category::{Category, CategoryScores, Thresholds, NUM_CATEGORIES};
use crate::moderation::text::lexical::LexicalClassifier;
use crate::moderation::text::ngrams::{NgramModel, NGRAM_HEADS};
use crate::moderation::text::normalize::normalize;

/// Features of the term lists: the lexical layer's score of every category,
/// then its minor signal.
const TERM_LIST_FEATURES: usize = NUM_CATEGORIES + 1;
/// How many lexical features a head reads: the term lists' features, then
/// the n-gram model's logits (times [`NGRAM_FEATURE_SCALE`]). Heads of
/// before the n-gram model have [`TERM_LIST_FEATURES`] weights; the rest are
/// 0. So are the n-gram weights of the heads that must not lean on the
/// words (the threat and self-harm children, the minor signal:
/// `NGRAM_HEADS` in `train/train_heads.py` says why).
pub const LEXICAL_FEATURES: usize = TERM_LIST_FEATURES + NGRAM_HEADS;
/// The n-gram logits enter the heads scaled down, to the order of the term
/// lists' scores (0..1), so one regularisation strength suits both
/// (`train/train_ngrams.py` writes the same factor into what it trains on).
pub const NGRAM_FEATURE_SCALE: f32 = 0.25;

/// The lexical layer's view of a whole text, read by every window's heads:
/// term lists catch spellings and slurs that the encoder's vocabulary
/// blurs, and the embedding supplies the context the term lists lack.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LexicalFeatures([f32; LEXICAL_FEATURES]);

impl LexicalFeatures {
    /// The features of `text` as received (both layers read it normalised).
    pub fn of(lexical: &LexicalClassifier, ngrams: &NgramModel, text: &str) -> LexicalFeatures {
        let normalized = normalize(text);
        let (scores, minor) = lexical.features_and_minor_signal(&normalized);
        let mut values = [0.0; LEXICAL_FEATURES];
        for c in Category::ALL {
            values[c.index()] = scores.get(c);
        }
        values[NUM_CATEGORIES] = minor;
        for (v, z) in values[TERM_LIST_FEATURES..]
            .iter_mut()
            .zip(ngrams.logits(&normalized))
        {
            *v = NGRAM_FEATURE_SCALE * z;
        }
        LexicalFeatures(values)
    }

    pub fn values(&self) -> &[f32; LEXICAL_FEATURES] {
        &self.0
    }
}

/// Name of the head that detects a minor being mentioned.
const MINOR_HEAD: &str = "minor";

#[derive(Deserialize)]
struct HeadsFile {
    version: String,
    input: InputKind,
    window: WindowSpec,
    heads: HashMap<String, HeadSpec>,
    thresholds: HashMap<String, f32>,
    #[serde(default)]
    parents: Vec<(String, String)>,
    /// The sha256 of the encoder adapter the heads were trained on; absent
    /// for heads trained on the base encoder.
    #[serde(default)]
    encoder_adapter: Option<String>,
    /// The sha256 of the n-gram model whose logits the heads read; absent
    /// for heads of before it.
    #[serde(default)]
    ngram_model: Option<String>,
    /// The second encoder's heads; absent in heads that read MiniLM alone.
    #[serde(default)]
    e5: Option<E5Spec>,
}

#[derive(Deserialize)]
struct E5Spec {
    gate: f32,
    weight: f32,
    pool: WindowPool,
    /// Per category, the first-stage score from which the mix may raise but
    /// not lower it; categories not named may always be lowered.
    keep: HashMap<String, f32>,
    /// How many of e5's layers the heads read (the output of the last of
    /// them, mean-pooled); absent: all of them.
    #[serde(default)]
    layers: Option<NonZeroUsize>,
    /// The e5 weights the heads were fitted on; absent: the pinned file.
    #[serde(default)]
    weights: E5Weights,
    /// Framed tokens per scoring window the heads were fitted on; absent:
    /// e5's default (`e5::WINDOW_TOKENS`).
    #[serde(default)]
    window: Option<NonZeroUsize>,
    /// How a text surely in another language than English is scored;
    /// absent: as English is.
    #[serde(default)]
    other_languages: OtherLanguages,
    /// With `other_languages` "alone": the heads that judge a text in
    /// another language (fitted on real text in several languages beside
    /// English rows); absent: `heads`.
    #[serde(default)]
    other_heads: Option<HashMap<String, E5HeadSpec>>,
    heads: HashMap<String, E5HeadSpec>,
}

/// How the second stage scores a text that is surely not English (see
/// [`crate::moderation::text::language`]). The first stage's encoder reads
/// English: on other languages its scores are mostly noise.
#[derive(Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OtherLanguages {
    /// Mixed with the first stage, as English text is.
    #[default]
    Mix,
    /// The e5 heads alone, for the categories they have; the others keep
    /// the first stage's score.
    Alone,
}

/// How the windows of one view of a text speak for it in the second stage.
#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WindowPool {
    /// Their mean logit: the logit of the mean embedding, which is what the
    /// heads are fitted on (one window for a text of up to 126 pieces).
    Mean,
    /// The strongest window.
    Max,
}

#[derive(Deserialize)]
struct E5HeadSpec {
    w: Vec<f32>,
    b: f32,
    /// A hidden layer on e5's embedding added to the logit; absent in
    /// linear heads.
    #[serde(default)]
    hidden: Option<HiddenSpec>,
}

#[derive(Deserialize)]
struct WindowSpec {
    tokens: usize,
    stride: usize,
}

#[derive(Deserialize)]
struct HeadSpec {
    w: Vec<f32>,
    /// Weights of the [`LexicalFeatures`]; absent in heads trained on the
    /// embedding alone.
    #[serde(default)]
    lex: Option<Vec<f32>>,
    b: f32,
    /// A hidden layer added to the logit; absent in linear heads.
    #[serde(default)]
    hidden: Option<HiddenSpec>,
}

#[derive(Deserialize)]
struct HiddenSpec {
    /// One row per unit: in a first-stage head [`EMBEDDING_DIM`] embedding
    /// weights, then [`LEXICAL_FEATURES`] lexical ones; in an e5 head
    /// [`E5_DIM`] (input scaling folded in).
    w: Vec<Vec<f32>>,
    b: Vec<f32>,
    /// The weight of each unit's output in the head's logit (calibration
    /// folded in).
    out: Vec<f32>,
}

/// Which form of the text the heads were trained on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InputKind {
    /// The text as received.
    Raw,
    /// The normalised (de-obfuscated) text.
    Normalized,
    /// Heads trained on raw text, also applied to the normalised text when
    /// normalising changed more than case; the stronger score wins.
    Both,
}

/// One logistic head whose Platt calibration is folded into `w`, `lex`,
/// `b` and, when it has one, its hidden layer's output weights.
struct Head {
    w: Vec<f32>,
    lex: [f32; LEXICAL_FEATURES],
    b: f32,
    hidden: Option<HiddenLayer>,
}

impl Head {
    fn probability(&self, embedding: &[f32], lexical: &LexicalFeatures) -> f32 {
        let mut z = dot(&self.w, embedding) + dot(&self.lex, &lexical.0) + self.b;
        if let Some(hidden) = &self.hidden {
            z += hidden.logit(&[embedding, &lexical.0]);
        }
        sigmoid(z)
    }
}

/// ReLU units on a head's inputs (a first-stage head's: the embedding, then
/// the lexical features; an e5 head's: e5's embedding); their weighted sum
/// is added to the head's logit. Rows are validated to the input width at
/// load.
struct HiddenLayer {
    /// `units x inputs`, row-major.
    w: Vec<f32>,
    inputs: usize,
    b: Vec<f32>,
    out: Vec<f32>,
}

const HIDDEN_INPUTS: usize = EMBEDDING_DIM + LEXICAL_FEATURES;

impl HiddenLayer {
    /// `parts`: the inputs in the order of a row's weights, together as
    /// wide as a row (a shorter part reads fewer weights, never past them).
    fn logit(&self, parts: &[&[f32]]) -> f32 {
        self.w
            .chunks_exact(self.inputs)
            .zip(self.b.iter().zip(&self.out))
            .map(|(row, (b, out))| {
                let mut a = *b;
                let mut rest = row;
                for part in parts {
                    let (on_part, after) = rest.split_at(part.len().min(rest.len()));
                    a += dot(on_part, part);
                    rest = after;
                }
                a.max(0.0) * out
            })
            .sum()
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// What the second encoder (multilingual-e5, see [`super::e5`]) adds:
/// per category a logistic head on its embeddings of the text's windows,
/// pooled per view by `pool`, the strongest view speaking (so that the
/// de-obfuscated `k i l l` is no weaker than the plain word), whose logit
/// is averaged with the first stage's, weighted by `weight`. In the
/// categories where one sentence makes a text harmful whatever surrounds it
/// (a threat, say), a first-stage score at or over the head's `keep` may be
/// raised but not lowered: the first stage reads sentence chunks and finds
/// a threat buried in a long post, which a pooled reading dilutes. It is
/// consulted only for texts whose strongest first-stage score reaches
/// `gate`: most texts people send are plainly harmless, and for them the
/// second encoder (several times the first stage's cost) would change
/// nothing a threshold acts on.
pub struct E5Block {
    gate: f32,
    weight: f32,
    pool: WindowPool,
    layers: Option<NonZeroUsize>,
    weights: E5Weights,
    window: Option<NonZeroUsize>,
    other_languages: OtherLanguages,
    /// Indexed by category; `None` where the second encoder has no head.
    heads: Vec<Option<E5Head>>,
    /// The heads for other languages, indexed likewise (`None`: `heads`).
    other_heads: Option<Vec<Option<E5Head>>>,
}

struct E5Head {
    w: Vec<f32>,
    b: f32,
    hidden: Option<HiddenLayer>,
    /// The first-stage score from which the mix may raise but not lower;
    /// `None`: it may always lower.
    keep: Option<f32>,
}

/// Logits of probabilities this close to 0 or 1 are clipped, as in training.
const LOGIT_CLIP: f32 = 1e-6;

fn logit(p: f32) -> f32 {
    let p = p.clamp(LOGIT_CLIP, 1.0 - LOGIT_CLIP);
    (p / (1.0 - p)).ln()
}

fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + (-z).exp())
}

impl E5Block {
    /// How many of e5's layers to run (`None`: all): the heads were fitted
    /// on the output of the last of them.
    pub fn layers(&self) -> Option<NonZeroUsize> {
        self.layers
    }

    /// The e5 weights the heads read.
    pub fn weights(&self) -> E5Weights {
        self.weights
    }

    /// Framed tokens per scoring window (`None`: e5's default).
    pub fn window(&self) -> Option<NonZeroUsize> {
        self.window
    }

    /// Whether a text with these first-stage scores is read again.
    pub fn consulted(&self, scores: &CategoryScores) -> bool {
        scores.iter().any(|(_, s)| s >= self.gate)
    }

    /// Per category with an e5 head, its logit over `views` (each the
    /// embeddings of one view's windows) averaged with the first stage's;
    /// for a text surely in another language, by `other_languages`.
    fn mix(&self, scores: &mut CategoryScores, views: &[Vec<Vec<f32>>], english: bool) {
        if views.iter().all(Vec::is_empty) {
            return;
        }
        let alone = !english && self.other_languages == OtherLanguages::Alone;
        let heads = match (&self.other_heads, alone) {
            (Some(other), true) => other,
            _ => &self.heads,
        };
        for c in Category::ALL {
            if let Some(head) = &heads[c.index()] {
                let reading = views
                    .iter()
                    .filter(|windows| !windows.is_empty())
                    .map(|windows| self.pooled(windows.iter().map(|e| head.logit(e))))
                    .fold(f32::NEG_INFINITY, f32::max);
                if alone {
                    scores.set(c, sigmoid(reading));
                    continue;
                }
                let first = scores.get(c);
                let z = (1.0 - self.weight) * logit(first) + self.weight * reading;
                let mixed = sigmoid(z);
                let kept = head.keep.is_some_and(|k| first >= k);
                scores.set(c, if kept { mixed.max(first) } else { mixed });
            }
        }
    }

    /// One view's logit from its windows' (at least one).
    fn pooled(&self, logits: impl Iterator<Item = f32>) -> f32 {
        match self.pool {
            WindowPool::Max => logits.fold(f32::NEG_INFINITY, f32::max),
            WindowPool::Mean => {
                let (sum, n) = logits.fold((0.0, 0usize), |(s, n), z| (s + z, n + 1));
                sum / n.max(1) as f32
            }
        }
    }
}

impl E5Head {
    /// Its logit for one window's e5 embedding.
    fn logit(&self, embedding: &[f32]) -> f32 {
        let linear = dot(&self.w, embedding) + self.b;
        match &self.hidden {
            Some(hidden) => linear + hidden.logit(&[embedding]),
            None => linear,
        }
    }
}

pub struct Heads {
    pub version: String,
    pub input: InputKind,
    pub window: WindowConfig,
    /// The sha256 of the encoder adapter these heads read the embeddings of
    /// (see [`super::adapter`]); `None`: the base encoder.
    pub encoder_adapter: Option<String>,
    /// The sha256 of the n-gram model the heads were trained on.
    pub ngram_model: Option<String>,
    /// Indexed by category; `None` for `sexual/minors`, which is composed.
    learnt: Vec<Option<Head>>,
    minor: Head,
    thresholds: Thresholds,
    /// (child, parent): the parent is raised to at least the child's score,
    /// since e.g. a self-harm intent is self-harm.
    parents: Vec<(Category, Category)>,
    pub e5: Option<E5Block>,
}

impl Heads {
    pub fn parse(json: &str) -> Result<Heads, TextModelError> {
        let file: HeadsFile =
            serde_json::from_str(json).map_err(|e| invalid(format!("heads.json: {e}")))?;
        let mut specs = file.heads;
        let mut learnt = Vec::with_capacity(Category::ALL.len());
        for c in Category::ALL {
            let head = match c {
                Category::SexualMinors => None,
                _ => Some(take_head(&mut specs, c.as_str())?),
            };
            learnt.push(head);
        }
        let minor = take_head(&mut specs, MINOR_HEAD)?;
        let mut thresholds = Thresholds::uniform(0.5);
        for c in Category::ALL {
            let t = *file
                .thresholds
                .get(c.as_str())
                .ok_or_else(|| invalid(format!("no threshold for {c}")))?;
            if !(0.0..=1.0).contains(&t) {
                return Err(invalid(format!("threshold for {c} is outside [0, 1]")));
            }
            thresholds.set(c, t);
        }
        let parents = file
            .parents
            .iter()
            .map(|(child, parent)| Ok((category(child)?, category(parent)?)))
            .collect::<Result<Vec<_>, TextModelError>>()?;
        if file.window.tokens < 8 || file.window.tokens > 512 || file.window.stride == 0 {
            return Err(invalid(
                "window must have 8..=512 tokens and a stride > 0".into(),
            ));
        }
        let e5 = file.e5.map(e5_block).transpose()?;
        Ok(Heads {
            version: file.version,
            input: file.input,
            window: WindowConfig {
                tokens: file.window.tokens,
                stride: file.window.stride,
            },
            encoder_adapter: file.encoder_adapter,
            ngram_model: file.ngram_model,
            learnt,
            minor,
            thresholds,
            parents,
            e5,
        })
    }

    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }

    /// Head probabilities for one window of a text whose lexical features
    /// are `lexical`: the learnt categories, plus the minor signal stored in
    /// the `sexual/minors` slot until [`Heads::compose`].
    pub fn window_scores(&self, embedding: &[f32], lexical: &LexicalFeatures) -> CategoryScores {
        let mut scores = CategoryScores::default();
        for c in Category::ALL {
            let p = match &self.learnt[c.index()] {
                Some(head) => head.probability(embedding, lexical),
                None => self.minor.probability(embedding, lexical),
            };
            scores.set(c, p);
        }
        scores
    }

    /// Turns the per-text maximum of [`Heads::window_scores`] into the final
    /// scores: `sexual/minors` needs both a sexual and a minor signal, and
    /// parents are at least as high as their children.
    pub fn compose(&self, mut max_over_windows: CategoryScores) -> CategoryScores {
        let minor = max_over_windows.get(Category::SexualMinors);
        let sexual = max_over_windows.get(Category::Sexual);
        max_over_windows.set(Category::SexualMinors, sexual.min(minor));
        self.raise_parents(&mut max_over_windows);
        max_over_windows
    }

    fn raise_parents(&self, scores: &mut CategoryScores) {
        for &(child, parent) in &self.parents {
            let raised = scores.get(parent).max(scores.get(child));
            scores.set(parent, raised);
        }
    }

    /// The final scores of a text the second encoder was consulted on:
    /// its composed first-stage `scores` mixed with the e5 heads' reading
    /// of the e5 embeddings of the text's `views` (per view, its windows'),
    /// parents raised again. `english`: whether the text is surely English
    /// (else the block's `other_languages` rule applies). Unchanged without
    /// an e5 block.
    pub fn with_e5(
        &self,
        mut scores: CategoryScores,
        views: &[Vec<Vec<f32>>],
        english: bool,
    ) -> CategoryScores {
        if let Some(block) = &self.e5 {
            block.mix(&mut scores, views, english);
            // The first stage composes sexual/minors at or under sexual;
            // where e5 lowered sexual (sexual/minors has no e5 head), sexual
            // is raised to its kind again, as every parent is. Lowering
            // sexual/minors instead cost validation any-category AUPRC
            // 0.827 -> 0.823 and flagged F1 0.751 -> 0.746.
            let minors = scores.get(Category::SexualMinors);
            let sexual = scores.get(Category::Sexual);
            scores.set(Category::Sexual, sexual.max(minors));
            self.raise_parents(&mut scores);
        }
        scores
    }
}

fn take_head(specs: &mut HashMap<String, HeadSpec>, name: &str) -> Result<Head, TextModelError> {
    let spec = specs
        .remove(name)
        .ok_or_else(|| invalid(format!("no head for {name}")))?;
    if spec.w.len() != EMBEDDING_DIM {
        return Err(invalid(format!(
            "head {name} has {} weights, expected {EMBEDDING_DIM}",
            spec.w.len()
        )));
    }
    let mut lex = [0.0; LEXICAL_FEATURES];
    match spec.lex {
        None => {}
        Some(given) if given.len() == LEXICAL_FEATURES || given.len() == TERM_LIST_FEATURES => {
            lex[..given.len()].copy_from_slice(&given);
        }
        Some(given) => {
            return Err(invalid(format!(
                "head {name} has {} lexical weights, expected {LEXICAL_FEATURES} \
                 (or {TERM_LIST_FEATURES}, from before the n-gram model)",
                given.len()
            )))
        }
    }
    if !spec.b.is_finite() || spec.w.iter().chain(&lex).any(|w| !w.is_finite()) {
        return Err(invalid(format!("head {name} has a non-finite weight")));
    }
    let hidden = spec
        .hidden
        .map(|h| hidden_layer(name, h, HiddenInputs::FirstStage))
        .transpose()?;
    Ok(Head {
        w: spec.w,
        lex,
        b: spec.b,
        hidden,
    })
}

fn e5_block(spec: E5Spec) -> Result<E5Block, TextModelError> {
    if [spec.gate, spec.weight]
        .iter()
        .chain(spec.keep.values())
        .any(|v| !(0.0..=1.0).contains(v))
    {
        return Err(invalid(
            "e5: gate, weight and keep must be in [0, 1]".into(),
        ));
    }
    let mut keep = spec.keep;
    let heads = e5_heads(spec.heads, &mut keep)?;
    if let Some(name) = keep.keys().next() {
        return Err(invalid(format!(
            "e5: keep names {name}, which has no e5 head"
        )));
    }
    let other_heads = match spec.other_heads {
        Some(specs) if spec.other_languages == OtherLanguages::Alone => {
            Some(e5_heads(specs, &mut HashMap::new())?)
        }
        Some(_) => {
            return Err(invalid(
                "e5: other_heads are read only with other_languages \"alone\"".into(),
            ))
        }
        None => None,
    };
    Ok(E5Block {
        gate: spec.gate,
        weight: spec.weight,
        pool: spec.pool,
        layers: spec.layers,
        weights: spec.weights,
        window: spec.window,
        other_languages: spec.other_languages,
        heads,
        other_heads,
    })
}

/// e5 heads by category from their specs, each taking its `keep` entry.
fn e5_heads(
    specs: HashMap<String, E5HeadSpec>,
    keep: &mut HashMap<String, f32>,
) -> Result<Vec<Option<E5Head>>, TextModelError> {
    let mut heads: Vec<Option<E5Head>> = Category::ALL.iter().map(|_| None).collect();
    for (name, head) in specs {
        let c = category(&name)?;
        if head.w.len() != E5_DIM {
            return Err(invalid(format!(
                "e5 head {name} has {} weights, expected {E5_DIM}",
                head.w.len()
            )));
        }
        if !head.b.is_finite() || head.w.iter().any(|w| !w.is_finite()) {
            return Err(invalid(format!("e5 head {name} has a non-finite weight")));
        }
        let hidden = head
            .hidden
            .map(|h| hidden_layer(&format!("e5 {name}"), h, HiddenInputs::E5))
            .transpose()?;
        heads[c.index()] = Some(E5Head {
            w: head.w,
            b: head.b,
            hidden,
            keep: keep.remove(&name),
        });
    }
    Ok(heads)
}

/// What a hidden layer reads, which sets its rows' width.
#[derive(Clone, Copy)]
enum HiddenInputs {
    /// MiniLM's embedding, then the lexical features.
    FirstStage,
    /// e5's embedding.
    E5,
}

impl HiddenInputs {
    fn width(self) -> usize {
        match self {
            HiddenInputs::FirstStage => HIDDEN_INPUTS,
            HiddenInputs::E5 => E5_DIM,
        }
    }

    fn described(self) -> String {
        match self {
            HiddenInputs::FirstStage => {
                format!("{EMBEDDING_DIM} embedding, then {LEXICAL_FEATURES} lexical")
            }
            HiddenInputs::E5 => format!("{E5_DIM} of e5's embedding"),
        }
    }
}

fn hidden_layer(
    name: &str,
    spec: HiddenSpec,
    inputs: HiddenInputs,
) -> Result<HiddenLayer, TextModelError> {
    let units = spec.w.len();
    if units == 0 || spec.b.len() != units || spec.out.len() != units {
        return Err(invalid(format!(
            "head {name}: its hidden layer needs as many biases and output weights as rows \
             (at least one), got {units} rows, {} biases, {} output weights",
            spec.b.len(),
            spec.out.len()
        )));
    }
    let width = inputs.width();
    if let Some(row) = spec.w.iter().find(|row| row.len() != width) {
        return Err(invalid(format!(
            "head {name}: a hidden row has {} weights, expected {width} ({})",
            row.len(),
            inputs.described()
        )));
    }
    let w: Vec<f32> = spec.w.into_iter().flatten().collect();
    if w.iter()
        .chain(&spec.b)
        .chain(&spec.out)
        .any(|v| !v.is_finite())
    {
        return Err(invalid(format!(
            "head {name}: its hidden layer has a non-finite weight"
        )));
    }
    Ok(HiddenLayer {
        w,
        inputs: width,
        b: spec.b,
        out: spec.out,
    })
}

fn category(name: &str) -> Result<Category, TextModelError> {
    Category::parse(name).ok_or_else(|| invalid(format!("unknown category {name}")))
}

fn invalid(msg: String) -> TextModelError {
    TextModelError::Invalid(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads_json(minor_bias: f32, sexual_bias: f32) -> String {
        let zero = vec![0.0f32; EMBEDDING_DIM];
        let mut heads = serde_json::Map::new();
        for c in Category::ALL {
            if c != Category::SexualMinors {
                let b = if c == Category::Sexual {
                    sexual_bias
                } else {
                    -5.0
                };
                heads.insert(c.as_str().into(), serde_json::json!({"w": zero, "b": b}));
            }
        }
        heads.insert(
            "minor".into(),
            serde_json::json!({"w": zero, "b": minor_bias}),
        );
        let thresholds: serde_json::Map<_, _> = Category::ALL
            .iter()
            .map(|c| (c.as_str().to_string(), serde_json::json!(0.4)))
            .collect();
        serde_json::json!({
            "version": "test",
            "input": "raw",
            "window": {"tokens": 128, "stride": 96},
            "heads": heads,
            "thresholds": thresholds,
            "parents": [["self-harm/intent", "self-harm"]],
        })
        .to_string()
    }

    #[test]
    fn sexual_minors_needs_both_signals() {
        let emb = vec![0.0f32; EMBEDDING_DIM];
        let lex = LexicalFeatures::default();
        let both = Heads::parse(&heads_json(4.0, 4.0)).unwrap();
        let s = both.compose(both.window_scores(&emb, &lex));
        assert!(s.get(Category::SexualMinors) > 0.9);
        let minor_only = Heads::parse(&heads_json(4.0, -4.0)).unwrap();
        let s = minor_only.compose(minor_only.window_scores(&emb, &lex));
        assert!(s.get(Category::SexualMinors) < 0.1);
        let sexual_only = Heads::parse(&heads_json(-4.0, 4.0)).unwrap();
        let s = sexual_only.compose(sexual_only.window_scores(&emb, &lex));
        assert!(s.get(Category::SexualMinors) < 0.1);
        assert!(s.get(Category::Sexual) > 0.9);
    }

    #[test]
    fn parents_are_raised_to_their_children() {
        let heads = Heads::parse(&heads_json(0.0, 0.0)).unwrap();
        let mut raw = CategoryScores::default();
        raw.set(Category::SelfHarmIntent, 0.8);
        raw.set(Category::SelfHarm, 0.1);
        let s = heads.compose(raw);
        assert_eq!(s.get(Category::SelfHarm), 0.8);
    }

    /// Heads whose first stage gives every category sigmoid(-5) but
    /// self-harm/intent sigmoid(`intent_bias`), with an e5 block whose
    /// self-harm/intent head reads embedding value 0 with weight 10.
    fn heads_with_e5(intent_bias: f32, gate: f32, pool: &str, keep: f32) -> Heads {
        let mut v: serde_json::Value = serde_json::from_str(&heads_json(-5.0, -5.0)).unwrap();
        v["heads"]["self-harm/intent"]["b"] = serde_json::json!(intent_bias);
        let mut w = vec![0.0f32; E5_DIM];
        w[0] = 10.0;
        v["e5"] = serde_json::json!({
            "gate": gate,
            "weight": 0.5,
            "pool": pool,
            "keep": {"self-harm/intent": keep},
            "heads": {"self-harm/intent": {"w": w, "b": 0.0}},
        });
        Heads::parse(&v.to_string()).unwrap()
    }

    fn first_stage(heads: &Heads) -> CategoryScores {
        let emb = vec![0.0f32; EMBEDDING_DIM];
        heads.compose(heads.window_scores(&emb, &LexicalFeatures::default()))
    }

    /// An e5 embedding whose self-harm/intent logit is `z` under
    /// [`heads_with_e5`].
    fn e5_with_logit(z: f32) -> Vec<f32> {
        let mut e5 = vec![0.0f32; E5_DIM];
        e5[0] = z / 10.0;
        e5
    }

    #[test]
    fn other_languages_alone_let_e5_speak_without_the_first_stage() {
        let mixed = heads_with_e5(-5.0, 0.1, "mean", 1.0);
        let mut v: serde_json::Value = serde_json::from_str(&heads_json(-5.0, -5.0)).unwrap();
        v["heads"]["self-harm/intent"]["b"] = serde_json::json!(-5.0);
        let mut w = vec![0.0f32; E5_DIM];
        w[0] = 10.0;
        v["e5"] = serde_json::json!({
            "gate": 0.1, "weight": 0.5, "pool": "mean", "keep": {},
            "other_languages": "alone",
            "heads": {"self-harm/intent": {"w": w, "b": 0.0}},
        });
        let alone = Heads::parse(&v.to_string()).unwrap();
        let before = first_stage(&alone);
        let read = [vec![e5_with_logit(2.0)]];
        // English, and any text under the default rule: the logits average,
        // (-5 + 2) / 2, so a first stage blind to the language holds e5 down.
        let english = alone.with_e5(before, &read, true);
        assert!((english.get(Category::SelfHarmIntent) - sigmoid(-1.5)).abs() < 1e-5);
        assert_eq!(mixed.with_e5(before, &read, false), english);
        // Another language under "alone": e5's own reading, parents raised.
        let other = alone.with_e5(before, &read, false);
        assert!((other.get(Category::SelfHarmIntent) - sigmoid(2.0)).abs() < 1e-5);
        assert!(other.get(Category::SelfHarm) >= other.get(Category::SelfHarmIntent));
        // Categories without an e5 head keep the first stage's score.
        assert_eq!(other.get(Category::Hate), before.get(Category::Hate));
    }

    #[test]
    fn the_second_stage_averages_logits_and_raises_parents_again() {
        let heads = heads_with_e5(1.0, 0.5, "max", 1.0);
        let before = first_stage(&heads);
        let block = heads.e5.as_ref().unwrap();
        assert!(
            block.consulted(&before),
            "sigmoid(1) = 0.73 reaches the gate"
        );
        // e5 logit 3: the mix is sigmoid((1 + 3) / 2).
        let after = heads.with_e5(before, &[vec![e5_with_logit(3.0)]], true);
        assert!((after.get(Category::SelfHarmIntent) - sigmoid(2.0)).abs() < 1e-5);
        assert_eq!(
            after.get(Category::SelfHarm),
            after.get(Category::SelfHarmIntent)
        );
        // Categories without an e5 head keep their first-stage score.
        assert_eq!(after.get(Category::Hate), before.get(Category::Hate));
        // A clear "no" from e5 lowers the score.
        let no = heads.with_e5(before, &[vec![e5_with_logit(-5.0)]], true);
        assert!(no.get(Category::SelfHarmIntent) < 0.2);
        // Pooled by the strongest window: one "yes" among "no"s.
        let windows = vec![e5_with_logit(-5.0), e5_with_logit(3.0)];
        assert_eq!(heads.with_e5(before, &[windows], true), after);
    }

    #[test]
    fn mean_pooling_averages_a_views_windows_and_the_strongest_view_speaks() {
        let heads = heads_with_e5(1.0, 0.5, "mean", 1.0);
        let before = first_stage(&heads);
        // Windows at 3 and -5: their mean, -1, is the view's logit.
        let one_view = heads.with_e5(
            before,
            &[vec![e5_with_logit(3.0), e5_with_logit(-5.0)]],
            true,
        );
        assert!((one_view.get(Category::SelfHarmIntent) - sigmoid(0.0)).abs() < 1e-5);
        // The de-obfuscated view reads 3 where the raw one reads -5: 3 speaks.
        let views = heads.with_e5(
            before,
            &[vec![e5_with_logit(-5.0)], vec![e5_with_logit(3.0)]],
            true,
        );
        assert!((views.get(Category::SelfHarmIntent) - sigmoid(2.0)).abs() < 1e-5);
        // A view without windows (nothing to read) is not a "no".
        let empty = heads.with_e5(before, &[vec![], vec![e5_with_logit(3.0)]], true);
        assert_eq!(empty, views);
    }

    #[test]
    fn a_confident_first_stage_score_is_raised_but_never_lowered() {
        // First stage sigmoid(1) = 0.73, at or over keep = 0.7.
        let heads = heads_with_e5(1.0, 0.5, "mean", 0.7);
        let before = first_stage(&heads);
        let no = heads.with_e5(before, &[vec![e5_with_logit(-5.0)]], true);
        assert_eq!(
            no.get(Category::SelfHarmIntent),
            before.get(Category::SelfHarmIntent)
        );
        let yes = heads.with_e5(before, &[vec![e5_with_logit(3.0)]], true);
        assert!((yes.get(Category::SelfHarmIntent) - sigmoid(2.0)).abs() < 1e-5);
        // Under keep, a "no" lowers as before.
        let unsure = heads_with_e5(1.0, 0.5, "mean", 0.8);
        let lowered = unsure.with_e5(before, &[vec![e5_with_logit(-5.0)]], true);
        assert!(lowered.get(Category::SelfHarmIntent) < 0.2);
    }

    #[test]
    fn sexual_stays_at_least_its_kind_sexual_minors_when_e5_lowers_it() {
        // First stage: sexual 0.88, minor signal 0.88, so sexual/minors 0.88.
        let mut v: serde_json::Value = serde_json::from_str(&heads_json(2.0, 2.0)).unwrap();
        v["e5"] = serde_json::json!({
            "gate": 0.1, "weight": 0.5, "pool": "mean", "keep": {},
            "heads": {"sexual": {"w": vec![0.0f32; E5_DIM], "b": -8.0}},
        });
        let heads = Heads::parse(&v.to_string()).unwrap();
        let before = first_stage(&heads);
        assert!(before.get(Category::SexualMinors) > 0.85, "{before:?}");
        let after = heads.with_e5(before, &[vec![vec![0.0f32; E5_DIM]]], true);
        // e5's "no" (logit -8) would take sexual to sigmoid(-3) = 0.05.
        assert_eq!(
            after.get(Category::Sexual),
            before.get(Category::SexualMinors)
        );
        assert_eq!(
            after.get(Category::SexualMinors),
            before.get(Category::SexualMinors)
        );
    }

    #[test]
    fn an_e5_head_with_a_hidden_layer_adds_its_units_to_each_windows_logit() {
        // Two units: one reads e5's dimension 0 (out 2), one reads minus
        // dimension 1 (out 3), so the head's logit is 2 relu(e0) + 3 relu(-e1) - 1.
        let mut up = vec![0.0f32; E5_DIM];
        up[0] = 1.0;
        let mut down = vec![0.0f32; E5_DIM];
        down[1] = -1.0;
        let mut v: serde_json::Value = serde_json::from_str(&heads_json(1.0, -5.0)).unwrap();
        v["e5"] = serde_json::json!({
            "gate": 0.1, "weight": 0.5, "pool": "mean", "keep": {},
            "heads": {"violence": {"w": vec![0.0f32; E5_DIM], "b": -1.0,
                "hidden": {"w": [up, down], "b": [0.0, 0.0], "out": [2.0, 3.0]}}},
        });
        let heads = Heads::parse(&v.to_string()).unwrap();
        let before = first_stage(&heads);
        let first = logit(before.get(Category::Violence));
        let window = |e0: f32, e1: f32| {
            let mut e = vec![0.0f32; E5_DIM];
            e[0] = e0;
            e[1] = e1;
            e
        };
        let mixed = |z: f32| sigmoid(0.5 * first + 0.5 * z);
        // Both units on: 2 * 1 + 3 * 1 - 1 = 4.
        let on = heads.with_e5(before, &[vec![window(1.0, -1.0)]], true);
        assert!(
            (on.get(Category::Violence) - mixed(4.0)).abs() < 1e-5,
            "{on:?}"
        );
        // ReLU: negative activations add nothing, leaving the bias.
        let off = heads.with_e5(before, &[vec![window(-1.0, 1.0)]], true);
        assert!(
            (off.get(Category::Violence) - mixed(-1.0)).abs() < 1e-5,
            "{off:?}"
        );
        // Windows are pooled on their logits (mean of 4 and -1), as for a linear head.
        let both = heads.with_e5(before, &[vec![window(1.0, -1.0), window(-1.0, 1.0)]], true);
        assert!(
            (both.get(Category::Violence) - mixed(1.5)).abs() < 1e-5,
            "{both:?}"
        );
        // A hidden row of the first stage's width is refused for an e5 head.
        v["e5"]["heads"]["violence"]["hidden"]["w"] =
            serde_json::json!([vec![0.0f32; HIDDEN_INPUTS]]);
        v["e5"]["heads"]["violence"]["hidden"]["b"] = serde_json::json!([0.0]);
        v["e5"]["heads"]["violence"]["hidden"]["out"] = serde_json::json!([1.0]);
        let err = Heads::parse(&v.to_string()).err().unwrap();
        assert!(
            err.to_string().contains("e5 violence: a hidden row"),
            "{err}"
        );
        assert!(err.to_string().contains("of e5's embedding"), "{err}");
    }

    #[test]
    fn texts_under_the_gate_are_not_read_again() {
        let heads = heads_with_e5(-5.0, 0.1, "mean", 1.0);
        let scores = first_stage(&heads);
        assert!(!heads.e5.as_ref().unwrap().consulted(&scores), "{scores:?}");
        let plain = Heads::parse(&heads_json(-5.0, -5.0)).unwrap();
        assert!(plain.e5.is_none());
        assert_eq!(
            plain.with_e5(scores, &[vec![vec![1.0; E5_DIM]]], true),
            scores
        );
    }

    #[test]
    fn rejects_an_e5_block_of_the_wrong_width_or_range() {
        let good = heads_json(0.0, 0.0);
        let with = |e5: serde_json::Value| {
            let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
            v["e5"] = e5;
            Heads::parse(&v.to_string())
        };
        let head = serde_json::json!({"hate": {"w": vec![0.0f32; E5_DIM], "b": 0.0}});
        let block = |gate: f32, pool: &str, keep: f32, heads: &serde_json::Value| {
            serde_json::json!({"gate": gate, "weight": 0.5, "pool": pool,
                "keep": {"hate": keep}, "heads": heads})
        };
        assert!(with(block(0.1, "mean", 0.9, &head)).is_ok());
        let narrow = serde_json::json!({"hate": {"w": [1.0], "b": 0.0}});
        let err = with(block(0.1, "mean", 0.9, &narrow)).err().unwrap();
        assert!(err.to_string().contains("e5 head hate"), "{err}");
        assert!(with(block(1.5, "mean", 0.9, &head)).is_err());
        assert!(with(block(0.1, "mean", 1.5, &head)).is_err());
        assert!(with(block(0.1, "median", 0.9, &head)).is_err());
        let nonsense = serde_json::json!({"nonsense": {"w": vec![0.0f32; E5_DIM], "b": 0.0}});
        assert!(with(block(0.1, "mean", 0.9, &nonsense)).is_err());
        let violence = serde_json::json!({"violence": {"w": vec![0.0f32; E5_DIM], "b": 0.0}});
        let err = with(block(0.1, "mean", 0.9, &violence)).err().unwrap();
        assert!(err.to_string().contains("keep names hate"), "{err}");
        // The layers the heads read: all when absent, never none.
        let read = |layers: serde_json::Value| {
            let mut b = block(0.1, "mean", 0.9, &head);
            b["layers"] = layers;
            with(b)
        };
        let all = with(block(0.1, "mean", 0.9, &head)).unwrap();
        assert_eq!(all.e5.unwrap().layers(), None);
        let six = read(serde_json::json!(6)).unwrap().e5.unwrap().layers();
        assert_eq!(six.map(NonZeroUsize::get), Some(6));
        assert!(read(serde_json::json!(0)).is_err());
        assert!(read(serde_json::json!(-1)).is_err());
        // The weights they read: the pinned file when absent.
        let weights = |w: serde_json::Value| {
            let mut b = block(0.1, "mean", 0.9, &head);
            b["weights"] = w;
            with(b)
        };
        let pinned = with(block(0.1, "mean", 0.9, &head)).unwrap();
        assert_eq!(pinned.e5.unwrap().weights(), E5Weights::Pinned);
        let ft = weights(serde_json::json!("finetuned")).unwrap();
        assert_eq!(ft.e5.unwrap().weights(), E5Weights::Finetuned);
        let err = weights(serde_json::json!("retrained")).err().unwrap();
        assert!(err.to_string().contains("retrained"), "{err}");
    }

    #[test]
    fn rejects_wrong_width_missing_heads_and_bad_thresholds() {
        let good = heads_json(0.0, 0.0);
        assert!(Heads::parse(&good).is_ok());
        let short = good.replacen("\"b\":-5.0", "\"b\":-5.0,\"x\":1", 1);
        assert!(Heads::parse(&short).is_ok(), "unknown fields are tolerated");
        let no_minor: serde_json::Value = {
            let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
            v["heads"].as_object_mut().unwrap().remove("minor");
            v
        };
        assert!(Heads::parse(&no_minor.to_string()).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v["heads"]["hate"]["w"] = serde_json::json!([1.0, 2.0]);
        assert!(Heads::parse(&v.to_string()).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v["thresholds"]["hate"] = serde_json::json!(1.5);
        assert!(Heads::parse(&v.to_string()).is_err());
        let mut v: serde_json::Value = serde_json::from_str(&good).unwrap();
        v["heads"]["hate"]["lex"] = serde_json::json!(vec![0.5f32; TERM_LIST_FEATURES]);
        assert!(
            Heads::parse(&v.to_string()).is_ok(),
            "heads of before the n-gram model load"
        );
        v["heads"]["hate"]["lex"] = serde_json::json!([1.0, 2.0]);
        let err = Heads::parse(&v.to_string())
            .err()
            .expect("short lex accepted");
        assert!(err.to_string().contains("lexical weights"), "{err}");
    }

    #[test]
    fn a_hidden_layer_adds_its_relu_units_to_the_logit() {
        let mut v: serde_json::Value = serde_json::from_str(&heads_json(0.0, 0.0)).unwrap();
        // Two units on embedding dimension 0: one reads it, one its opposite.
        let mut up = vec![0.0f32; HIDDEN_INPUTS];
        up[0] = 1.0;
        let mut down = vec![0.0f32; HIDDEN_INPUTS];
        down[0] = -1.0;
        v["heads"]["self-harm"]["b"] = serde_json::json!(0.0);
        v["heads"]["self-harm"]["hidden"] =
            serde_json::json!({"w": [up, down], "b": [0.0, 0.0], "out": [2.0, 3.0]});
        let heads = Heads::parse(&v.to_string()).unwrap();
        let lex = LexicalFeatures::default();
        let mut emb = vec![0.0f32; EMBEDDING_DIM];
        let at =
            |heads: &Heads, emb: &[f32]| heads.window_scores(emb, &lex).get(Category::SelfHarm);
        assert_eq!(
            at(&heads, &emb),
            0.5,
            "no unit active: the linear part alone"
        );
        emb[0] = 1.0;
        let expected = 1.0 / (1.0 + (-2.0f32).exp());
        assert!(
            (at(&heads, &emb) - expected).abs() < 1e-6,
            "the first unit, times 2"
        );
        emb[0] = -1.0;
        let expected = 1.0 / (1.0 + (-3.0f32).exp());
        assert!(
            (at(&heads, &emb) - expected).abs() < 1e-6,
            "the second unit, times 3"
        );
        assert!(
            heads.window_scores(&emb, &lex).get(Category::Hate) < 0.01,
            "other heads are untouched"
        );
    }

    #[test]
    fn rejects_a_hidden_layer_of_the_wrong_shape() {
        let base: serde_json::Value = serde_json::from_str(&heads_json(0.0, 0.0)).unwrap();
        let row = vec![0.0f32; HIDDEN_INPUTS];
        let cases = [
            (
                serde_json::json!({"w": [row.clone()], "b": [0.0], "out": [1.0, 2.0]}),
                "output weights",
            ),
            (
                serde_json::json!({"w": [[1.0, 2.0]], "b": [0.0], "out": [1.0]}),
                "a hidden row has 2 weights",
            ),
            (
                serde_json::json!({"w": [], "b": [], "out": []}),
                "at least one",
            ),
        ];
        for (hidden, says) in cases {
            let mut v = base.clone();
            v["heads"]["self-harm"]["hidden"] = hidden;
            let err = Heads::parse(&v.to_string())
                .err()
                .expect("a bad hidden layer loaded");
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn lexical_weights_move_the_score_of_their_head_only() {
        let mut v: serde_json::Value = serde_json::from_str(&heads_json(0.0, 0.0)).unwrap();
        let mut lex = vec![0.0f32; LEXICAL_FEATURES];
        lex[Category::Hate.index()] = 10.0;
        v["heads"]["hate"]["lex"] = serde_json::json!(lex);
        let heads = Heads::parse(&v.to_string()).unwrap();
        let lexical = LexicalClassifier::new();
        let ngrams = NgramModel::shipped();
        let emb = vec![0.0f32; EMBEDDING_DIM];
        let plain = LexicalFeatures::of(&lexical, ngrams, "have a nice day");
        let slur = LexicalFeatures::of(&lexical, ngrams, "those people are subhuman vermin");
        assert!(slur.values()[Category::Hate.index()] > 0.5, "{slur:?}");
        let before = heads.window_scores(&emb, &plain);
        let after = heads.window_scores(&emb, &slur);
        assert!(after.get(Category::Hate) > before.get(Category::Hate) + 0.3);
        assert_eq!(
            after.get(Category::Violence),
            before.get(Category::Violence)
        );
    }

    /// MiniLM-L6's last LayerNorm scales embedding dimensions 127, 223 and
    /// 319 by about 1e-33. A head that standardises its inputs turns them
    /// into features with weights near 1e31 (heads .15's self-harm layer),
    /// and its score then hangs on values at the edge of float precision:
    /// anything that rounds them (a half-precision cache, another
    /// LayerNorm) would move it. The shipped weights are all below 10.
    #[test]
    fn shipped_heads_give_no_weight_to_vanishing_features() {
        let file: HeadsFile =
            serde_json::from_str(crate::moderation::text::model::SHIPPED_HEADS_JSON).unwrap();
        for (name, head) in &file.heads {
            let hidden = head.hidden.iter().flat_map(|h| h.w.iter().flatten());
            let largest = head
                .w
                .iter()
                .chain(head.lex.iter().flatten())
                .chain(hidden)
                .fold(0.0f32, |m, w| m.max(w.abs()));
            assert!(largest < 1e3, "head {name} has a weight of {largest}");
        }
    }
}
