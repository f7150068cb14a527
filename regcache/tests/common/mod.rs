//! A counting [`Pinner`] shared by the integration tests.

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use regcache::Pinner;

/// What [`Counting`] hands out: a unique id and the pages it was pinned for.
#[derive(Debug)]
pub struct Token {
    pub id: u64,
    pub pages: Range<usize>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Refused;

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("refused by the test pinner")
    }
}

impl std::error::Error for Refused {}

#[derive(Debug, Default)]
pub struct Ledger {
    /// Id the next pin gets; ids only grow.
    pub next_id: u64,
    /// Pins not yet unpinned.
    pub live: HashMap<u64, Range<usize>>,
    pub pins: u64,
    pub unpins: u64,
    /// Pins of a range holding this address fail.
    pub refuse: Option<usize>,
}

/// Pinner that keeps a ledger of live pins, and panics on an unpin of anything that is not
/// live (a double unpin) or with the wrong range. Clones share the ledger, so a test can read
/// it after the cache is gone.
#[derive(Debug, Clone, Default)]
pub struct Counting(Arc<Mutex<Ledger>>);

impl Counting {
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Checks that nothing is pinned any more and every pin was unpinned exactly once.
    pub fn assert_all_unpinned(&self) {
        let ledger = self.ledger();
        assert!(ledger.live.is_empty(), "still pinned: {:x?}", ledger.live);
        assert_eq!(ledger.pins, ledger.unpins);
    }
}

impl Pinner for Counting {
    type Pinned = Token;
    type Error = Refused;

    fn pin(&self, pages: Range<usize>) -> Result<Token, Refused> {
        let mut ledger = self.ledger();
        if ledger.refuse.is_some_and(|a| pages.contains(&a)) {
            return Err(Refused);
        }
        let id = ledger.next_id;
        ledger.next_id += 1;
        ledger.pins += 1;
        ledger.live.insert(id, pages.clone());
        Ok(Token { id, pages })
    }

    fn unpin(&self, pages: Range<usize>, token: Token) {
        let mut ledger = self.ledger();
        let was = ledger.live.remove(&token.id);
        assert_eq!(
            was.as_ref(),
            Some(&pages),
            "unpin of token {} not live or wrong range",
            token.id
        );
        assert_eq!(token.pages, pages);
        ledger.unpins += 1;
    }
}

/// The extent a page range stands for in lookups: an empty range is the first byte of its page.
pub fn extent(pages: &Range<usize>) -> Range<usize> {
    pages.start..pages.end.max(pages.start + 1)
}

pub fn overlaps(a: &Range<usize>, b: &Range<usize>) -> bool {
    let (a, b) = (extent(a), extent(b));
    a.start < b.end && b.start < a.end
}

pub fn covers(outer: &Range<usize>, inner: &Range<usize>) -> bool {
    let (outer, inner) = (extent(outer), extent(inner));
    outer.start <= inner.start && inner.end <= outer.end
}
