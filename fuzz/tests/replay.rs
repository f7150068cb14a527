//! Replays the seed corpus and the saved regressions of the pure targets
//! (no libFuzzer: plain `cargo test`), and checks that `seeds/` is what
//! `via_fuzz::seeds` generates.

mod common;

#[test]
fn seeds_are_current() {
    common::check_seeds();
}

#[test]
fn viad_request() {
    common::replay("viad_request", via_fuzz::viad_request);
}

#[test]
fn viad_broker() {
    common::replay("viad_broker", via_fuzz::viad_broker);
}
