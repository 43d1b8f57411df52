//! libFuzzer's bytes to [`qosd_fuzz::kubelet_config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::kubelet_config(data));
