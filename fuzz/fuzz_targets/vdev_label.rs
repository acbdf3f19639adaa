#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::vdev_label(data));
