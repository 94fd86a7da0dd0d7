//! The store on a real block device (a loop device over a file, with direct
//! I/O): size and sector size come from the device ioctls, and everything
//! works as on a file. Needs root and losetup; skipped, saying so, without.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use duplex_store::{fsck, mkfs, IoBackend, MkfsOptions, Store};

/// A loop device detached on drop, even when the test fails.
struct LoopDevice(PathBuf);

impl LoopDevice {
    fn attach(backing: &Path) -> Option<LoopDevice> {
        let out = Command::new("losetup").args(["--direct-io=on", "-f", "--show"]).arg(backing).output().ok()?;
        if !out.status.success() {
            eprintln!("skipping: losetup failed: {}", String::from_utf8_lossy(&out.stderr).trim());
            return None;
        }
        Some(LoopDevice(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn the_store_runs_on_a_block_device() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipping: block device test needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::File::create(&backing).unwrap().set_len(64 << 20).unwrap();
    let Some(device) = LoopDevice::attach(&backing) else { return };
    let config = test_config(IoBackend::Auto);

    let options = MkfsOptions { partitions: 2, bytes_per_onode: 16 << 10, ..MkfsOptions::default() };
    let superblock = mkfs(&device.0, &options, &config).unwrap();
    assert_eq!(superblock.device_blocks, (64 << 20) / 4096, "size read with BLKGETSIZE64");
    assert!(superblock.sector_size == 512 || superblock.sector_size == 4096);

    let mut store = Store::open(&device.0, &config).unwrap();
    let mut model = Model::default();
    let mut rng = rng(77);
    for _ in 0..40 {
        let batch = random_batch(&mut rng, 2, 4, 5);
        let (group, single) = first_group_only(batch);
        let expected = model.apply(&single);
        let result = store.partition_for(&group.to_be_bytes()).apply(&single);
        assert_eq!(expected.is_ok(), result.is_ok(), "{result:?}");
    }
    assert_matches_model(&mut store, &model);
    store.close().unwrap();
    let report = fsck(&device.0, &config, true);
    assert!(report.clean, "{report:#?}");
    let mut store = Store::open(&device.0, &config).unwrap();
    assert_matches_model(&mut store, &model);
}
