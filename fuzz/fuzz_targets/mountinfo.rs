//! libFuzzer's bytes to [`qosd_fuzz::mountinfo`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::mountinfo(data));
