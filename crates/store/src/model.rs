//! A device model for tests and benchmarks: a commodity SSD without
//! power-loss protection, whose cache flush takes milliseconds and holds
//! up every request queued behind it on that device (issue 28, and the
//! thesis behind read/flush separation, ../shared/papers/001).
//!
//! A virtio disk in a VM, or a file on one, does not show that by itself:
//! its flushes are quick, or do not stall reads. With a [`FlushStall`] in
//! its [`DeviceConfig`](crate::DeviceConfig), every queue of a device takes
//! a shared lock for each read and write, and a flush takes it exclusively
//! for the configured time before the real flush. Benchmarks that use it
//! say so next to their figures.

use std::io;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::blockio::{BlockIo, FlushHandle, IoStats};

/// What one modelled device's queues share.
#[derive(Debug)]
pub struct FlushStall {
    latency: Duration,
    /// Shared by reads and writes, exclusive for a flush; the standard
    /// lock makes a waiting flush hold back new readers, as a device's
    /// queue holds requests behind a flush command.
    busy: RwLock<()>,
}

impl FlushStall {
    /// A device whose every flush takes `latency` (besides the real one).
    pub fn new(latency: Duration) -> Arc<FlushStall> {
        assert!(latency < Duration::from_secs(60), "a modelled flush of {latency:?}: a typo?");
        Arc::new(FlushStall { latency, busy: RwLock::new(()) })
    }

    pub fn latency(&self) -> Duration {
        self.latency
    }

    fn stall<T>(&self, flush: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let _busy = self.busy.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        std::thread::sleep(self.latency);
        flush()
    }

    fn pass<T>(&self, request: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
        let _busy = self.busy.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        request()
    }
}

/// A queue of a modelled device.
pub(crate) struct StallingIo {
    inner: Box<dyn BlockIo>,
    device: Arc<FlushStall>,
}

impl StallingIo {
    pub(crate) fn new(inner: Box<dyn BlockIo>, device: Arc<FlushStall>) -> StallingIo {
        StallingIo { inner, device }
    }
}

struct StallingFlush {
    inner: Arc<dyn FlushHandle>,
    device: Arc<FlushStall>,
}

impl FlushHandle for StallingFlush {
    fn flush(&self) -> io::Result<()> {
        self.device.stall(|| self.inner.flush())
    }
}

impl BlockIo for StallingIo {
    fn read_many(&mut self, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let inner = &mut self.inner;
        self.device.pass(|| inner.read_many(requests))
    }

    fn write_many(&mut self, requests: &[(u64, &[u8])]) -> io::Result<()> {
        let inner = &mut self.inner;
        self.device.pass(|| inner.write_many(requests))
    }

    fn flush(&mut self) -> io::Result<()> {
        let inner = &mut self.inner;
        self.device.stall(|| inner.flush())
    }

    fn flush_handle(&self) -> Arc<dyn FlushHandle> {
        Arc::new(StallingFlush { inner: self.inner.flush_handle(), device: self.device.clone() })
    }

    fn stats(&self) -> IoStats {
        self.inner.stats()
    }

    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A queue that reads and writes nothing, to time the model alone.
    struct Nothing;

    impl BlockIo for Nothing {
        fn read_many(&mut self, _: &mut [(u64, &mut [u8])]) -> io::Result<()> {
            Ok(())
        }
        fn write_many(&mut self, _: &[(u64, &[u8])]) -> io::Result<()> {
            Ok(())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
        fn flush_handle(&self) -> Arc<dyn FlushHandle> {
            struct Done;
            impl FlushHandle for Done {
                fn flush(&self) -> io::Result<()> {
                    Ok(())
                }
            }
            Arc::new(Done)
        }
        fn stats(&self) -> IoStats {
            IoStats::default()
        }
        fn engine(&self) -> &'static str {
            "nothing"
        }
    }

    /// A read on the device waits for a flush another queue of it started
    /// (it gets in only after the real flush returned); a read on another
    /// modelled device does not (it is done while the flush still stalls).
    #[test]
    fn a_read_waits_behind_a_flush_of_its_device_only() {
        let latency = Duration::from_secs(1);
        let (device, other) = (FlushStall::new(latency), FlushStall::new(latency));
        let flushed = Arc::new(AtomicBool::new(false));
        let handle = StallingFlush { inner: Arc::new(Marks(flushed.clone())), device: device.clone() };
        let flusher = std::thread::spawn(move || handle.flush());
        // Until the flush holds the device.
        while device.busy.try_read().is_ok() {
            std::thread::yield_now();
        }
        let mut buf = [0u8; 512];
        StallingIo::new(Box::new(Nothing), other).read_many(&mut [(0, &mut buf[..])]).unwrap();
        assert!(!flushed.load(Ordering::SeqCst), "a read of another device waited for this one's flush");
        StallingIo::new(Box::new(Nothing), device).read_many(&mut [(0, &mut buf[..])]).unwrap();
        assert!(flushed.load(Ordering::SeqCst), "a read went ahead of its device's flush");
        flusher.join().unwrap().unwrap();
    }

    /// A flush that marks when it is done.
    struct Marks(Arc<AtomicBool>);

    impl FlushHandle for Marks {
        fn flush(&self) -> io::Result<()> {
            self.0.store(true, Ordering::SeqCst);
            Ok(())
        }
    }
}
