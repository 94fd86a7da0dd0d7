//! One accepted socket, TCP or unix, shared by a connection's threads.
//!
//! `&TcpStream` and `&UnixStream` implement Read and Write, so the reader
//! thread, the writer thread and the server (which shuts the socket down to
//! close a connection) share one `Arc<Stream>` without duplicating the fd.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Blocking mode, and TCP_NODELAY: replies are small and latency-bound,
    /// and the spec asks both sides to disable Nagle.
    pub(crate) fn configure(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => {
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)
            }
            Stream::Unix(stream) => stream.set_nonblocking(false),
        }
    }

    pub(crate) fn peer(&self) -> String {
        match self {
            Stream::Tcp(stream) => stream.peer_addr().map_or_else(|_| "tcp:?".to_string(), |addr| addr.to_string()),
            Stream::Unix(_) => "unix".to_string(),
        }
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_read_timeout(timeout),
            Stream::Unix(stream) => stream.set_read_timeout(timeout),
        }
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(stream) => stream.set_write_timeout(timeout),
            Stream::Unix(stream) => stream.set_write_timeout(timeout),
        }
    }

    /// Unblocks every thread reading or writing this socket.
    pub(crate) fn shutdown(&self) {
        self.shutdown_how(Shutdown::Both);
    }

    /// Makes reads see end of stream while replies can still be written.
    pub(crate) fn shutdown_read(&self) {
        self.shutdown_how(Shutdown::Read);
    }

    fn shutdown_how(&self, how: Shutdown) {
        // NotConnected just means the peer went first.
        let _ = match self {
            Stream::Tcp(stream) => stream.shutdown(how),
            Stream::Unix(stream) => stream.shutdown(how),
        };
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(stream) => (&*stream).read(buf),
            Stream::Unix(stream) => (&*stream).read(buf),
        }
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(stream) => (&*stream).write(buf),
            Stream::Unix(stream) => (&*stream).write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match *self {
            Stream::Tcp(stream) => (&*stream).write_vectored(bufs),
            Stream::Unix(stream) => (&*stream).write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads and writes that fail once `deadline` passes, however the peer
/// dribbles its bytes: a per-call socket timeout alone would let a slow
/// client stretch the handshake forever, one byte per timeout.
pub(crate) struct DeadlineStream {
    stream: Arc<Stream>,
    deadline: Option<Instant>,
}

impl DeadlineStream {
    pub(crate) fn new(stream: Arc<Stream>, deadline: Option<Instant>) -> Self {
        DeadlineStream { stream, deadline }
    }

    /// Ends the deadline (the handshake is over; idle connections are normal).
    pub(crate) fn clear_deadline(&mut self) -> io::Result<()> {
        self.deadline = None;
        self.stream.set_read_timeout(None)?;
        self.stream.set_write_timeout(None)
    }

    fn remaining(&self) -> io::Result<Option<Duration>> {
        let Some(deadline) = self.deadline else { return Ok(None) };
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "handshake deadline passed"));
        }
        Ok(Some(remaining))
    }
}

impl Read for DeadlineStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(remaining) = self.remaining()? {
            self.stream.set_read_timeout(Some(remaining))?;
        }
        (&*self.stream).read(buf)
    }
}

impl Write for DeadlineStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some(remaining) = self.remaining()? {
            self.stream.set_write_timeout(Some(remaining))?;
        }
        (&*self.stream).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
