//! Which text path judges a request: the accurate one (both encoders: the
//! first stage and, for what it finds suspect, multilingual-e5 again) or
//! the fast one (the first stage alone). Accurate is the default because
//! the verdict is what we sell; a customer's high-volume key can choose
//! fast in its policy, and an operator can make fast the only path.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Speed {
    /// The first stage and the second stage (multilingual-e5).
    #[default]
    Accurate,
    /// The first stage alone: several times cheaper, less accurate.
    Fast,
}

impl Speed {
    pub const ALL: [Speed; 2] = [Speed::Accurate, Speed::Fast];

    pub fn as_str(self) -> &'static str {
        match self {
            Speed::Accurate => "accurate",
            Speed::Fast => "fast",
        }
    }
}

impl fmt::Display for Speed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A speed name that is neither `accurate` nor `fast`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown speed {0:?}: say \"accurate\" or \"fast\"")]
pub struct UnknownSpeed(pub String);

impl FromStr for Speed {
    type Err = UnknownSpeed;

    fn from_str(s: &str) -> Result<Speed, UnknownSpeed> {
        Speed::ALL
            .into_iter()
            .find(|speed| speed.as_str() == s.trim())
            .ok_or_else(|| UnknownSpeed(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_read_their_names_and_refuse_others() {
        assert_eq!("fast".parse(), Ok(Speed::Fast));
        assert_eq!(" accurate ".parse(), Ok(Speed::Accurate));
        assert_eq!(Speed::default(), Speed::Accurate);
        let err = "quick".parse::<Speed>().unwrap_err();
        assert!(
            err.to_string().contains("\"accurate\" or \"fast\""),
            "{err}"
        );
    }
}
