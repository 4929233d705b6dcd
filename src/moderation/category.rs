//! The eleven moderation categories (the OpenAI moderation names) and
//! fixed-size score vectors indexed by them.

use std::fmt;

/// One moderation category. The discriminant is the index into [`CategoryScores`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Harassment = 0,
    HarassmentThreatening = 1,
    Hate = 2,
    HateThreatening = 3,
    SelfHarm = 4,
    SelfHarmIntent = 5,
    SelfHarmInstructions = 6,
    Sexual = 7,
    SexualMinors = 8,
    Violence = 9,
    ViolenceGraphic = 10,
}

/// Number of categories.
pub const NUM_CATEGORIES: usize = 11;

impl Category {
    /// Every category, in index order (also the order of the API's JSON maps).
    pub const ALL: [Category; NUM_CATEGORIES] = [
        Category::Harassment,
        Category::HarassmentThreatening,
        Category::Hate,
        Category::HateThreatening,
        Category::SelfHarm,
        Category::SelfHarmIntent,
        Category::SelfHarmInstructions,
        Category::Sexual,
        Category::SexualMinors,
        Category::Violence,
        Category::ViolenceGraphic,
    ];

    /// The API name, e.g. `harassment/threatening`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Category::Harassment => "harassment",
            Category::HarassmentThreatening => "harassment/threatening",
            Category::Hate => "hate",
            Category::HateThreatening => "hate/threatening",
            Category::SelfHarm => "self-harm",
            Category::SelfHarmIntent => "self-harm/intent",
            Category::SelfHarmInstructions => "self-harm/instructions",
            Category::Sexual => "sexual",
            Category::SexualMinors => "sexual/minors",
            Category::Violence => "violence",
            Category::ViolenceGraphic => "violence/graphic",
        }
    }

    /// Parses an API name; `None` for anything else.
    pub fn parse(name: &str) -> Option<Category> {
        Category::ALL.into_iter().find(|c| c.as_str() == name)
    }

    pub const fn index(self) -> usize {
        self as usize
    }

    /// The category this one is a kind of (`violence` for
    /// `violence/graphic`), as in OpenAI's taxonomy.
    pub const fn parent(self) -> Option<Category> {
        match self {
            Category::HarassmentThreatening => Some(Category::Harassment),
            Category::HateThreatening => Some(Category::Hate),
            Category::SelfHarmIntent | Category::SelfHarmInstructions => Some(Category::SelfHarm),
            Category::SexualMinors => Some(Category::Sexual),
            Category::ViolenceGraphic => Some(Category::Violence),
            _ => None,
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A score in [0, 1] for every category.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CategoryScores(pub [f32; NUM_CATEGORIES]);

impl CategoryScores {
    pub fn get(&self, category: Category) -> f32 {
        self.0[category.index()]
    }

    /// Sets a score, clamped into [0, 1] (NaN becomes 0) so that no caller can
    /// put an out-of-range value into a response.
    pub fn set(&mut self, category: Category, score: f32) {
        self.0[category.index()] = if score.is_nan() {
            0.0
        } else {
            score.clamp(0.0, 1.0)
        };
    }

    /// Per category, the stronger of the two.
    pub fn max_with(&self, other: &CategoryScores) -> CategoryScores {
        let mut out = *self;
        for c in Category::ALL {
            out.set(c, self.get(c).max(other.get(c)));
        }
        out
    }

    pub fn iter(&self) -> impl Iterator<Item = (Category, f32)> + '_ {
        Category::ALL.into_iter().map(|c| (c, self.get(c)))
    }
}

/// Per-category decision thresholds: a category is flagged when its score is
/// greater than or equal to its threshold, or when one of its kinds is
/// flagged.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Thresholds(pub [f32; NUM_CATEGORIES]);

impl Thresholds {
    pub fn uniform(t: f32) -> Thresholds {
        Thresholds([t; NUM_CATEGORIES])
    }

    pub fn get(&self, category: Category) -> f32 {
        self.0[category.index()]
    }

    pub fn set(&mut self, category: Category, t: f32) {
        self.0[category.index()] = t;
    }

    /// Which categories `scores` reaches under these thresholds alone (no
    /// policy): the same decision as [`EffectiveThresholds::decide`], so
    /// there is one rule, not two.
    pub fn decide(&self, scores: &CategoryScores) -> [bool; NUM_CATEGORIES] {
        self.under(&CategoryRules::default()).decide(scores)
    }

    /// These (shipped) thresholds with a policy's rules over them: a rule's
    /// threshold replaces the shipped one, `Off` turns the category off, and
    /// a category without a rule keeps the shipped threshold.
    pub fn under(&self, rules: &CategoryRules) -> EffectiveThresholds {
        let mut out = [None; NUM_CATEGORIES];
        for c in Category::ALL {
            out[c.index()] = match rules.get(c) {
                None => Some(self.get(c)),
                Some(CategoryRule::Off) => None,
                Some(CategoryRule::Threshold(t)) => Some(t.get()),
            };
        }
        EffectiveThresholds(out)
    }
}

/// A threshold a policy sets: a number in (0, 1]. Zero would flag every
/// text (every score reaches it), which is what `Off`'s opposite would be
/// and nobody means; above 1 no score could reach it, which is `Off` said
/// unclearly. So neither can be made.
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct Threshold(f32);

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("a threshold must be a number greater than 0 and at most 1, not {0}")]
pub struct ThresholdOutOfRange(pub String);

impl Threshold {
    pub fn new(value: f32) -> Result<Threshold, ThresholdOutOfRange> {
        // `!(x > 0)` also refuses NaN.
        if !(value > 0.0 && value <= 1.0) {
            return Err(ThresholdOutOfRange(value.to_string()));
        }
        Ok(Threshold(value))
    }

    pub fn get(self) -> f32 {
        self.0
    }
}

impl std::str::FromStr for Threshold {
    type Err = ThresholdOutOfRange;
    fn from_str(s: &str) -> Result<Threshold, ThresholdOutOfRange> {
        let value: f32 = s
            .trim()
            .parse()
            .map_err(|_| ThresholdOutOfRange(format!("{s:?}")))?;
        Threshold::new(value)
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // f32 → f64 through the shortest decimal, so 0.3 prints as 0.3.
        write!(f, "{}", self.0)
    }
}

/// What a policy says of one category it names.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CategoryRule {
    /// Never flagged, whatever the score.
    Off,
    /// Flagged from this score on, instead of the shipped threshold.
    Threshold(Threshold),
}

/// A policy's rules: per category a rule, or none (the shipped threshold).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CategoryRules([Option<CategoryRule>; NUM_CATEGORIES]);

impl CategoryRules {
    pub fn get(&self, category: Category) -> Option<CategoryRule> {
        self.0[category.index()]
    }

    pub fn set(&mut self, category: Category, rule: Option<CategoryRule>) {
        self.0[category.index()] = rule;
    }

    /// The categories with a rule, in the API's order.
    pub fn iter(&self) -> impl Iterator<Item = (Category, CategoryRule)> + '_ {
        Category::ALL
            .into_iter()
            .filter_map(|c| self.get(c).map(|rule| (c, rule)))
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }
}

/// The thresholds one request is judged by: the shipped ones with the key's
/// policy over them (see [`Thresholds::under`]). `None` is a category that
/// is off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EffectiveThresholds([Option<f32>; NUM_CATEGORIES]);

impl EffectiveThresholds {
    /// The threshold of `category`, `None` when it is off.
    pub fn get(&self, category: Category) -> Option<f32> {
        self.0[category.index()]
    }

    /// THE flag decision: which categories `scores` reaches. A category is
    /// flagged when its score is greater than or equal to its threshold.
    /// A flagged kind flags its parent too: `violence/graphic` without
    /// `violence` would tell a client that graphic violence is not
    /// violence. (Scores already hold a parent at least as high as its
    /// kinds; the thresholds differ per category.) A category that is off
    /// is never flagged, not even through one of its kinds: "off" is what
    /// the policy's owner asked for, and a kind still says it in its own
    /// flag.
    pub fn decide(&self, scores: &CategoryScores) -> [bool; NUM_CATEGORIES] {
        let mut out = [false; NUM_CATEGORIES];
        for c in Category::ALL {
            out[c.index()] = self.get(c).is_some_and(|t| scores.get(c) >= t);
        }
        for c in Category::ALL {
            if let (true, Some(parent)) = (out[c.index()], c.parent()) {
                if self.get(parent).is_some() {
                    out[parent.index()] = true;
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_indices_match_order() {
        for (i, c) in Category::ALL.into_iter().enumerate() {
            assert_eq!(c.index(), i);
            assert_eq!(Category::parse(c.as_str()), Some(c));
        }
        assert_eq!(
            Category::parse("violence/graphic"),
            Some(Category::ViolenceGraphic)
        );
        assert_eq!(Category::parse("Violence"), None);
    }

    #[test]
    fn a_flagged_kind_flags_its_parent_and_nothing_else() {
        let mut t = Thresholds::uniform(0.5);
        t.set(Category::Violence, 0.8);
        let mut s = CategoryScores::default();
        s.set(Category::ViolenceGraphic, 0.6);
        s.set(Category::Violence, 0.6);
        s.set(Category::Harassment, 0.4);
        let decided = t.decide(&s);
        let flagged: Vec<Category> = Category::ALL
            .into_iter()
            .filter(|c| decided[c.index()])
            .collect();
        assert_eq!(flagged, [Category::Violence, Category::ViolenceGraphic]);
        // A parent alone does not flag its kinds.
        s.set(Category::ViolenceGraphic, 0.1);
        s.set(Category::Violence, 0.9);
        assert!(!t.decide(&s)[Category::ViolenceGraphic.index()]);
        assert!(t.decide(&s)[Category::Violence.index()]);
    }

    #[test]
    fn a_policy_turns_off_or_replaces_and_leaves_the_rest_shipped() {
        let shipped = Thresholds::uniform(0.5);
        let mut rules = CategoryRules::default();
        rules.set(Category::Violence, Some(CategoryRule::Off));
        rules.set(
            Category::Hate,
            Some(CategoryRule::Threshold(Threshold::new(0.2).unwrap())),
        );
        let effective = shipped.under(&rules);
        let mut s = CategoryScores::default();
        s.set(Category::Violence, 0.9);
        s.set(Category::ViolenceGraphic, 0.9);
        s.set(Category::Hate, 0.3);
        s.set(Category::Sexual, 0.4);
        let decided = effective.decide(&s);
        // Off stays off even when a kind of it is flagged.
        assert!(!decided[Category::Violence.index()]);
        assert!(decided[Category::ViolenceGraphic.index()]);
        assert!(decided[Category::Hate.index()]);
        assert!(!decided[Category::Sexual.index()]);
        // No rules: exactly the shipped decision.
        assert_eq!(
            shipped.under(&CategoryRules::default()).decide(&s),
            shipped.decide(&s)
        );
    }

    #[test]
    fn thresholds_are_in_zero_one() {
        for bad in [0.0, -0.1, 1.01, f32::NAN, f32::INFINITY] {
            assert!(Threshold::new(bad).is_err(), "{bad}");
        }
        assert_eq!(Threshold::new(1.0).unwrap().get(), 1.0);
        assert!("0.3".parse::<Threshold>().is_ok());
        assert!("abc".parse::<Threshold>().is_err());
        assert_eq!(Threshold::new(0.3).unwrap().to_string(), "0.3");
    }

    #[test]
    fn set_clamps_and_max_with_is_per_category() {
        let mut a = CategoryScores::default();
        a.set(Category::Hate, 1.7);
        a.set(Category::Sexual, f32::NAN);
        assert_eq!(a.get(Category::Hate), 1.0);
        assert_eq!(a.get(Category::Sexual), 0.0);
        let mut b = CategoryScores::default();
        b.set(Category::Sexual, 0.4);
        let m = a.max_with(&b);
        assert_eq!(m.get(Category::Hate), 1.0);
        assert_eq!(m.get(Category::Sexual), 0.4);
    }
}
