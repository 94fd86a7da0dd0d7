//! The transmission phase of one connection, reader side.
//!
//! Decodes requests, checks each against the export ([`plan`], pure), takes
//! an in-flight slot, and starts the command on the [`Export`]; the
//! completion queues the reply for the writer thread. Replies go out in
//! completion order; NBD promises no ordering between in-flight commands.
//!
//! Errors that leave the stream in sync (bad flags, out of range, read-only)
//! are answered with an NBD error. What desynchronises it (a bad request
//! magic, a WRITE payload over [`BLOCK_SIZE_MAX`] that we refuse to buffer,
//! a truncated request) ends the connection.

use std::io::{self, Read};
use std::sync::mpsc::Sender;
use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;
use tracing::warn;

use crate::gate::InFlightGate;
use crate::protocol::*;
use crate::writer::{Outgoing, Reply};
use crate::{Done, Errno, Export};

/// How a command will be served, decided from the request header alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    Read {
        offset: u64,
        length: u32,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        may_trim: bool,
    },
    /// Answer success without calling the export (zero lengths, CACHE).
    /// `payload_len` bytes follow the header and are discarded.
    Succeed {
        payload_len: u32,
    },
    /// Answer `errno` after discarding `payload_len` bytes of WRITE payload.
    Reject {
        errno: Errno,
        payload_len: u32,
    },
    /// NBD_CMD_DISC: finish in-flight commands, then close.
    Disconnect,
    /// The stream cannot be resynchronised.
    Hangup(&'static str),
}

impl Plan {
    /// The bytes this command holds in memory until its reply is sent.
    fn charge_bytes(&self) -> u64 {
        match *self {
            Plan::Read { length, .. } | Plan::Write { length, .. } => u64::from(length),
            _ => 0,
        }
    }
}

/// The flags each command accepts. FUA is valid on every command once
/// NBD_FLAG_SEND_FUA is advertised; DF, REQ_ONE and FAST_ZERO need
/// negotiation we never offer, so they are always invalid here.
fn flags_allowed(command: u16) -> u16 {
    match command {
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE,
        _ => CMD_FLAG_FUA,
    }
}

/// Whether `offset..offset + length` lies within `size` (no overflow).
fn in_bounds(offset: u64, length: u32, size: u64) -> bool {
    offset.checked_add(u64::from(length)).is_some_and(|end| end <= size)
}

/// Decides how to serve `request` against an export of `size` bytes.
pub(crate) fn plan(request: &Request, size: u64, read_only: bool) -> Plan {
    let Request { flags, command, offset, length, .. } = *request;
    let fua = flags & CMD_FLAG_FUA != 0;
    let flags_ok = flags & !flags_allowed(command) == 0;
    let reject = |errno| Plan::Reject { errno, payload_len: 0 };
    match command {
        CMD_READ if !flags_ok || length > BLOCK_SIZE_MAX || !in_bounds(offset, length, size) => reject(Errno::Inval),
        CMD_READ if length == 0 => Plan::Succeed { payload_len: 0 },
        CMD_READ => Plan::Read { offset, length },
        // Past here the payload must be consumed whatever the answer.
        CMD_WRITE if length > BLOCK_SIZE_MAX => Plan::Hangup("WRITE payload larger than the maximum block size"),
        CMD_WRITE if !flags_ok => Plan::Reject { errno: Errno::Inval, payload_len: length },
        CMD_WRITE if read_only => Plan::Reject { errno: Errno::Perm, payload_len: length },
        CMD_WRITE if !in_bounds(offset, length, size) => Plan::Reject { errno: Errno::NoSpc, payload_len: length },
        CMD_WRITE if length == 0 => Plan::Succeed { payload_len: 0 },
        CMD_WRITE => Plan::Write { offset, length, fua },
        CMD_DISC => Plan::Disconnect,
        CMD_FLUSH if !flags_ok => reject(Errno::Inval),
        CMD_FLUSH => Plan::Flush,
        CMD_TRIM if !flags_ok => reject(Errno::Inval),
        CMD_TRIM if read_only => reject(Errno::Perm),
        CMD_TRIM if !in_bounds(offset, length, size) => reject(Errno::Inval),
        CMD_TRIM if length == 0 => Plan::Succeed { payload_len: 0 },
        CMD_TRIM => Plan::Trim { offset, length, fua },
        CMD_WRITE_ZEROES if !flags_ok => reject(Errno::Inval),
        CMD_WRITE_ZEROES if read_only => reject(Errno::Perm),
        // The spec's SHOULD for write zeroes past the end is ENOSPC, as for WRITE.
        CMD_WRITE_ZEROES if !in_bounds(offset, length, size) => reject(Errno::NoSpc),
        CMD_WRITE_ZEROES if length == 0 => Plan::Succeed { payload_len: 0 },
        CMD_WRITE_ZEROES => Plan::WriteZeroes { offset, length, fua, may_trim: flags & CMD_FLAG_NO_HOLE == 0 },
        // CACHE is a hint; we have no cache to warm, so a valid one just succeeds.
        CMD_CACHE if !flags_ok || length > BLOCK_SIZE_MAX || !in_bounds(offset, length, size) => reject(Errno::Inval),
        CMD_CACHE => Plan::Succeed { payload_len: 0 },
        // Unknown commands (and BLOCK_STATUS, RESIZE, which need unoffered
        // negotiation) are assumed to carry no payload.
        _ => reject(Errno::Inval),
    }
}

#[derive(Debug, Error)]
pub(crate) enum TransmissionError {
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("connection closed by the server")]
    Closed,
}

/// How the client ended the session cleanly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ending {
    Disconnect,
    EndOfStream,
}

/// Serves requests until the client disconnects; returns with commands
/// possibly still in flight (the caller drains them).
pub(crate) fn serve_requests<R: Read>(
    reader: &mut R,
    export: &Arc<dyn Export>,
    read_only: bool,
    gate: &InFlightGate,
    replies: &Sender<Outgoing>,
) -> Result<Ending, TransmissionError> {
    let mut header = [0u8; REQUEST_LEN];
    loop {
        if !read_header(reader, &mut header)? {
            return Ok(Ending::EndOfStream);
        }
        let request = decode_request(&header).map_err(|error| TransmissionError::Protocol(error.to_string()))?;
        let plan = plan(&request, export.size(), read_only);
        match plan {
            Plan::Disconnect => return Ok(Ending::Disconnect),
            Plan::Hangup(reason) => return Err(TransmissionError::Protocol(reason.to_string())),
            Plan::Reject { errno, .. } => warn!(?request, %errno, "rejected NBD request"),
            _ => {}
        }
        if !gate.acquire(plan.charge_bytes()) {
            return Err(TransmissionError::Closed);
        }
        start(reader, request.handle, plan, export, replies)?;
    }
}

/// Fills `header`; false on a clean end of stream before its first byte.
fn read_header<R: Read>(reader: &mut R, header: &mut [u8; REQUEST_LEN]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < header.len() {
        match reader.read(&mut header[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated request header")),
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(true)
}

/// Consumes the command's payload and hands the command to the export (or
/// answers it directly). The in-flight slot is already taken.
fn start<R: Read>(
    reader: &mut R,
    handle: u64,
    plan: Plan,
    export: &Arc<dyn Export>,
    replies: &Sender<Outgoing>,
) -> io::Result<()> {
    let completion = |charge_bytes| Completion { handle, charge_bytes, replies: replies.clone(), finished: false };
    match plan {
        Plan::Read { offset, length } => {
            let completion = completion(u64::from(length));
            export.read(offset, length, Box::new(move |result| completion.finish_read(result, length)));
        }
        Plan::Write { offset, length, fua } => {
            let payload = read_payload(reader, length)?;
            export.write(offset, payload, fua, completion(u64::from(length)).into_done());
        }
        Plan::Flush => export.flush(completion(0).into_done()),
        Plan::Trim { offset, length, fua } => export.trim(offset, length, then_flush(export, fua, completion(0))),
        Plan::WriteZeroes { offset, length, fua, may_trim } => {
            export.write_zeroes(offset, length, may_trim, then_flush(export, fua, completion(0)));
        }
        Plan::Succeed { payload_len } => {
            discard(reader, payload_len)?;
            completion(0).finish(Ok(Bytes::new()));
        }
        Plan::Reject { errno, payload_len } => {
            discard(reader, payload_len)?;
            completion(0).finish(Err(errno));
        }
        Plan::Disconnect | Plan::Hangup(_) => unreachable!("handled before a slot is taken"),
    }
    Ok(())
}

/// The export has no FUA parameter for trim and write_zeroes, so FUA is
/// honoured by flushing once the command succeeds and replying after that.
fn then_flush(export: &Arc<dyn Export>, fua: bool, completion: Completion) -> Done<()> {
    if !fua {
        return completion.into_done();
    }
    let export = Arc::clone(export);
    Box::new(move |result| match result {
        Ok(()) => export.flush(completion.into_done()),
        Err(errno) => completion.finish(Err(errno)),
    })
}

fn read_payload<R: Read>(reader: &mut R, length: u32) -> io::Result<Bytes> {
    assert!(length <= BLOCK_SIZE_MAX);
    let mut payload = vec![0u8; length as usize];
    reader.read_exact(&mut payload)?;
    Ok(Bytes::from(payload))
}

fn discard<R: Read>(reader: &mut R, length: u32) -> io::Result<()> {
    let copied = io::copy(&mut reader.take(u64::from(length)), &mut io::sink())?;
    if copied < u64::from(length) {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "truncated write payload"));
    }
    Ok(())
}

/// Queues exactly one reply for a command, even if the export drops its
/// Done without calling it (then EIO: a hung client is worse).
struct Completion {
    handle: u64,
    charge_bytes: u64,
    replies: Sender<Outgoing>,
    finished: bool,
}

impl Completion {
    fn finish(mut self, result: Result<Bytes, Errno>) {
        self.finished = true;
        self.send(result);
    }

    fn finish_read(self, result: Result<Bytes, Errno>, length: u32) {
        let result = result.and_then(|data| {
            if data.len() == length as usize {
                Ok(data)
            } else {
                warn!(handle = self.handle, expected = length, delivered = data.len(), "export read wrong length");
                Err(Errno::Io)
            }
        });
        self.finish(result);
    }

    fn into_done(self) -> Done<()> {
        Box::new(move |result| self.finish(result.map(|()| Bytes::new())))
    }

    fn send(&self, result: Result<Bytes, Errno>) {
        let reply = Reply { handle: self.handle, result, charge_bytes: self.charge_bytes };
        // The writer is gone only when the connection is closing; the reply
        // has nowhere to go then.
        let _ = self.replies.send(Outgoing::Reply(reply));
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.finished {
            warn!(handle = self.handle, "export dropped a completion without calling it; answering EIO");
            self.send(Err(Errno::Io));
        }
    }
}

#[cfg(test)]
mod tests;
