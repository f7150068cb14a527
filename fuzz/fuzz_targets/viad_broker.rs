//! libFuzzer entry point of the `viad_broker` target (see `via_fuzz::viad_broker`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_fuzz::viad_broker(data));
