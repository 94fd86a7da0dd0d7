//! The fault-injecting device queue ([`duplex_store::faults`]): a volatile
//! write cache that loses, reorders and tears unflushed writes, and the
//! faults a test can arm.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use duplex_store::device::{create_file, AlignedBuf, BlockIo, Device, DeviceConfig, DirectIo};
use duplex_store::{DeviceFaults, Fault};

/// A queue on the test's device file (made on first use), behind
/// `faults` if given. It holds the device's lock until dropped.
fn queue(dir: &std::path::Path, faults: Option<Arc<DeviceFaults>>) -> Box<dyn BlockIo> {
    let path = dir.join("disk");
    if !path.exists() {
        create_file(&path, 1 << 20).unwrap();
    }
    let config = DeviceConfig {
        direct_io: DirectIo::Fallback,
        lock_wait: Duration::from_secs(1),
        faults,
        ..DeviceConfig::default()
    };
    Device::open(&path, &config, true).unwrap().queue().unwrap()
}

fn read(io: &mut dyn BlockIo, offset: u64, len: usize) -> Vec<u8> {
    let mut buf = AlignedBuf::zeroed(len);
    io.read_many(&mut [(offset, &mut buf[..])]).unwrap();
    buf.to_vec()
}

fn write(io: &mut dyn BlockIo, offset: u64, byte: u8, len: usize) -> io::Result<()> {
    let buf = AlignedBuf::from_slice(&vec![byte; len]);
    io.write_many(&[(offset, &buf[..])])
}

#[test]
fn unflushed_writes_are_read_back_but_a_random_part_is_lost_and_torn_with_the_power() {
    let dir = tempfile::tempdir().unwrap();
    let faults = DeviceFaults::reordering(42);
    {
        let mut io = queue(dir.path(), Some(faults.clone()));
        write(io.as_mut(), 0, 1, 65536).unwrap();
        io.flush().unwrap();
        for sector in 0..64 {
            write(io.as_mut(), sector * 1024, 2, 1024).unwrap();
        }
        write(io.as_mut(), 1024, 3, 512).unwrap();
        assert_eq!(faults.unflushed_bytes(), 65536);
        let seen = read(io.as_mut(), 0, 65536);
        assert!(seen[..1024].iter().all(|b| *b == 2));
        assert!(seen[1024..1536].iter().all(|b| *b == 3), "the newest write wins");
        assert!(seen[1536..].iter().all(|b| *b == 2));
        // The queue goes away without a flush or a write-back: the power went.
    }
    assert_eq!(faults.unflushed_bytes(), 0, "the cache is gone with the queue");
    let mut io = queue(dir.path(), None);
    let left = read(io.as_mut(), 0, 65536);
    let sectors: Vec<u8> = left
        .chunks(512)
        .map(|sector| {
            assert!(sector.iter().all(|b| *b == sector[0]), "a sector lands whole");
            sector[0]
        })
        .collect();
    assert!(sectors.iter().all(|s| [1, 2, 3].contains(s)), "each sector holds a write's contents");
    // Half the requests land whole, early; then half the sectors still cached.
    let landed = sectors.iter().filter(|s| **s != 1).count();
    assert!(landed > 70 && landed < 120, "about three quarters of the sectors land: {landed} of 128");
    let torn = sectors.chunks(2).skip(2).filter(|request| request[0] != request[1]).count();
    assert!(torn > 0, "some 1 KiB writes tore at their sector boundary");
}

#[test]
fn a_dropped_queue_keeps_its_writes_only_when_the_device_kept_power() {
    for keep in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let faults = DeviceFaults::new();
        faults.set_write_back_on_drop(keep);
        {
            let mut io = queue(dir.path(), Some(faults.clone()));
            write(io.as_mut(), 4096, 7, 4096).unwrap();
        }
        assert_eq!(faults.unflushed_bytes(), 0, "the cache is gone with the queue");
        let mut io = queue(dir.path(), None);
        let expected = if keep { 7 } else { 0 };
        assert!(read(io.as_mut(), 4096, 4096).iter().all(|b| *b == expected), "keep={keep}");
    }
}

#[test]
fn a_flush_writes_the_cache_back() {
    let dir = tempfile::tempdir().unwrap();
    let faults = DeviceFaults::new();
    {
        let mut io = queue(dir.path(), Some(faults.clone()));
        for (sector, byte) in [(9u64, 9u8), (3, 3), (4, 4), (10, 10), (20, 20)] {
            write(io.as_mut(), sector * 512, byte, 512).unwrap();
        }
        io.flush().unwrap();
        assert_eq!(faults.unflushed_bytes(), 0);
    }
    let mut io = queue(dir.path(), None);
    let all = read(io.as_mut(), 0, 16384);
    for (sector, byte) in [(9usize, 9u8), (3, 3), (4, 4), (10, 10), (20, 20), (5, 0), (0, 0)] {
        assert!(all[sector * 512..(sector + 1) * 512].iter().all(|b| *b == byte), "sector {sector}");
    }
}

#[test]
fn a_failed_flush_loses_what_it_was_to_make_durable_and_fails_again() {
    let dir = tempfile::tempdir().unwrap();
    let faults = DeviceFaults::new();
    {
        let mut io = queue(dir.path(), Some(faults.clone()));
        write(io.as_mut(), 0, 7, 4096).unwrap();
        faults.arm(Fault::FlushEio);
        assert_eq!(io.flush().unwrap_err().raw_os_error(), Some(libc::EIO));
        assert_eq!(faults.dropped_bytes(), 4096);
        assert_eq!(faults.unflushed_bytes(), 0);
        assert!(io.flush().is_err(), "the fault stays armed");
        faults.arm(Fault::WriteEio);
        assert_eq!(write(io.as_mut(), 0, 8, 4096).unwrap_err().raw_os_error(), Some(libc::EIO));
    }
    let mut io = queue(dir.path(), None);
    let left = read(io.as_mut(), 0, 4096);
    assert!(left.iter().all(|b| *b == 0) || left.iter().all(|b| *b == 7), "whole, old or new");
}

#[test]
fn trigger_words() {
    assert_eq!(Fault::parse("flush-eio\n"), Some(Fault::FlushEio));
    assert_eq!(Fault::parse("write-eio"), Some(Fault::WriteEio));
    assert_eq!(Fault::parse("power-cut"), Some(Fault::PowerCut));
    assert_eq!(Fault::parse("reboot"), None);
}
