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

    /// Which categories `scores` reaches. A flagged kind flags its parent
    /// too: `violence/graphic` without `violence` would tell a client that
    /// graphic violence is not violence. (Scores already hold a parent at
    /// least as high as its kinds; the thresholds differ per category.)
    pub fn decide(&self, scores: &CategoryScores) -> [bool; NUM_CATEGORIES] {
        let mut out = [false; NUM_CATEGORIES];
        for c in Category::ALL {
            out[c.index()] = scores.get(c) >= self.get(c);
        }
        for c in Category::ALL {
            if let (true, Some(parent)) = (out[c.index()], c.parent()) {
                out[parent.index()] = true;
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
