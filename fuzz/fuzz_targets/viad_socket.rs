//! libFuzzer entry point of the `viad_socket` target (see `via_fuzz::viad_socket`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| via_fuzz::viad_socket(data));
