//! libFuzzer's bytes to [`qosd_fuzz::kubernetes_pod`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::kubernetes_pod(data));
