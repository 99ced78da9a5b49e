#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| plinth::fuzzing::bytes_elements_round_trip(data));
