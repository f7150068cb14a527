//! Replays the `descriptor` seeds and regressions (a process of its own:
//! the target sets `VIA_INSTANCE` and keeps a NIC open).

mod common;

#[test]
fn descriptor() {
    common::replay("descriptor", via_fuzz::descriptor);
}
