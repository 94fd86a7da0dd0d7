//! The gate in front of a connection: until the handshake is done, only
//! handshake frames pass; after it, handshake frames are an error.

use crate::frame::{Frame, MessageType};
use crate::handshake::{Handshake, HandshakeError};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SessionError {
    #[error("{0:?} sent before authentication; only the handshake is allowed")]
    Unauthenticated(Option<MessageType>),
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("handshake message {0:?} after the session was established")]
    HandshakeAgain(MessageType),
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
}

/// What the runtime does with a frame the session let through.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    /// Send this handshake frame.
    Reply(Frame),
    /// Send this frame (if any); the peer is now authenticated.
    Established(Option<Frame>),
    /// An application message from an authenticated peer.
    Message(Frame),
}

#[derive(Debug)]
pub struct Session {
    handshake: Handshake,
}

impl Session {
    pub fn new(handshake: Handshake) -> Session {
        Session { handshake }
    }

    pub fn is_established(&self) -> bool {
        self.handshake.is_done()
    }

    pub fn handshake(&self) -> &Handshake {
        &self.handshake
    }

    /// Passes `frame` through the gate. Any error means: close the connection
    /// (a server first sends [`HandshakeError::refusal`] for handshake errors).
    pub fn on_frame(&mut self, frame: Frame) -> Result<Event, SessionError> {
        let kind = MessageType::from_u8(frame.header.message_type);
        if self.handshake.is_done() {
            return match kind {
                None => Err(SessionError::UnknownType(frame.header.message_type)),
                Some(k) if k.is_handshake() => Err(SessionError::HandshakeAgain(k)),
                Some(_) => Ok(Event::Message(frame)),
            };
        }
        if !kind.is_some_and(MessageType::is_handshake) {
            return Err(SessionError::Unauthenticated(kind));
        }
        let reply = self.handshake.on_frame(&frame)?;
        if self.handshake.is_done() {
            return Ok(Event::Established(reply));
        }
        reply.map(Event::Reply).ok_or(SessionError::Handshake(HandshakeError::Malformed("handshake stalled")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn nothing_but_the_handshake_passes_before_authentication() {
        let mut server = Session::new(Handshake::server([1; 16], b"s", [2; 32]));
        let ping = Frame::new(MessageType::Ping, 1, Bytes::new());
        assert_eq!(server.on_frame(ping), Err(SessionError::Unauthenticated(Some(MessageType::Ping))));
        let mut unknown = Frame::new(MessageType::Ping, 1, Bytes::new());
        unknown.header.message_type = 200;
        let mut server = Session::new(Handshake::server([1; 16], b"s", [2; 32]));
        assert_eq!(server.on_frame(unknown), Err(SessionError::Unauthenticated(None)));
    }

    #[test]
    fn an_established_session_carries_messages_and_refuses_a_second_handshake() {
        let (client_hs, hello) = Handshake::client([1; 16], b"s", [1; 32], "c");
        let mut client = Session::new(client_hs);
        let mut server = Session::new(Handshake::server([1; 16], b"s", [2; 32]));
        let Ok(Event::Reply(challenge)) = server.on_frame(hello) else { panic!("challenge expected") };
        let Ok(Event::Reply(response)) = client.on_frame(challenge) else { panic!("response expected") };
        let Ok(Event::Established(Some(accepted))) = server.on_frame(response) else { panic!("acceptance expected") };
        assert_eq!(client.on_frame(accepted), Ok(Event::Established(None)));
        assert!(client.is_established() && server.is_established());
        let ping = Frame::new(MessageType::Ping, 42, Bytes::from_static(b"hi"));
        assert_eq!(server.on_frame(ping.clone()), Ok(Event::Message(ping)));
        let (_, hello_again) = Handshake::client([1; 16], b"s", [3; 32], "c");
        assert_eq!(server.on_frame(hello_again), Err(SessionError::HandshakeAgain(MessageType::Hello)));
    }
}
