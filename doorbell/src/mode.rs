//! DoorbellMode: which doorbell layout a NIC uses.
#![forbid(unsafe_code)]

use core::fmt;
use core::str::FromStr;

/// How posts reach the engine: two uses of the same [`crate::Doorbell`] type.
///
/// ```
/// use doorbell::DoorbellMode;
///
/// assert_eq!("per-vi".parse::<DoorbellMode>(), Ok(DoorbellMode::PerVi));
/// assert_eq!(DoorbellMode::default().to_string(), "central");
/// assert!("both".parse::<DoorbellMode>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DoorbellMode {
    /// One MPSC doorbell per NIC, shared by all its VIs (`"central"`).
    #[default]
    Central,
    /// One SPSC doorbell per VI (`"per-vi"`).
    PerVi,
}

impl DoorbellMode {
    /// The name used by `FromStr` and `Display`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Central => "central",
            Self::PerVi => "per-vi",
        }
    }
}

impl fmt::Display for DoorbellMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`DoorbellMode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseModeError(String);

impl fmt::Display for ParseModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown doorbell mode {:?} (expected \"central\" or \"per-vi\")",
            self.0
        )
    }
}

impl std::error::Error for ParseModeError {}

impl FromStr for DoorbellMode {
    type Err = ParseModeError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "central" => Ok(Self::Central),
            "per-vi" => Ok(Self::PerVi),
            _ => Err(ParseModeError(s.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse_round_trip() {
        for m in [DoorbellMode::Central, DoorbellMode::PerVi] {
            assert_eq!(m.to_string().parse::<DoorbellMode>(), Ok(m));
        }
        assert_eq!(DoorbellMode::default(), DoorbellMode::Central);
    }

    #[test]
    fn parse_is_exact() {
        for bad in ["", "Central", "per_vi", "pervi", " central", "central "] {
            let e = bad.parse::<DoorbellMode>().unwrap_err();
            assert!(e.to_string().contains("unknown doorbell mode"), "{bad}");
        }
    }
}
