//! Arbitrary bytes as an encoded cluster map or map delta. Nothing may panic,
//! and a map that decodes must validate and place PGs without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(map) = duplex_map::codec::decode_map(data) {
        let hierarchy = map.hierarchy();
        for pool in map.pools.values() {
            let _ = map.acting(&hierarchy, pool, 0);
        }
    }
    let _ = duplex_map::codec::decode_delta(data);
});
