#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| plinth::fuzzing::config_pbtxt(data));
