//! Errors of the crate.
#![forbid(unsafe_code)]

use core::fmt;

/// Why a region could not be formatted (`init`) or attached (`attach`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LayoutError {
    /// The region does not start on a 64-byte boundary.
    Misaligned {
        /// Address of the region.
        addr: usize,
    },
    /// The region is shorter than the layout needs.
    TooShort {
        /// Bytes the layout needs (as far as it could be determined).
        needed: usize,
        /// Bytes available.
        len: usize,
    },
    /// The magic word is not the one of this kind of region.
    BadMagic {
        /// Magic expected.
        expected: u32,
        /// Magic found.
        found: u32,
    },
    /// The layout version is not the one this build understands.
    BadVersion {
        /// Version found.
        found: u32,
    },
    /// The capacity is not a power of two in `2..=MAX_CAPACITY`.
    BadCapacity {
        /// Capacity requested or found.
        capacity: u32,
    },
    /// The ring was formatted for entries of another size.
    EntrySize {
        /// `size_of::<T>()` of this view's entry type.
        expected: u32,
        /// Entry size recorded in the region.
        found: u32,
    },
    /// Another geometry field disagrees with this build's layout.
    Field {
        /// Name of the field.
        name: &'static str,
        /// Value this build expects.
        expected: u32,
        /// Value found.
        found: u32,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Misaligned { addr } => write!(f, "region at {addr:#x} is not 64-byte aligned"),
            Self::TooShort { needed, len } => {
                write!(f, "region of {len} bytes is too short, {needed} needed")
            }
            Self::BadMagic { expected, found } => {
                write!(f, "bad magic {found:#010x}, expected {expected:#010x}")
            }
            Self::BadVersion { found } => write!(
                f,
                "layout version {found} not supported (this build: {})",
                crate::LAYOUT_VERSION
            ),
            Self::BadCapacity { capacity } => write!(
                f,
                "capacity {capacity} is not a power of two in 2..={}",
                crate::MAX_CAPACITY
            ),
            Self::EntrySize { expected, found } => {
                write!(
                    f,
                    "ring holds {found}-byte entries, this view uses {expected}-byte entries"
                )
            }
            Self::Field {
                name,
                expected,
                found,
            } => write!(f, "layout field {name} is {found}, expected {expected}"),
        }
    }
}

impl std::error::Error for LayoutError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_problem() {
        let e = LayoutError::EntrySize {
            expected: 8,
            found: 4,
        };
        assert_eq!(
            e.to_string(),
            "ring holds 4-byte entries, this view uses 8-byte entries"
        );
        assert!(
            LayoutError::BadCapacity { capacity: 3 }
                .to_string()
                .contains("capacity 3")
        );
    }
}
