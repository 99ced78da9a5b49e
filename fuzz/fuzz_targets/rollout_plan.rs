#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| plinth::fuzzing::rollout_plan(data));
