//! The reply writer of one connection.
//!
//! Completions (from any thread) send [`Outgoing::Reply`] over a channel;
//! this single thread owns the write side, so replies never interleave
//! bytes. Replies are batched in a buffer and flushed whenever the channel
//! runs dry; only then are their in-flight slots released, so the bound
//! covers replies still waiting to reach the socket.

use std::io::{self, BufWriter, Write};
use std::sync::mpsc::{Receiver, TryRecvError};

use bytes::Bytes;

use crate::gate::InFlightGate;
use crate::protocol::{encode_simple_reply_header, SimpleReplyHeader};
use crate::Errno;

/// Enough to batch many small replies into one send; larger read payloads
/// bypass the buffer.
const WRITE_BUFFER_BYTES: usize = 256 * 1024;

pub(crate) struct Reply {
    pub(crate) handle: u64,
    /// The READ payload (empty for other commands), or the error.
    pub(crate) result: Result<Bytes, Errno>,
    /// The bytes charged to the in-flight gate for this command.
    pub(crate) charge_bytes: u64,
}

pub(crate) enum Outgoing {
    Reply(Reply),
    /// Sent by the reader once no more replies will be needed.
    Stop,
}

/// Writes replies until `Stop` or until every sender is gone.
pub(crate) fn write_replies<W: Write>(sink: W, replies: &Receiver<Outgoing>, gate: &InFlightGate) -> io::Result<()> {
    let mut sink = BufWriter::with_capacity(WRITE_BUFFER_BYTES, sink);
    let mut unflushed_commands = 0usize;
    let mut unflushed_bytes = 0u64;
    loop {
        let outgoing = match replies.try_recv() {
            Ok(outgoing) => outgoing,
            Err(TryRecvError::Empty) => {
                sink.flush()?;
                gate.release(unflushed_commands, unflushed_bytes);
                (unflushed_commands, unflushed_bytes) = (0, 0);
                match replies.recv() {
                    Ok(outgoing) => outgoing,
                    Err(_) => return Ok(()),
                }
            }
            Err(TryRecvError::Disconnected) => Outgoing::Stop,
        };
        let reply = match outgoing {
            Outgoing::Reply(reply) => reply,
            Outgoing::Stop => {
                sink.flush()?;
                gate.release(unflushed_commands, unflushed_bytes);
                return Ok(());
            }
        };
        let error = match &reply.result {
            Ok(_) => 0,
            Err(errno) => errno.code(),
        };
        sink.write_all(&encode_simple_reply_header(&SimpleReplyHeader { error, handle: reply.handle }))?;
        if let Ok(data) = &reply.result {
            sink.write_all(data)?;
        }
        unflushed_commands += 1;
        unflushed_bytes += reply.charge_bytes;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;
    use crate::protocol::{decode_simple_reply_header, SIMPLE_REPLY_HEADER_LEN};

    #[test]
    fn writes_headers_and_payloads_then_releases_slots() {
        let gate = InFlightGate::new(4, 1024);
        assert!(gate.acquire(3));
        assert!(gate.acquire(0));
        let (sender, receiver) = mpsc::channel();
        let ok = Reply { handle: 7, result: Ok(Bytes::from_static(b"abc")), charge_bytes: 3 };
        sender.send(Outgoing::Reply(ok)).unwrap();
        sender.send(Outgoing::Reply(Reply { handle: 8, result: Err(Errno::NoSpc), charge_bytes: 0 })).unwrap();
        sender.send(Outgoing::Stop).unwrap();
        let mut out = Vec::new();
        write_replies(&mut out, &receiver, &gate).unwrap();

        let first = decode_simple_reply_header(&out[..SIMPLE_REPLY_HEADER_LEN]).unwrap();
        assert_eq!(first, SimpleReplyHeader { error: 0, handle: 7 });
        assert_eq!(&out[SIMPLE_REPLY_HEADER_LEN..SIMPLE_REPLY_HEADER_LEN + 3], b"abc");
        let second = decode_simple_reply_header(&out[SIMPLE_REPLY_HEADER_LEN + 3..]).unwrap();
        assert_eq!(second, SimpleReplyHeader { error: 28, handle: 8 });
        assert!(gate.wait_idle(), "both slots released");
    }
}
