//! Reading a socket straight into a frame buffer's spare capacity.
//!
//! `Read::read` wants an initialised slice, so the obvious loop zeroes a
//! 64 KiB chunk on every call and then copies what arrived into the frame
//! buffer: a `memset` and a `memmove` per read, about 5% of an OSD's CPU
//! at 4 KiB writes (perf, issue 22). `read(2)` into the spare capacity
//! does neither. (`std`'s `read_buf`, which would make this safe code, is
//! not stable.)

use std::io;
use std::os::fd::AsRawFd;

use bytes::BytesMut;

/// Reads what the descriptor has, up to `chunk` bytes, appending it to
/// `buf`. `Ok(0)`: end of stream. Errors are the OS's (`WouldBlock` on a
/// non-blocking socket with nothing to read, `Interrupted`).
pub fn read_into<R: AsRawFd>(reader: &R, buf: &mut BytesMut, chunk: usize) -> io::Result<usize> {
    let chunk = chunk.max(1);
    // Frames split off the front keep the buffer shared, so growing it
    // means a new allocation: read into the room left while a quarter of
    // a chunk remains (a 4 KiB write's frame fits), and only then grow.
    if buf.capacity() - buf.len() < chunk.div_ceil(4) {
        buf.reserve(chunk);
    }
    let spare = buf.spare_capacity_mut();
    let want = spare.len().min(chunk);
    // SAFETY: the pointer and length describe memory `buf` owns and no one
    // else borrows during the call; read(2) only writes to it.
    let read = unsafe { libc::read(reader.as_raw_fd(), spare.as_mut_ptr().cast(), want) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    let read = read as usize;
    assert!(read <= want, "read(2) wrote past what it was given");
    // SAFETY: the kernel initialised the first `read` bytes of the spare capacity.
    unsafe { buf.set_len(buf.len() + read) };
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn appends_what_arrived_after_what_was_there() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let mut buf = BytesMut::from(&b"head:"[..]);
        assert_eq!(read_into(&b, &mut buf, 16).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        a.write_all(&[7u8; 40]).unwrap();
        assert_eq!(read_into(&b, &mut buf, 16).unwrap(), 16, "at most a chunk per call");
        assert_eq!(read_into(&b, &mut buf, 64).unwrap(), 24);
        let mut small = BytesMut::with_capacity(4);
        a.write_all(&[9u8; 10]).unwrap();
        assert_eq!(read_into(&b, &mut small, 64).unwrap(), 10, "grows when little room is left");
        assert_eq!(&small[..], &[9u8; 10]);
        assert_eq!(&buf[..5], b"head:");
        assert!(buf[5..].iter().all(|&x| x == 7) && buf.len() == 45);
        drop(a);
        assert_eq!(read_into(&b, &mut buf, 64).unwrap(), 0, "end of stream");
    }
}
