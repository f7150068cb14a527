//! libFuzzer entry point of the `descriptor` target (see `via_fuzz::descriptor`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_fuzz::descriptor(data));
