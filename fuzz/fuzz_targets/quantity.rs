//! libFuzzer's bytes to [`qosd_fuzz::quantity`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::quantity(data));
