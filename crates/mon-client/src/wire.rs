//! Monitor messages inside `MessageType::Monitor` frames, and a blocking
//! connection that runs the authenticated handshake first.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use duplex_map::Command;
use duplex_proto::session::Event;
use duplex_proto::{Frame, FrameDecoder, Handshake, MessageType, Session};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum MonMessage {
    /// Follow the map from `from_epoch`: the connection then carries only
    /// pushed `Map` (catch-up when too far behind) and `Deltas` messages.
    Subscribe {
        from_epoch: u64,
    },
    /// Encoded deltas (duplex_map::codec), consecutive epochs.
    Deltas(Vec<Vec<u8>>),
    /// An OSD is alive (sent to the leader every second or so).
    Heartbeat {
        osd: u32,
    },
    /// `reporter` could not reach `target`.
    FailureReport {
        target: u32,
        reporter: u32,
    },
    /// Heartbeat or report taken.
    Ack,
    /// A raft message between monitors (protobuf bytes).
    Raft(Vec<u8>),
    Command(Command),
    /// The command's outcome, or why it was not run.
    CommandReply(Result<WireOutcome, String>),
    NotLeader {
        leader: Option<u64>,
    },
    GetMap,
    /// The encoded map (duplex_map::codec).
    Map(Vec<u8>),
    Status,
    StatusReply {
        id: u64,
        leader: Option<u64>,
        is_leader: bool,
        epoch: u64,
    },
    /// A heartbeat taken: the lease it grants the OSD, counted from when it
    /// sent the heartbeat (0: none; the map has it down, or soon will).
    HeartbeatReply {
        lease_ms: u64,
    },
    /// `reporter`'s connection to `target` broke and `target`'s address
    /// refuses connections: that process (of incarnation `incarnation`,
    /// its `state_epoch`) is gone, and is marked down at once. (Last, so
    /// that the variants before keep their encoding.)
    PeerRefused {
        target: u32,
        incarnation: u64,
        reporter: u32,
    },
    /// What `osd`'s store holds, for the balancer (sent to the leader
    /// twice a second; answered `Ack`): its capacity, how full it is
    /// against the full ratio (per mille), and the bytes of each PG
    /// (pool, PG number) it holds.
    UsageReport {
        osd: u32,
        capacity_bytes: u64,
        used_permille: u64,
        pgs: Vec<(u32, u32, u64)>,
    },
}

/// A monitor command's outcome on the wire (the monitor's `CommandOutcome`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireOutcome {
    Applied { epoch: u64 },
    Unchanged { epoch: u64 },
    Refused(String),
}

pub fn to_frame(message: &MonMessage) -> Frame {
    Frame::new(MessageType::Monitor, 0, Bytes::from(postcard::to_allocvec(message).expect("encoding to a Vec")))
}

pub fn from_frame(frame: &Frame) -> std::io::Result<MonMessage> {
    postcard::from_bytes(&frame.payload).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The largest frame a monitor connection takes: a full map of a large
/// cluster fits many times over (and so does an OSD's 4 MiB read reply,
/// for the clients that reuse this connection).
const MAX_PAYLOAD: u32 = 16 << 20;

/// Who we are on the wire.
#[derive(Clone)]
pub struct Credentials {
    pub fsid: [u8; 16],
    pub secret: Vec<u8>,
    pub name: String,
}

/// A blocking, authenticated connection.
pub struct Connection {
    stream: TcpStream,
    buffer: BytesMut,
    decoder: FrameDecoder,
}

fn invalid(msg: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

impl Connection {
    fn new(stream: TcpStream) -> std::io::Result<Connection> {
        stream.set_nodelay(true)?;
        let decoder = FrameDecoder::with_max_payload(MAX_PAYLOAD);
        Ok(Connection { stream, buffer: BytesMut::with_capacity(64 << 10), decoder })
    }

    /// Connects and authenticates as a client.
    pub fn connect(addr: SocketAddr, credentials: &Credentials, timeout: Duration) -> std::io::Result<Connection> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut conn = Connection::new(stream)?;
        let (handshake, hello) =
            Handshake::client(credentials.fsid, &credentials.secret, rand::random(), &credentials.name);
        let mut session = Session::new(handshake);
        conn.send(&hello)?;
        loop {
            let frame = conn.recv()?;
            match session.on_frame(frame).map_err(invalid)? {
                Event::Reply(reply) => conn.send(&reply)?,
                Event::Established(reply) => {
                    if let Some(reply) = reply {
                        conn.send(&reply)?;
                    }
                    return Ok(conn);
                }
                Event::Message(_) => return Err(invalid("message before the handshake ended")),
            }
        }
    }

    /// Authenticates an accepted connection as the server; refusals are sent before failing.
    pub fn accept(stream: TcpStream, credentials: &Credentials, timeout: Duration) -> std::io::Result<Connection> {
        stream.set_read_timeout(Some(timeout))?;
        // A peer that stops reading must not pin the serving thread in a write.
        stream.set_write_timeout(Some(timeout))?;
        let mut conn = Connection::new(stream)?;
        let mut session = Session::new(Handshake::server(credentials.fsid, &credentials.secret, rand::random()));
        // The whole handshake, not each read, is bounded: a peer trickling
        // bytes cannot hold a connection slot without authenticating.
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if std::time::Instant::now() > deadline {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "handshake took too long"));
            }
            let frame = conn.recv()?;
            match session.on_frame(frame) {
                Ok(Event::Reply(reply)) => conn.send(&reply)?,
                Ok(Event::Established(reply)) => {
                    if let Some(reply) = reply {
                        conn.send(&reply)?;
                    }
                    conn.stream.set_read_timeout(None)?;
                    return Ok(conn);
                }
                Ok(Event::Message(_)) => return Err(invalid("message before the handshake ended")),
                Err(duplex_proto::SessionError::Handshake(err)) => {
                    let _ = conn.send(&err.refusal());
                    return Err(invalid(err));
                }
                Err(err) => return Err(invalid(err)),
            }
        }
    }

    pub fn send(&mut self, frame: &Frame) -> std::io::Result<()> {
        let mut out = BytesMut::new();
        frame.encode(&mut out);
        self.stream.write_all(&out)
    }

    pub fn recv(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buffer).map_err(invalid)? {
                return Ok(frame);
            }
            let mut chunk = [0u8; 16 << 10];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "peer closed the connection"));
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn call(&mut self, message: &MonMessage) -> std::io::Result<MonMessage> {
        self.send(&to_frame(message))?;
        from_frame(&self.recv()?)
    }

    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.stream.set_read_timeout(timeout)
    }

    /// The socket and the bytes already read past the last frame, for a
    /// caller that takes the authenticated connection over (non-blocking I/O).
    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.stream, self.buffer)
    }
}
