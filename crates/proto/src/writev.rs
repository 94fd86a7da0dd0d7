//! Sending a queue of byte buffers with as few `writev` calls as the
//! socket allows: large payloads go out from where they already are.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};

use bytes::{Buf, Bytes};

/// Buffers handed to one `writev`.
const MAX_SLICES: usize = 64;

/// Writes from the front of `queue` until it is empty or the writer would
/// block (`Ok` either way; what was not taken stays queued).
pub fn drain<W: Write>(writer: &mut W, queue: &mut VecDeque<Bytes>) -> io::Result<()> {
    while !queue.is_empty() {
        let slices: Vec<IoSlice<'_>> = queue.iter().take(MAX_SLICES).map(|b| IoSlice::new(b)).collect();
        match writer.write_vectored(&slices) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the socket took nothing")),
            Ok(mut written) => {
                while written > 0 {
                    let front = queue.front_mut().expect("bytes were written from it");
                    if written >= front.len() {
                        written -= front.len();
                        queue.pop_front();
                    } else {
                        front.advance(written);
                        written = 0;
                    }
                }
            }
            // NotConnected: a non-blocking connect still in progress.
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::NotConnected) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `room` bytes per call, then would block.
    struct Trickle {
        taken: Vec<u8>,
        room: usize,
        calls: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(3) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            let mut n = 0;
            for buf in bufs {
                let take = buf.len().min(self.room - n);
                self.taken.extend_from_slice(&buf[..take]);
                n += take;
                if n == self.room {
                    break;
                }
            }
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn partial_writes_resume_where_they_stopped() {
        let parts: Vec<Bytes> = (0..20u8).map(|i| Bytes::from(vec![i; 1 + i as usize * 7])).collect();
        let expected: Vec<u8> = parts.iter().flat_map(|b| b.to_vec()).collect();
        let mut queue: VecDeque<Bytes> = parts.into_iter().collect();
        let mut writer = Trickle { taken: Vec::new(), room: 13, calls: 0 };
        while !queue.is_empty() {
            drain(&mut writer, &mut queue).unwrap();
        }
        assert_eq!(writer.taken, expected);
    }
}
