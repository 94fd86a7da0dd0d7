//! One non-blocking connection of a priority thread: the session gate,
//! frame decoding, a write queue that sends large payloads from where they
//! already are (writev, no copy), and the reply slots that keep replies in
//! request order.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use duplex_map::OsdId;
use duplex_proto::osd::{OpKind, OpReply, OpRequest};
use duplex_proto::peering::PeerRequest;
use duplex_proto::session::Event;
use duplex_proto::{Frame, FrameDecoder, MessageType, Session, SessionError};
use mio::net::TcpStream;

use crate::io::order::{Ticket, Tickets};
use crate::messages::ClientOp;
use crate::pg::pg_key;

/// Payloads up to this size are copied into the staging buffer (one
/// syscall for many small frames); larger ones are queued by reference.
const COPY_LIMIT: usize = 2048;
const READ_CHUNK: usize = 64 << 10;
/// Unanswered requests a connection may have before the OSD stops reading it.
pub const MAX_IN_FLIGHT: usize = 256;
/// The largest frame an OSD accepts: the largest request plus its header.
const MAX_FRAME_PAYLOAD: u32 = duplex_proto::osd::MAX_IO_BYTES + 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Accepted: a client, or a peer OSD's replication connection.
    Accepted,
    /// Ours, to a peer OSD: carries our replication messages.
    Peer(OsdId),
}

pub struct Conn {
    pub stream: TcpStream,
    pub session: Session,
    pub role: Role,
    decoder: FrameDecoder,
    inbuf: BytesMut,
    staged: BytesMut,
    out: VecDeque<Bytes>,
    /// Peer connections: frames waiting for the handshake to finish.
    backlog: Vec<Frame>,
    /// Reply slots: (txid, reply once ready), for slots `first_slot..`.
    slots: VecDeque<(u64, Option<Frame>)>,
    first_slot: u64,
    /// Requests held back (in order) because one of them waits for log room.
    pub parked: VecDeque<ClientOp>,
    /// Reading stopped at [`MAX_IN_FLIGHT`]; resume when replies have left.
    pub paused: bool,
    pub closing: bool,
    /// Shared connections: the tickets its requests took (`order.rs`).
    tickets: Tickets,
}

/// A message read from a connection, with its reply slot and its ticket
/// taken in arrival order, under the connection's lock.
pub enum Inbound {
    /// A client operation; `slot`: its reply's place (none for a watch,
    /// which is answered on its own).
    Op { txid: u64, request: OpRequest, slot: Option<u64>, ticket: Option<Ticket> },
    /// Any other message.
    Frame { frame: Frame, ticket: Option<Ticket> },
}

impl Inbound {
    pub fn ticket(&self) -> Option<Ticket> {
        match self {
            Inbound::Op { ticket, .. } | Inbound::Frame { ticket, .. } => *ticket,
        }
    }
}

impl Conn {
    pub fn new(stream: TcpStream, session: Session, role: Role) -> Conn {
        Conn {
            stream,
            session,
            role,
            decoder: FrameDecoder::with_max_payload(MAX_FRAME_PAYLOAD),
            inbuf: BytesMut::with_capacity(READ_CHUNK),
            staged: BytesMut::with_capacity(4096),
            out: VecDeque::new(),
            backlog: Vec::new(),
            slots: VecDeque::new(),
            first_slot: 0,
            parked: VecDeque::new(),
            paused: false,
            closing: false,
            tickets: Tickets::default(),
        }
    }

    /// Takes what a message needs in arrival order: a client operation's
    /// reply slot (decoding it), and with `ordered` (a shared connection)
    /// a ticket for each message that must take effect in order: client
    /// operations, replicated entries and peering requests, by PG.
    pub fn classify(&mut self, frame: Frame, ordered: bool) -> Result<Inbound, String> {
        let txid = frame.header.transaction_id;
        let kind = MessageType::from_u8(frame.header.message_type);
        if self.role != Role::Accepted {
            return Ok(Inbound::Frame { frame, ticket: None });
        }
        match kind {
            Some(MessageType::OsdOp) => {
                let request = OpRequest::decode(&frame.payload).map_err(|e| format!("bad request: {e}"))?;
                // A long poll takes no slot and keeps no order: it only waits.
                if request.kind == OpKind::Watch {
                    return Ok(Inbound::Op { txid, request, slot: None, ticket: None });
                }
                let slot = Some(self.take_slot(txid));
                let ticket = ordered.then(|| self.tickets.issue(pg_key(request.pool, request.pg).unwrap_or(0)));
                Ok(Inbound::Op { txid, request, slot, ticket })
            }
            Some(MessageType::RepOp) if ordered => {
                let pg = duplex_oplog::entry::peek_pg(&frame.payload).unwrap_or(0);
                Ok(Inbound::Frame { ticket: Some(self.tickets.issue(pg)), frame })
            }
            Some(MessageType::PeerRequest) if ordered => {
                // Decoded again where it is handled: peering messages are rare.
                let pg = PeerRequest::decode(&frame.payload).map_or(0, |request| request.pg);
                Ok(Inbound::Frame { ticket: Some(self.tickets.issue(pg)), frame })
            }
            _ => Ok(Inbound::Frame { frame, ticket: None }),
        }
    }

    /// Queues a frame; a peer connection holds application frames until its handshake is done.
    pub fn push(&mut self, frame: &Frame) {
        if !self.session.is_established() && !is_handshake(frame) {
            self.backlog.push(frame.clone());
            return;
        }
        self.staged.extend_from_slice(&frame.encode_header());
        if frame.payload.len() <= COPY_LIMIT {
            self.staged.extend_from_slice(&frame.payload);
            crate::metrics::copies::count(crate::metrics::copies::Site::Send, frame.payload.len());
        } else {
            if !self.staged.is_empty() {
                self.out.push_back(self.staged.split().freeze());
            }
            self.out.push_back(frame.payload.clone());
        }
    }

    /// Takes a reply slot for a request with `txid`.
    pub fn take_slot(&mut self, txid: u64) -> u64 {
        self.slots.push_back((txid, None));
        // `read` stops taking frames at the limit, so the requests it
        // returned never take more slots than that.
        debug_assert!(self.slots.len() <= MAX_IN_FLIGHT, "more than {MAX_IN_FLIGHT} reply slots on one connection");
        self.first_slot + self.slots.len() as u64 - 1
    }

    /// Fills a slot; sends every reply that is now in order.
    pub fn complete(&mut self, slot: u64, reply: &OpReply) {
        debug_assert!(
            slot >= self.first_slot && slot - self.first_slot < self.slots.len() as u64,
            "a reply for slot {slot}, which this connection never gave out or already answered"
        );
        let Some(index) = slot.checked_sub(self.first_slot) else { return };
        let Some((txid, place)) = self.slots.get_mut(index as usize) else { return };
        debug_assert!(place.is_none(), "a reply slot filled twice");
        *place = Some(reply.to_frame(*txid));
        while self.slots.front().is_some_and(|(_, r)| r.is_some()) {
            let (_, frame) = self.slots.pop_front().expect("front exists");
            self.first_slot += 1;
            self.push(&frame.expect("checked"));
        }
    }

    /// Requests taken but not yet answered on this connection.
    pub fn in_flight(&self) -> usize {
        self.slots.len() + self.parked.len()
    }

    /// Reads from the socket and passes frames through the session; the
    /// handshake's replies are queued here, application messages returned.
    /// Stops taking frames once [`MAX_IN_FLIGHT`] requests are unanswered
    /// (`paused`): the peer then waits on TCP, and the connection costs at
    /// most one read chunk and one frame of buffer. Call again once replies
    /// have gone out. `Err`: close the connection (after sending what is queued).
    pub fn read(&mut self) -> Result<Vec<Frame>, ConnError> {
        debug_assert!(!self.closing, "a connection the peer closed is dropped, not read again");
        let mut messages = Vec::new();
        loop {
            while self.in_flight() + messages.len() < MAX_IN_FLIGHT {
                let frame = match self.decoder.decode(&mut self.inbuf) {
                    Ok(Some(frame)) => frame,
                    Ok(None) => break,
                    Err(err) => return Err(ConnError::Protocol(err.to_string())),
                };
                match self.session.on_frame(frame) {
                    Ok(Event::Reply(reply)) => self.push(&reply),
                    Ok(Event::Established(reply)) => {
                        if let Some(reply) = reply {
                            self.push(&reply);
                        }
                        for frame in std::mem::take(&mut self.backlog) {
                            self.push(&frame);
                        }
                    }
                    Ok(Event::Message(frame)) => messages.push(frame),
                    Err(SessionError::Handshake(err)) => {
                        if self.role == Role::Accepted {
                            self.push(&err.refusal());
                        }
                        return Err(ConnError::Refused(err.to_string()));
                    }
                    Err(err) => return Err(ConnError::Protocol(err.to_string())),
                }
            }
            self.paused = self.in_flight() + messages.len() >= MAX_IN_FLIGHT;
            if self.paused {
                return Ok(messages);
            }
            match duplex_proto::readbuf::read_into(&self.stream, &mut self.inbuf, READ_CHUNK) {
                Ok(0) if messages.is_empty() => return Err(ConnError::Closed),
                Ok(0) => {
                    self.closing = true;
                    return Ok(messages);
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(messages),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ConnError::Io(e)),
            }
        }
    }

    /// Writes as much of the queue as the socket takes.
    pub fn write_out(&mut self) -> io::Result<()> {
        if !self.staged.is_empty() {
            self.out.push_back(self.staged.split().freeze());
        }
        duplex_proto::writev::drain(&mut self.stream, &mut self.out)
    }
}

fn is_handshake(frame: &Frame) -> bool {
    duplex_proto::MessageType::from_u8(frame.header.message_type).is_some_and(|t| t.is_handshake())
}

#[derive(Debug)]
pub enum ConnError {
    Closed,
    Io(io::Error),
    /// Not our protocol (bad frames, or a message before authentication).
    Protocol(String),
    /// The handshake failed: wrong cluster, wrong secret, wrong version.
    Refused(String),
}

impl std::fmt::Display for ConnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConnError::Closed => write!(f, "closed by the peer"),
            ConnError::Io(e) => write!(f, "I/O: {e}"),
            ConnError::Protocol(e) => write!(f, "protocol error: {e}"),
            ConnError::Refused(e) => write!(f, "handshake refused: {e}"),
        }
    }
}

/// At most one warning a second about refused connections: a flood of
/// garbage connections must not flood the log (each one still counts in
/// `duplex_osd_connections_refused_total`).
#[derive(Debug)]
pub struct WarnLimit {
    next: Option<Instant>,
    suppressed: u64,
}

impl WarnLimit {
    pub const EVERY: Duration = Duration::from_secs(1);

    pub fn new() -> WarnLimit {
        WarnLimit { next: None, suppressed: 0 }
    }

    /// `Some(n)`: warn now, saying that `n` more were not logged since the
    /// last warning; `None`: stay quiet (counted for the next one).
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        if self.next.is_some_and(|next| now < next) {
            self.suppressed += 1;
            return None;
        }
        self.next = Some(now + Self::EVERY);
        Some(std::mem::take(&mut self.suppressed))
    }
}

impl Default for WarnLimit {
    fn default() -> Self {
        WarnLimit::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_connections_are_warned_about_once_a_second_with_a_count_of_the_rest() {
        let mut limit = WarnLimit::new();
        let start = Instant::now();
        assert_eq!(limit.admit(start), Some(0), "the first one is logged");
        for n in 1..1600u64 {
            assert_eq!(limit.admit(start + Duration::from_micros(n)), None);
        }
        assert_eq!(limit.admit(start + WarnLimit::EVERY), Some(1599), "then one line says how many were not");
        assert_eq!(limit.admit(start + WarnLimit::EVERY), None);
    }
}
