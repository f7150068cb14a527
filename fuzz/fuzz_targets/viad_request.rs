//! libFuzzer entry point of the `viad_request` target (see `via_fuzz::viad_request`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_fuzz::viad_request(data));
