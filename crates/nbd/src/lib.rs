//! # duplex-nbd: an NBD server for any block image
//!
//! Speaks the fixed-newstyle [NBD protocol] (handshake with
//! `NBD_OPT_GO`/`INFO`/`LIST`/`EXPORT_NAME`, simple replies) over TCP or
//! unix sockets, and serves whatever implements [`Export`]. The Duplex
//! client plugs its volume in here; [`memory::MemoryExport`] is a RAM disk
//! for tests and examples.
//!
//! - [`protocol`]: constants and pure encoders/decoders of the wire format.
//! - `handshake`: option haggling until the client picks an export.
//! - `connection`: one connection from accept to close (its two threads).
//! - `transmission`: the per-connection command loop (reader side).
//! - `writer`: the per-connection reply writer thread.
//! - `gate`: the in-flight bound that applies back-pressure to a client.
//! - [`server`]: listener, accept loop, connection limit, shutdown.
//!
//! ## Threads and the Export contract
//!
//! Each connection has a reader thread (handshake, then decode requests and
//! call the [`Export`]) and a writer thread (sends replies in completion
//! order). Export calls are made on the reader thread and must not block
//! for long: start the I/O, return, and call the [`Done`] when it finishes,
//! from any thread. Up to `max_in_flight_per_connection` commands per
//! connection are outstanding at once, and several connections may use one
//! export, so an Export must handle concurrent, overlapping calls; the
//! server makes no ordering promise between in-flight commands (NBD allows
//! none). See [`Export`] for the per-call rules.
//!
//! ## Example: a Vec-backed memory disk
//!
//! ```no_run
//! use std::sync::{Arc, Mutex};
//!
//! use bytes::Bytes;
//! use duplex_nbd::{Done, Errno, Export, ExportMap, Listener, Server, ServerConfig};
//!
//! struct RamDisk(Mutex<Vec<u8>>);
//!
//! impl RamDisk {
//!     /// Re-checks bounds: the server checked them against an earlier `size()`.
//!     fn with_range<T>(&self, offset: u64, len: u64, f: impl FnOnce(&mut [u8]) -> T) -> Result<T, Errno> {
//!         let mut disk = self.0.lock().map_err(|_| Errno::Io)?;
//!         let start = usize::try_from(offset).map_err(|_| Errno::Inval)?;
//!         let end = start.checked_add(usize::try_from(len).map_err(|_| Errno::Inval)?).ok_or(Errno::Inval)?;
//!         disk.get_mut(start..end).map(f).ok_or(Errno::Inval)
//!     }
//! }
//!
//! impl Export for RamDisk {
//!     fn size(&self) -> u64 {
//!         self.0.lock().map(|disk| disk.len() as u64).unwrap_or(0)
//!     }
//!     fn read(&self, offset: u64, len: u32, done: Done<Bytes>) {
//!         done(self.with_range(offset, len.into(), |range| Bytes::copy_from_slice(range)));
//!     }
//!     fn write(&self, offset: u64, data: Bytes, _fua: bool, done: Done<()>) {
//!         done(self.with_range(offset, data.len() as u64, |range| range.copy_from_slice(&data)));
//!     }
//!     fn flush(&self, done: Done<()>) {
//!         done(Ok(())); // RAM is as durable as it gets
//!     }
//!     fn trim(&self, offset: u64, len: u32, done: Done<()>) {
//!         done(self.with_range(offset, len.into(), |range| range.fill(0)));
//!     }
//!     fn write_zeroes(&self, offset: u64, len: u32, _may_trim: bool, done: Done<()>) {
//!         done(self.with_range(offset, len.into(), |range| range.fill(0)));
//!     }
//! }
//!
//! fn main() -> std::io::Result<()> {
//!     let disk: Arc<dyn Export> = Arc::new(RamDisk(Mutex::new(vec![0; 64 << 20])));
//!     let exports = ExportMap::new().with("ram", disk).with_default("ram");
//!     let listener = Listener::Tcp(std::net::TcpListener::bind("127.0.0.1:10809")?);
//!     let server = Server::new(listener, Arc::new(exports), ServerConfig::default());
//!     println!("serving on {}", server.local_addr()); // try: nbdinfo nbd://127.0.0.1/ram
//!     server.run()
//! }
//! ```
//!
//! [NBD protocol]: https://github.com/NetworkBlockDevice/nbd/blob/master/doc/proto.md

use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;

mod config;
mod connection;
mod exports;
mod gate;
mod handshake;
pub mod memory;
pub mod protocol;
pub mod server;
mod stream;
mod transmission;
mod writer;

pub use config::ServerConfig;
pub use exports::ExportMap;
pub use server::{Listener, Server, ShutdownHandle};

/// An error a command ends with; each maps to an NBD error number on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum Errno {
    /// EPERM (1): e.g. a write to a read-only export.
    #[error("operation not permitted (EPERM)")]
    Perm,
    /// EIO (5): the backing store failed.
    #[error("input/output error (EIO)")]
    Io,
    /// ENOMEM (12): the spec asks servers to avoid it where at all possible.
    #[error("cannot allocate memory (ENOMEM)")]
    NoMem,
    /// EINVAL (22): malformed or out-of-range request.
    #[error("invalid argument (EINVAL)")]
    Inval,
    /// ENOSPC (28): a write past the end, or the store is full.
    #[error("no space left on device (ENOSPC)")]
    NoSpc,
    /// EOVERFLOW (75).
    #[error("value too large (EOVERFLOW)")]
    Overflow,
    /// ENOTSUP (95).
    #[error("operation not supported (ENOTSUP)")]
    NotSup,
    /// ESHUTDOWN (108): the server is shutting down; the client must disconnect.
    #[error("server is shutting down (ESHUTDOWN)")]
    Shutdown,
}

impl Errno {
    /// The NBD error number sent in a reply.
    pub const fn code(self) -> u32 {
        match self {
            Errno::Perm => 1,
            Errno::Io => 5,
            Errno::NoMem => 12,
            Errno::Inval => 22,
            Errno::NoSpc => 28,
            Errno::Overflow => 75,
            Errno::NotSup => 95,
            Errno::Shutdown => 108,
        }
    }

    /// The inverse of [`Errno::code`]; `None` for 0 and for numbers NBD does not define.
    pub const fn from_code(code: u32) -> Option<Errno> {
        match code {
            1 => Some(Errno::Perm),
            5 => Some(Errno::Io),
            12 => Some(Errno::NoMem),
            22 => Some(Errno::Inval),
            28 => Some(Errno::NoSpc),
            75 => Some(Errno::Overflow),
            95 => Some(Errno::NotSup),
            108 => Some(Errno::Shutdown),
            _ => None,
        }
    }
}

impl From<&std::io::Error> for Errno {
    /// Maps an OS error the way the spec asks (EDQUOT and EFBIG become ENOSPC);
    /// anything without an NBD equivalent becomes EIO.
    fn from(error: &std::io::Error) -> Errno {
        match error.raw_os_error() {
            Some(libc::EPERM | libc::EACCES | libc::EROFS) => Errno::Perm,
            Some(libc::ENOMEM) => Errno::NoMem,
            Some(libc::EINVAL) => Errno::Inval,
            Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG) => Errno::NoSpc,
            Some(libc::EOVERFLOW) => Errno::Overflow,
            Some(libc::EOPNOTSUPP) => Errno::NotSup,
            Some(libc::ESHUTDOWN) => Errno::Shutdown,
            Some(_) => Errno::Io,
            None => match error.kind() {
                std::io::ErrorKind::PermissionDenied => Errno::Perm,
                std::io::ErrorKind::InvalidInput => Errno::Inval,
                std::io::ErrorKind::OutOfMemory => Errno::NoMem,
                std::io::ErrorKind::Unsupported => Errno::NotSup,
                _ => Errno::Io,
            },
        }
    }
}

impl From<std::io::Error> for Errno {
    fn from(error: std::io::Error) -> Errno {
        Errno::from(&error)
    }
}

/// Completion callback: may be called from any thread, exactly once,
/// possibly before the call that received it returns.
///
/// Calling it only queues the reply (a channel send), so it is cheap and
/// never blocks. Dropping it without calling it is a bug in the Export; the
/// server then answers EIO and logs a warning rather than hanging the client.
pub type Done<T> = Box<dyn FnOnce(Result<T, Errno>) + Send + 'static>;

/// One export (one block image).
///
/// Calls are asynchronous: the server issues many at once (pipelining) and
/// replies as each completes, in completion order. Every call is made on a
/// connection's reader thread, which reads no further requests until the
/// call returns, so a call should start the work and return quickly.
///
/// What the server has already checked before calling (against the
/// [`Export::size`] read when the request arrived; the size may change in
/// between, so an Export must still bounds-check and may answer EINVAL or
/// ENOSPC itself):
/// - `offset + len <= size()` for read, write, trim and write_zeroes;
/// - `len <= 32 MiB` for read and write (`protocol::BLOCK_SIZE_MAX`); trim and
///   write_zeroes carry no payload and may cover up to `u32::MAX` bytes;
/// - `len > 0` (zero-length commands are answered without calling the Export);
/// - write, trim and write_zeroes are never called when `read_only()` was true
///   at handshake time.
///
/// The server advertises `NBD_FLAG_CAN_MULTI_CONN`, so a completed flush (and
/// a FUA write) must make the data durable and visible to every connection,
/// not just the one that asked.
pub trait Export: Send + Sync + 'static {
    /// The size in bytes. May change between calls (resize); read per request.
    fn size(&self) -> u64;

    /// Advertised as `NBD_FLAG_READ_ONLY` at handshake time.
    fn read_only(&self) -> bool {
        false
    }

    /// Reads `len` bytes at `offset`. Must deliver exactly `len` bytes; any
    /// other length is answered with EIO (a simple reply cannot be partial).
    fn read(&self, offset: u64, len: u32, done: Done<Bytes>);

    /// Writes `data` at `offset`. With `fua`, `done` must not be called until
    /// the data is durable.
    fn write(&self, offset: u64, data: Bytes, fua: bool, done: Done<()>);

    /// Makes every write that completed before this call durable.
    fn flush(&self, done: Done<()>);

    /// The range is no longer needed; its contents are unspecified afterwards
    /// (a no-op is a valid implementation). A FUA trim is followed by a flush
    /// by the server.
    fn trim(&self, offset: u64, len: u32, done: Done<()>);

    /// The range must read back as zeroes. `may_trim` is false when the client
    /// set `NBD_CMD_FLAG_NO_HOLE` (the range must stay allocated). A FUA
    /// write_zeroes is followed by a flush by the server.
    fn write_zeroes(&self, offset: u64, len: u32, may_trim: bool, done: Done<()>);
}

/// The exports a server offers, by name.
pub trait Exports: Send + Sync + 'static {
    /// The names listed for `NBD_OPT_LIST`.
    fn names(&self) -> Vec<String>;

    /// The export called `name`; `""` is the default export.
    fn open(&self, name: &str) -> Option<Arc<dyn Export>>;

    /// A human-readable description, sent with `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION`.
    fn description(&self, _name: &str) -> Option<String> {
        None
    }
}
