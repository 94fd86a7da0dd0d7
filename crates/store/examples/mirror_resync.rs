//! How long a mirrored store's mount takes to resync after a power cut
//! under load, against the device's size (issue 28; docs/BENCHMARKS.md).
//!
//! Per size: a store on two sparse files of that size (read-flush-split,
//! 1 MiB regions, a clean every 5 s), each behind a simulated volatile
//! write cache; 4 KiB random writes (batches of 32, one commit each) over
//! the first 1 GiB of objects for `--seconds`; then a power cut (both
//! caches dropped, torn) and a mount, which copies the dirty regions from
//! the flush device. Prints, per size, the regions and bytes copied, the
//! mount's time, and what a whole-device copy would move.
//!
//!     cargo run --release -p duplex-store --example mirror_resync -- [--sizes 1,4,16] [--seconds 12] [--dir /tmp]

use std::time::{Duration, Instant};

use duplex_store::device::DeviceConfig;
use duplex_store::mirror::{MirrorConfig, MirrorMode};
use duplex_store::{Batch, DeviceFaults, DirectIo, IoBackend, Key, MkfsOptions, Store, StoreConfig};
use rand::{Rng, SeedableRng};

const GIB: u64 = 1 << 30;
const OBJECT: u64 = 4 << 20;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned()).unwrap_or_else(|| default.into())
}

fn config(second: &std::path::Path, faults: Option<[std::sync::Arc<DeviceFaults>; 2]>) -> StoreConfig {
    let mut mirror = MirrorConfig::new(second.to_path_buf(), MirrorMode::ReadFlushSplit);
    mirror.faults = faults.map_or([None, None], |f| f.map(Some));
    StoreConfig {
        device: DeviceConfig {
            backend: IoBackend::Auto,
            direct_io: DirectIo::Fallback,
            mirror: Some(mirror),
            ..DeviceConfig::default()
        },
        ..StoreConfig::default()
    }
}

fn main() {
    let sizes: Vec<u64> = arg("--sizes", "1,4,16").split(',').map(|s| s.parse().expect("GiB")).collect();
    let seconds: u64 = arg("--seconds", "12").parse().expect("seconds");
    let base = std::path::PathBuf::from(arg("--dir", "/tmp"));
    println!("size_gib\twritten_gib\tresynced_regions\tresynced_mib\tresync_ms\tmount_ms");
    for size in sizes {
        let dir = tempfile::tempdir_in(&base).expect("temp dir");
        let (first, second) = (dir.path().join("a"), dir.path().join("b"));
        let options = MkfsOptions { partitions: 2, size_bytes: Some(size * GIB), ..MkfsOptions::default() };
        duplex_store::mkfs(&first, &options, &config(&second, None)).expect("mkfs");
        let faults = [DeviceFaults::reordering(size), DeviceFaults::reordering(size + 7)];
        let mut store = Store::open(&first, &config(&second, Some(faults.clone()))).expect("open");
        let mut rng = rand::rngs::StdRng::seed_from_u64(size);
        let started = Instant::now();
        let block = vec![0x5au8; 4096];
        let mut written = 0u64;
        let working_set = GIB.min(size * GIB / 2);
        while started.elapsed() < Duration::from_secs(seconds) {
            for group in 0..2u32 {
                let mut batch = Batch::new();
                for _ in 0..32 {
                    let at = rng.gen_range(0..working_set / 4096) * 4096;
                    let name = format!("obj{}", at / OBJECT);
                    let key = Key::in_group(group, name.as_bytes()).expect("key");
                    batch.write(key, at % OBJECT, block.clone());
                    written += 4096;
                }
                let index = store.partition_of(Key::in_group(group, b"obj0").expect("key").as_bytes());
                store.partition_mut(index).apply(&batch).expect("apply");
            }
        }
        // The power cut: every cache lost (torn), nothing closed.
        drop(store);
        let mounting = Instant::now();
        let store = Store::open(&first, &config(&second, None)).expect("mount");
        let mount_ms = mounting.elapsed().as_millis();
        let status = store.device().mirror().expect("a mirror").status();
        println!(
            "{size}\t{:.2}\t{}\t{}\t{}\t{mount_ms}",
            written as f64 / GIB as f64,
            status.resynced_regions,
            (status.resynced_regions * status.region_bytes) >> 20,
            status.resync_micros / 1000,
        );
        store.close().expect("close");
    }
}
