//! `Mode`: which completion-queue design a CQ uses, chosen at run time.
#![forbid(unsafe_code)]

use core::fmt;
use core::str::FromStr;

/// The completion-queue design.
///
/// ```
/// use cq::Mode;
///
/// assert_eq!(Mode::default(), Mode::Ring);
/// assert_eq!("scan".parse::<Mode>(), Ok(Mode::Scan));
/// assert_eq!("CQ1".parse::<Mode>(), Ok(Mode::Ring));
/// assert_eq!(Mode::Scan.to_string(), "scan");
/// assert!("ring2".parse::<Mode>().is_err());
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// CQ1: the completing engine writes an entry into an [`EntryRing`](crate::EntryRing).
    #[default]
    Ring,
    /// CQ2: the CQ [`Scan`](crate::Scan)s its work queues for unreported completions.
    Scan,
}

impl Mode {
    /// The canonical lower-case name (`"ring"` or `"scan"`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Scan => "scan",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that names no [`Mode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseModeError(String);

impl fmt::Display for ParseModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown completion queue mode {:?} (expected ring, scan, cq1 or cq2)",
            self.0
        )
    }
}

impl std::error::Error for ParseModeError {}

impl FromStr for Mode {
    type Err = ParseModeError;

    /// Accepts `ring`/`cq1` and `scan`/`cq2`, in any case, around whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("ring") || t.eq_ignore_ascii_case("cq1") {
            Ok(Self::Ring)
        } else if t.eq_ignore_ascii_case("scan") || t.eq_ignore_ascii_case("cq2") {
            Ok(Self::Scan)
        } else {
            Err(ParseModeError(s.to_owned()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_round_trips() {
        for (s, m) in [
            ("ring", Mode::Ring),
            ("cq1", Mode::Ring),
            (" Ring ", Mode::Ring),
            ("scan", Mode::Scan),
            ("CQ2", Mode::Scan),
        ] {
            assert_eq!(s.parse::<Mode>(), Ok(m), "{s}");
        }
        for m in [Mode::Ring, Mode::Scan] {
            assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
        }
        let err = "cq3".parse::<Mode>().unwrap_err();
        assert!(err.to_string().contains("cq3"));
        assert!("".parse::<Mode>().is_err());
    }
}
