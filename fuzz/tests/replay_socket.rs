//! Replays the `viad_socket` seeds and regressions against a real viad.

mod common;

#[test]
fn viad_socket() {
    common::replay("viad_socket", via_fuzz::viad_socket);
}
