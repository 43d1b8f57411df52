//! libFuzzer's bytes to [`qosd_fuzz::cgroup_stat`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::cgroup_stat(data));
