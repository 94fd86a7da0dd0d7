//! A blocking, authenticated connection to an OSD.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::BytesMut;
use duplex_mon::wire::Credentials;
use duplex_proto::session::Event;
use duplex_proto::{Frame, FrameDecoder, Handshake, Session};

pub struct OsdConnection {
    stream: TcpStream,
    buffer: BytesMut,
    decoder: FrameDecoder,
}

fn invalid(msg: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

impl OsdConnection {
    /// Connects and runs the handshake.
    pub fn connect(addr: SocketAddr, credentials: &Credentials, timeout: Duration) -> std::io::Result<OsdConnection> {
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut conn =
            OsdConnection { stream, buffer: BytesMut::with_capacity(64 << 10), decoder: FrameDecoder::default() };
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

    pub fn send(&mut self, frame: &Frame) -> std::io::Result<()> {
        let mut out = BytesMut::with_capacity(duplex_proto::frame::HEADER_LEN + frame.payload.len());
        frame.encode(&mut out);
        self.stream.write_all(&out)
    }

    pub fn recv(&mut self) -> std::io::Result<Frame> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buffer).map_err(invalid)? {
                return Ok(frame);
            }
            let mut chunk = [0u8; 64 << 10];
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the OSD closed the connection"));
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }

    /// The socket, for a caller that takes the connection over (the load generator).
    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.stream, self.buffer)
    }
}
