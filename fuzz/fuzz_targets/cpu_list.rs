//! libFuzzer's bytes to [`qosd_fuzz::cpu_list`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::cpu_list(data));
