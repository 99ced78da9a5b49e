#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| plinth::fuzzing::shared_memory(data));
