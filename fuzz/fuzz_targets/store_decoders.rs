//! Arbitrary bytes as on-disk structures: superblock, onode slot and blob,
//! journal record. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    duplex_store::fuzzing::decode_all(data);
});
