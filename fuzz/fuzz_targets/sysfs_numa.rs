//! libFuzzer's bytes to [`qosd_fuzz::sysfs_numa`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| qosd_fuzz::sysfs_numa(data));
