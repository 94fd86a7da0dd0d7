//! Replacing a failed mirror device while the store serves
//! (`mirror/rebuild.rs`): the new device is filled from the survivor while
//! writes go on, ends identical to it, and a stop in the middle leaves the
//! store whole on the survivor, ready for the replacement to be made again.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use duplex_store::device::{AlignedBuf, Device, DeviceConfig};
use duplex_store::mirror::rebuild::ReplaceOptions;
use duplex_store::mirror::{Health, MirrorConfig, MirrorMode};
use duplex_store::{DeviceFaults, DirectIo, Fault, IoBackend};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const DEVICE_BYTES: u64 = 4 << 20;

fn config(mode: MirrorMode, second: &Path, faults: [Option<Arc<DeviceFaults>>; 2]) -> DeviceConfig {
    let mut mirror = MirrorConfig::new(second.to_path_buf(), mode);
    mirror.region_bytes = 64 << 10;
    mirror.clean_interval = Duration::from_millis(20);
    mirror.faults = faults;
    DeviceConfig {
        backend: IoBackend::Pread,
        direct_io: DirectIo::Fallback,
        mirror: Some(mirror),
        ..DeviceConfig::default()
    }
}

/// Block `block` at `version`: every 8-byte word names both.
fn image(block: u64, version: u64) -> AlignedBuf {
    let mut buf = AlignedBuf::zeroed(BLOCK);
    for (i, word) in buf.chunks_mut(8).enumerate() {
        word.copy_from_slice(&(block << 40 | version << 8 | (i as u64 & 0xff)).to_le_bytes());
    }
    buf
}

fn write(queue: &mut Box<dyn duplex_store::device::BlockIo>, block: u64, version: u64) {
    let buf = image(block, version);
    queue.write_many(&[(block * BLOCK as u64, &buf[..])]).unwrap();
}

/// A pair on files `a` and `b` in `dir`, device `b` failing every write
/// from the first one on (after `before` blocks were written in sync):
/// the store runs degraded on `a`. Its device, and the blocks it has.
fn degraded_pair(dir: &Path, mode: MirrorMode, blocks: u64) -> (Device, BTreeMap<u64, u64>) {
    let (first, second) = (dir.join("a"), dir.join("b"));
    for path in [&first, &second] {
        duplex_store::device::create_file(path, DEVICE_BYTES).unwrap();
    }
    let faults = [None, Some(DeviceFaults::new())];
    drop(Device::create(&first, &config(mode, &second, faults.clone())).unwrap());
    let device = Device::open(&first, &config(mode, &second, faults.clone()), true).unwrap();
    let mut queue = device.queue().unwrap();
    let mut model = BTreeMap::new();
    for block in 0..blocks {
        write(&mut queue, block, 1);
        model.insert(block, 1);
    }
    queue.flush().unwrap();
    faults[1].as_ref().unwrap().arm(Fault::WriteEio);
    write(&mut queue, 0, 2);
    model.insert(0, 2);
    let status = device.mirror().unwrap().status();
    assert_eq!(status.health, [Health::InSync, Health::Failed], "{status:?}");
    (device, model)
}

fn wait_in_sync(device: &Device, within: Duration) {
    let started = Instant::now();
    loop {
        let status = device.mirror().unwrap().status();
        if !status.degraded() {
            assert!(status.rebuild.is_none(), "{status:?}");
            return;
        }
        assert!(started.elapsed() < within, "not in sync after {within:?}: {status:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Both devices' copies of every block the store may hold are identical,
/// and each is what `model` says was written last.
fn assert_identical(device: &Device, model: &BTreeMap<u64, u64>) {
    let mut queue = device.queue().unwrap();
    let store_blocks = device.mirror().unwrap().layout().store_bytes / BLOCK as u64;
    for block in 0..store_blocks {
        let mut copies = [AlignedBuf::zeroed(BLOCK), AlignedBuf::zeroed(BLOCK)];
        for (copy, buf) in copies.iter_mut().enumerate() {
            queue.read_copy(copy, &mut [(block * BLOCK as u64, &mut buf[..])]).unwrap();
        }
        assert!(copies[0][..] == copies[1][..], "block {block} differs between the devices after the rebuild");
        if let Some(version) = model.get(&block) {
            assert!(copies[0][..] == image(block, *version)[..], "block {block} lost its version {version}");
        }
    }
}

/// The failed device is replaced with a new one; while the copier fills
/// it (slowed so that it takes a while), writers rewrite random blocks
/// and every read returns the newest. Then the pair is in sync, the two
/// devices are identical block for block, and a remount finds them so.
#[test]
fn a_replaced_device_is_filled_while_writes_go_on_and_ends_identical() {
    for mode in [MirrorMode::ReadFlushSplit, MirrorMode::Plain] {
        let dir = tempfile::tempdir().unwrap();
        let (device, model) = degraded_pair(dir.path(), mode, 600);
        let fresh = dir.path().join("c");
        duplex_store::device::create_file(&fresh, DEVICE_BYTES).unwrap();
        let mirror = device.mirror().unwrap().clone();
        let model = Arc::new(Mutex::new(model));
        let stop = Arc::new(AtomicBool::new(false));
        let store_blocks = mirror.layout().store_bytes / BLOCK as u64;
        let writers: Vec<_> = (0..2u64)
            .map(|w| {
                let (mut queue, model, stop) = (device.queue().unwrap(), model.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(w + 7);
                    let mut version = 10 + w;
                    let mut writes = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        // Each writer owns every other block: no two race on one.
                        let block = rng.gen_range(0..store_blocks / 2) * 2 + w;
                        version += 2;
                        write(&mut queue, block, version);
                        model.lock().unwrap().insert(block, version);
                        let mut buf = AlignedBuf::zeroed(BLOCK);
                        queue.read_many(&mut [(block * BLOCK as u64, &mut buf[..])]).unwrap();
                        assert!(buf[..] == image(block, version)[..], "block {block} does not read its newest write");
                        if writes.is_multiple_of(16) {
                            queue.flush().unwrap();
                        }
                        writes += 1;
                    }
                    writes
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        // About 0.5 s for the 4 MiB: writes land before, in and after the copied region.
        mirror.replace(1, &fresh, ReplaceOptions { bytes_per_sec: 8 << 20, faults: None }).unwrap();
        let status = mirror.status();
        assert_eq!(status.health, [Health::InSync, Health::Rebuilding], "{status:?}");
        assert!(status.rebuild.is_some_and(|r| r.device == 1 && r.regions == mirror.layout().regions), "{status:?}");
        wait_in_sync(&device, Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(100));
        stop.store(true, Ordering::Relaxed);
        let writes: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert!(writes > 50, "the writers wrote {writes} blocks: too few to cross the copy");
        let model = model.lock().unwrap().clone();
        assert_identical(&device, &model);
        mirror.close().unwrap();
        drop(mirror);
        drop(device);
        // Mounted again with the new device in the old one's place: in sync, nothing to resync.
        let device = Device::open(&dir.path().join("a"), &config(mode, &fresh, [None, None]), true).unwrap();
        let status = device.mirror().unwrap().status();
        assert!(!status.degraded(), "{mode:?}: {status:?}");
        assert_eq!(status.resynced_regions, 0, "{status:?}");
        assert_identical(&device, &model);
        drop(device);
        // The device it replaced, named again by mistake: stale, and refused
        // (its own header still says it is in sync).
        let old = config(mode, &dir.path().join("b"), [None, None]);
        let err = Device::open(&dir.path().join("a"), &old, true).err().expect("the replaced device is refused");
        assert!(err.to_string().contains("stale"), "{err}");
    }
}

/// The store stops in the middle of a rebuild: mounted again, the new
/// device (half filled) is out and the store runs on the survivor with
/// every block; replaced again, it is filled whole.
#[test]
fn a_rebuild_cut_short_leaves_the_survivor_serving_and_can_be_made_again() {
    let dir = tempfile::tempdir().unwrap();
    let (device, model) = degraded_pair(dir.path(), MirrorMode::ReadFlushSplit, 900);
    let fresh = dir.path().join("c");
    duplex_store::device::create_file(&fresh, DEVICE_BYTES).unwrap();
    let mirror = device.mirror().unwrap().clone();
    mirror.replace(1, &fresh, ReplaceOptions { bytes_per_sec: 1 << 20, faults: None }).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let copied = mirror.status().rebuild.expect("still copying at 1 MiB/s").regions_copied;
    assert!(copied > 0 && copied < mirror.layout().regions, "{copied} regions copied");
    mirror.close().unwrap();
    drop(mirror);
    drop(device);
    // As if the store had stopped between the two header writes of the
    // replacement: the new device has none. It is out all the same.
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new().write(true).open(&fresh).unwrap();
        file.write_all_at(&[0u8; BLOCK], DEVICE_BYTES - BLOCK as u64).unwrap();
    }

    let device =
        Device::open(&dir.path().join("a"), &config(MirrorMode::ReadFlushSplit, &fresh, [None, None]), true).unwrap();
    let mirror = device.mirror().unwrap().clone();
    let status = mirror.status();
    assert_eq!(status.health, [Health::InSync, Health::Failed], "a half-filled device is out: {status:?}");
    let mut queue = device.queue().unwrap();
    for (block, version) in &model {
        let mut buf = AlignedBuf::zeroed(BLOCK);
        queue.read_many(&mut [(block * BLOCK as u64, &mut buf[..])]).unwrap();
        assert!(buf[..] == image(*block, *version)[..], "block {block} on the survivor");
    }
    mirror.replace(1, &fresh, ReplaceOptions::default()).unwrap();
    wait_in_sync(&device, Duration::from_secs(30));
    assert_identical(&device, &model);
}

/// Only a failed device is replaced, and never with the survivor itself.
#[test]
fn a_replacement_is_refused_for_a_device_in_sync_or_onto_the_survivor() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second, fresh) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
    for path in [&first, &second, &fresh] {
        duplex_store::device::create_file(path, DEVICE_BYTES).unwrap();
    }
    let healthy = config(MirrorMode::ReadFlushSplit, &second, [None, None]);
    drop(Device::create(&first, &healthy).unwrap());
    let device = Device::open(&first, &healthy, true).unwrap();
    let err = device.mirror().unwrap().replace(1, &fresh, ReplaceOptions::default()).unwrap_err();
    assert!(err.to_string().contains("only a failed device"), "{err}");
    drop(device);

    let dir = tempfile::tempdir().unwrap();
    let (device, _) = degraded_pair(dir.path(), MirrorMode::ReadFlushSplit, 10);
    let mirror = device.mirror().unwrap();
    let err = mirror.replace(1, &dir.path().join("a"), ReplaceOptions::default()).unwrap_err();
    assert!(err.to_string().contains("the mirror's other device"), "{err}");
    let small = dir.path().join("small");
    duplex_store::device::create_file(&small, 1 << 20).unwrap();
    let err = mirror.replace(1, &small, ReplaceOptions::default()).unwrap_err();
    assert!(err.to_string().contains("the mirror needs at least"), "{err}");
    assert_eq!(mirror.status().health, [Health::InSync, Health::Failed], "nothing changed");
}

/// A device gone at mount (a dead disk the next boot does not find): the
/// store starts on the other alone, says so, serves every block, and a
/// new device put in its place is filled. A device in use by another
/// process is not taken for gone: that mount fails.
#[test]
fn a_device_gone_at_mount_leaves_the_store_starting_degraded() {
    for gone in [0usize, 1] {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = (dir.path().join("a"), dir.path().join("b"));
        for path in [&first, &second] {
            duplex_store::device::create_file(path, DEVICE_BYTES).unwrap();
        }
        // Not the 10 s an OSD waits for a device a process before it still holds.
        let pair = DeviceConfig {
            lock_wait: Duration::from_millis(100),
            ..config(MirrorMode::ReadFlushSplit, &second, [None, None])
        };
        drop(Device::create(&first, &pair).unwrap());
        let mut model = BTreeMap::new();
        {
            let device = Device::open(&first, &pair, true).unwrap();
            let mut queue = device.queue().unwrap();
            for block in 0..300 {
                write(&mut queue, block, 3);
                model.insert(block, 3);
            }
            queue.flush().unwrap();
            device.mirror().unwrap().close().unwrap();
        }
        {
            // Another process holds the second device: not gone, and the mount says so.
            let holder =
                Device::open(&second, &DeviceConfig { direct_io: DirectIo::Fallback, ..Default::default() }, true)
                    .unwrap();
            let err = Device::open(&first, &pair, true).err().expect("a device in use fails the mount");
            assert!(err.to_string().to_lowercase().contains("in use"), "{err}");
            drop(holder);
        }
        let lost = [&first, &second][gone];
        std::fs::remove_file(lost).unwrap();
        let device = Device::open(&first, &pair, true).unwrap();
        let mirror = device.mirror().unwrap().clone();
        let status = mirror.status();
        assert_eq!(status.health[gone], Health::Failed, "device {gone} gone: {status:?}");
        assert_eq!(status.health[1 - gone], Health::InSync, "{status:?}");
        assert_eq!(status.flush_slot as usize, 1 - gone, "the survivor flushes");
        let mut queue = device.queue().unwrap();
        for (block, version) in &model {
            let mut buf = AlignedBuf::zeroed(BLOCK);
            queue.read_many(&mut [(block * BLOCK as u64, &mut buf[..])]).unwrap();
            assert!(buf[..] == image(*block, *version)[..], "block {block} on the survivor");
        }
        write(&mut queue, 7, 4);
        model.insert(7, 4);
        let fresh = dir.path().join("c");
        duplex_store::device::create_file(&fresh, DEVICE_BYTES).unwrap();
        mirror.replace(gone, &fresh, ReplaceOptions::default()).unwrap();
        wait_in_sync(&device, Duration::from_secs(30));
        assert_identical(&device, &model);
    }
}
