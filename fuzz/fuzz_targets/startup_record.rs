#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| gpubake_fuzz::startup_record(data));
