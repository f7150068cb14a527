//! Page rounding: [`page_size`], [`page_range`] and the extents used for lookups.
#![forbid(unsafe_code)]

use std::fmt;
use std::ops::Range;
use std::sync::OnceLock;

use crate::sys;

/// Size of a virtual memory page in bytes, read once from `sysconf` and cached.
///
/// ```
/// assert!(regcache::page_size().is_power_of_two());
/// ```
///
/// # Panics
///
/// If the kernel reports a page size that is not a power of two.
pub fn page_size() -> usize {
    static PAGE_SIZE: OnceLock<usize> = OnceLock::new();
    *PAGE_SIZE.get_or_init(|| {
        let size = sys::page_size();
        assert!(
            size.is_power_of_two(),
            "page size {size} is not a power of two"
        );
        size
    })
}

/// The page-aligned byte range that covers `len` bytes at `addr`, rounded out to whole pages.
///
/// A zero-length region is legal in VIA: it gives the empty range at the start of the page
/// that holds `addr`.
///
/// ```
/// let ps = regcache::page_size();
/// assert_eq!(regcache::page_range(ps + 1, 1).unwrap(), ps..2 * ps);
/// assert_eq!(regcache::page_range(ps + 1, 0).unwrap(), ps..ps);
/// assert!(regcache::page_range(usize::MAX, 1).is_err());
/// ```
///
/// # Errors
///
/// [`RangeError::Overflow`] if the region, once rounded up to a page boundary, does not end
/// inside the address space.
pub fn page_range(addr: usize, len: usize) -> Result<Range<usize>, RangeError> {
    round_out(addr, len, page_size())
}

/// [`page_range`] for a given power-of-two page size, so tests can use several.
pub(crate) fn round_out(addr: usize, len: usize, page: usize) -> Result<Range<usize>, RangeError> {
    debug_assert!(page.is_power_of_two());
    let mask = page - 1;
    let start = addr & !mask;
    if len == 0 {
        return Ok(start..start);
    }
    let end = addr
        .checked_add(len)
        .and_then(|end| end.checked_add(mask))
        .ok_or(RangeError::Overflow { addr, len })?
        & !mask;
    Ok(start..end)
}

/// The page range of an invalidation: like [`round_out`], but a region that runs off the end
/// of the address space is clamped to it, since dropping "everything from `addr` on" is what
/// the caller means.
pub(crate) fn round_out_saturating(addr: usize, len: usize, page: usize) -> Range<usize> {
    round_out(addr, len, page).unwrap_or_else(|_| addr & !(page - 1)..usize::MAX)
}

/// The extent that stands for a page range in lookups and invalidation.
///
/// It is the range itself, except that an empty range becomes the first byte of its page, so a
/// zero-length registration still has a place: it is covered by an entry that holds its page
/// or starts there, and it is invalidated with that page. Page ranges start on a page boundary,
/// so `start + 1` cannot overflow.
pub(crate) fn extent(pages: &Range<usize>) -> Range<usize> {
    pages.start..pages.end.max(pages.start + 1)
}

/// Why a region has no page range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RangeError {
    /// `addr + len`, rounded up to a page boundary, wraps past the end of the address space.
    Overflow {
        /// Start of the region as given.
        addr: usize,
        /// Length of the region as given.
        len: usize,
    },
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Overflow { addr, len } => write!(
                f,
                "region of {len:#x} bytes at {addr:#x} wraps past the end of the address space"
            ),
        }
    }
}

impl std::error::Error for RangeError {}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = 4096;

    #[test]
    fn rounds_out_to_pages() {
        assert_eq!(round_out(0x1000, 0x1000, P), Ok(0x1000..0x2000));
        assert_eq!(round_out(0x1001, 1, P), Ok(0x1000..0x2000));
        assert_eq!(round_out(0x1fff, 2, P), Ok(0x1000..0x3000));
        assert_eq!(round_out(0x1fff, 1, P), Ok(0x1000..0x2000));
        assert_eq!(round_out(0, 1, P), Ok(0..0x1000));
        assert_eq!(
            round_out(0x1_0000, 0x1_0000, 0x1_0000),
            Ok(0x1_0000..0x2_0000)
        );
        assert_eq!(
            round_out(0x1_0001, 0x1_0000, 0x1_0000),
            Ok(0x1_0000..0x3_0000)
        );
    }

    #[test]
    fn zero_length_is_empty_at_its_page() {
        assert_eq!(round_out(0x1234, 0, P), Ok(0x1000..0x1000));
        assert_eq!(round_out(0x1000, 0, P), Ok(0x1000..0x1000));
        let last = usize::MAX & !(P - 1);
        assert_eq!(round_out(usize::MAX, 0, P), Ok(last..last));
    }

    #[test]
    fn overflow_is_an_error() {
        let err = RangeError::Overflow {
            addr: usize::MAX - 10,
            len: 20,
        };
        // addr + len itself wraps.
        assert_eq!(round_out(usize::MAX - 10, 20, P), Err(err));
        // addr + len fits, but rounding up to the next page does not.
        assert!(round_out(usize::MAX - 10, 5, P).is_err());
        assert!(round_out(usize::MAX, 1, P).is_err());
        // The last whole page below the top cannot be rounded up either: its end is 2^64.
        assert!(round_out(usize::MAX & !(P - 1), 1, P).is_err());
        // One page lower is fine.
        let top = (usize::MAX & !(P - 1)) - P;
        assert_eq!(round_out(top, P, P), Ok(top..top + P));
        assert!(err.to_string().contains("wraps"));
    }

    #[test]
    fn saturating_clamps_to_the_top() {
        assert_eq!(round_out_saturating(0x1001, 1, P), 0x1000..0x2000);
        assert_eq!(
            round_out_saturating(usize::MAX - 10, 20, P),
            (usize::MAX & !(P - 1))..usize::MAX
        );
    }

    #[test]
    fn extent_of_empty_range_is_one_byte() {
        assert_eq!(extent(&(0x1000..0x1000)), 0x1000..0x1001);
        assert_eq!(extent(&(0x1000..0x3000)), 0x1000..0x3000);
    }

    #[test]
    fn real_page_size_is_sane() {
        let ps = page_size();
        assert!(ps.is_power_of_two() && ps >= 4096, "{ps}");
        assert_eq!(page_size(), ps);
        assert_eq!(page_range(ps * 3 + 5, ps), Ok(ps * 3..ps * 5));
    }
}
