//! The handshake: version and fsid check, then mutual authentication.
//!
//! ```text
//! client                                   server
//!   Hello {version, fsid, client nonce, name} ->
//!                        <- Challenge {server nonce, server proof}   (or Refused {reason})
//!   Response {client proof} ->
//!                        <- Accepted                                 (or Refused {reason})
//! ```
//! `server proof = HMAC-SHA256(secret, "duplex-server-v1" | fsid | client nonce | server nonce)`,
//! `client proof = HMAC-SHA256(secret, "duplex-client-v1" | fsid | server nonce | client nonce)`.
//! The server proves itself first, so a client never answers an impostor.
//! Fresh nonces from both sides make replay useless. The labels and the
//! nonce order differ by direction, so a proof taken from one connection
//! cannot be reflected back on another. Proofs are compared in constant time.
//!
//! Sans I/O: [`Handshake::on_frame`] takes a frame and returns the frame to
//! send. Nonces come from the caller (the runtime draws them from the OS),
//! which keeps tests deterministic.

use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::frame::{Frame, MessageType};
use crate::PROTOCOL_VERSION;

type HmacSha256 = Hmac<Sha256>;

pub const NONCE_LEN: usize = 32;
const PROOF_LEN: usize = 32;
const MAX_NAME_LEN: usize = 64;
const MAX_REASON_LEN: usize = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HandshakeError {
    #[error("peer speaks protocol version {theirs}, this build speaks {ours}")]
    VersionMismatch { ours: u8, theirs: u8 },
    #[error("peer belongs to another cluster (fsid mismatch)")]
    FsidMismatch,
    #[error("peer failed to prove it knows the cluster secret")]
    AuthenticationFailed,
    #[error("unexpected {0:?} message during the handshake")]
    Unexpected(Option<MessageType>),
    #[error("malformed handshake message: {0}")]
    Malformed(&'static str),
    #[error("peer refused the connection: {0}")]
    Refused(String),
}

impl HandshakeError {
    /// The frame a server sends before closing, saying why (never a secret).
    pub fn refusal(&self) -> Frame {
        let reason = self.to_string();
        let reason = &reason.as_bytes()[..reason.len().min(MAX_REASON_LEN)];
        Frame::new(MessageType::Refused, 0, Bytes::copy_from_slice(reason))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    ClientAwaitingChallenge,
    ClientAwaitingAcceptance,
    ServerAwaitingHello,
    ServerAwaitingResponse,
    Done,
    Failed,
}

pub struct Handshake {
    role: Role,
    state: State,
    fsid: [u8; 16],
    secret: Vec<u8>,
    own_nonce: [u8; NONCE_LEN],
    peer_nonce: [u8; NONCE_LEN],
    peer_name: String,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("Handshake").field("role", &self.role).field("state", &self.state).finish_non_exhaustive()
    }
}

fn proof(secret: &[u8], label: &[u8], fsid: &[u8; 16], first: &[u8], second: &[u8]) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(label);
    mac.update(fsid);
    mac.update(first);
    mac.update(second);
    mac
}

impl Handshake {
    /// A client handshake and the Hello frame to send first.
    pub fn client(fsid: [u8; 16], secret: &[u8], nonce: [u8; NONCE_LEN], name: &str) -> (Handshake, Frame) {
        let name = &name.as_bytes()[..name.len().min(MAX_NAME_LEN)];
        let mut payload = BytesMut::with_capacity(1 + 16 + NONCE_LEN + 1 + name.len());
        payload.put_u8(PROTOCOL_VERSION);
        payload.put_slice(&fsid);
        payload.put_slice(&nonce);
        payload.put_u8(name.len() as u8);
        payload.put_slice(name);
        let handshake = Handshake {
            role: Role::Client,
            state: State::ClientAwaitingChallenge,
            fsid,
            secret: secret.to_vec(),
            own_nonce: nonce,
            peer_nonce: [0; NONCE_LEN],
            peer_name: String::new(),
        };
        (handshake, Frame::new(MessageType::Hello, 0, payload.freeze()))
    }

    /// A server handshake, waiting for a Hello.
    pub fn server(fsid: [u8; 16], secret: &[u8], nonce: [u8; NONCE_LEN]) -> Handshake {
        Handshake {
            role: Role::Server,
            state: State::ServerAwaitingHello,
            fsid,
            secret: secret.to_vec(),
            own_nonce: nonce,
            peer_nonce: [0; NONCE_LEN],
            peer_name: String::new(),
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// The name the client gave in its Hello (server side, once done).
    pub fn peer_name(&self) -> &str {
        &self.peer_name
    }

    /// Handles one handshake frame; returns the frame to send, if any. After
    /// an error the handshake is over: the server sends
    /// [`HandshakeError::refusal`] and closes.
    pub fn on_frame(&mut self, frame: &Frame) -> Result<Option<Frame>, HandshakeError> {
        let result = self.step(frame);
        if result.is_err() {
            self.state = State::Failed;
        }
        result
    }

    fn step(&mut self, frame: &Frame) -> Result<Option<Frame>, HandshakeError> {
        let kind = MessageType::from_u8(frame.header.message_type);
        let payload = &frame.payload[..];
        match (self.state, kind) {
            (_, Some(MessageType::Refused)) if self.role == Role::Client => {
                let reason = &payload[..payload.len().min(MAX_REASON_LEN)];
                Err(HandshakeError::Refused(String::from_utf8_lossy(reason).into_owned()))
            }
            (State::ServerAwaitingHello, Some(MessageType::Hello)) => {
                let (&version, rest) = payload.split_first().ok_or(HandshakeError::Malformed("empty hello"))?;
                if version != PROTOCOL_VERSION {
                    return Err(HandshakeError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: version });
                }
                if rest.len() < 16 + NONCE_LEN + 1 {
                    return Err(HandshakeError::Malformed("short hello"));
                }
                let (fsid, rest) = rest.split_at(16);
                let (nonce, rest) = rest.split_at(NONCE_LEN);
                let (&name_len, name) = rest.split_first().expect("length checked");
                if name.len() != name_len as usize || name.len() > MAX_NAME_LEN {
                    return Err(HandshakeError::Malformed("hello name length"));
                }
                if fsid != self.fsid {
                    return Err(HandshakeError::FsidMismatch);
                }
                self.peer_nonce.copy_from_slice(nonce);
                self.peer_name = String::from_utf8_lossy(name).into_owned();
                let server_proof =
                    proof(&self.secret, b"duplex-server-v1", &self.fsid, &self.peer_nonce, &self.own_nonce).finalize();
                let mut reply = BytesMut::with_capacity(NONCE_LEN + PROOF_LEN);
                reply.put_slice(&self.own_nonce);
                reply.put_slice(&server_proof.into_bytes());
                self.state = State::ServerAwaitingResponse;
                Ok(Some(Frame::new(MessageType::Challenge, 0, reply.freeze())))
            }
            (State::ClientAwaitingChallenge, Some(MessageType::Challenge)) => {
                if payload.len() != NONCE_LEN + PROOF_LEN {
                    return Err(HandshakeError::Malformed("challenge length"));
                }
                let (nonce, server_proof) = payload.split_at(NONCE_LEN);
                self.peer_nonce.copy_from_slice(nonce);
                proof(&self.secret, b"duplex-server-v1", &self.fsid, &self.own_nonce, &self.peer_nonce)
                    .verify_slice(server_proof)
                    .map_err(|_| HandshakeError::AuthenticationFailed)?;
                let client_proof =
                    proof(&self.secret, b"duplex-client-v1", &self.fsid, &self.peer_nonce, &self.own_nonce).finalize();
                self.state = State::ClientAwaitingAcceptance;
                Ok(Some(Frame::new(MessageType::Response, 0, Bytes::copy_from_slice(&client_proof.into_bytes()))))
            }
            (State::ServerAwaitingResponse, Some(MessageType::Response)) => {
                if payload.len() != PROOF_LEN {
                    return Err(HandshakeError::Malformed("response length"));
                }
                proof(&self.secret, b"duplex-client-v1", &self.fsid, &self.own_nonce, &self.peer_nonce)
                    .verify_slice(payload)
                    .map_err(|_| HandshakeError::AuthenticationFailed)?;
                self.state = State::Done;
                Ok(Some(Frame::new(MessageType::Accepted, 0, Bytes::new())))
            }
            (State::ClientAwaitingAcceptance, Some(MessageType::Accepted)) => {
                if !payload.is_empty() {
                    return Err(HandshakeError::Malformed("accepted carries no payload"));
                }
                self.state = State::Done;
                Ok(None)
            }
            (_, kind) => Err(HandshakeError::Unexpected(kind)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FSID: [u8; 16] = [7; 16];

    /// Runs a handshake to the end; returns each side's outcome.
    fn run(
        client_secret: &[u8],
        server_secret: &[u8],
        server_fsid: [u8; 16],
    ) -> (Result<(), HandshakeError>, Result<(), HandshakeError>) {
        let (mut client, hello) = Handshake::client(FSID, client_secret, [1; 32], "client.test");
        let mut server = Handshake::server(server_fsid, server_secret, [2; 32]);
        let mut to_server = Some(hello);
        for _ in 0..4 {
            let Some(frame) = to_server.take() else { break };
            let reply = match server.on_frame(&frame) {
                Ok(reply) => reply,
                Err(err) => {
                    let refusal = err.refusal();
                    return (client.on_frame(&refusal).map(|_| ()), Err(err));
                }
            };
            let Some(reply) = reply else { break };
            match client.on_frame(&reply) {
                Ok(next) => to_server = next,
                Err(err) => return (Err(err), Ok(())),
            }
        }
        assert!(client.is_done() && server.is_done());
        assert_eq!(server.peer_name(), "client.test");
        (Ok(()), Ok(()))
    }

    #[test]
    fn matching_secrets_authenticate_both_sides() {
        assert_eq!(run(b"cluster secret", b"cluster secret", FSID), (Ok(()), Ok(())));
    }

    #[test]
    fn a_client_with_the_wrong_secret_rejects_the_server_first() {
        let (client, _) = run(b"wrong", b"cluster secret", FSID);
        assert_eq!(client, Err(HandshakeError::AuthenticationFailed));
    }

    #[test]
    fn another_clusters_fsid_is_refused_with_a_reason() {
        let (client, server) = run(b"s", b"s", [9; 16]);
        assert_eq!(server, Err(HandshakeError::FsidMismatch));
        assert!(matches!(client, Err(HandshakeError::Refused(reason)) if reason.contains("fsid")));
    }

    #[test]
    fn an_impostor_client_cannot_answer_the_challenge() {
        // It knows no secret, so it sends some proof; the server refuses.
        let (_, hello) = Handshake::client(FSID, b"anything", [1; 32], "impostor");
        let mut server = Handshake::server(FSID, b"cluster secret", [2; 32]);
        server.on_frame(&hello).unwrap();
        let forged = Frame::new(MessageType::Response, 0, Bytes::from(vec![0u8; 32]));
        assert_eq!(server.on_frame(&forged), Err(HandshakeError::AuthenticationFailed));
        assert!(!server.is_done());
    }

    #[test]
    fn a_server_proof_cannot_be_reflected_as_a_client_proof() {
        // The attacker opens connection A, sends Hello with nonce N, and learns
        // the server's proof P for (N, S_A). On connection B it tries to answer
        // the server's challenge with P.
        let secret = b"cluster secret";
        let (_, hello) = Handshake::client(FSID, b"?", [5; 32], "attacker");
        let mut server_a = Handshake::server(FSID, secret, [6; 32]);
        let challenge_a = server_a.on_frame(&hello).unwrap().unwrap();
        let proof_a = challenge_a.payload.slice(NONCE_LEN..);
        let mut server_b = Handshake::server(FSID, secret, [5; 32]);
        let (_, hello_b) = Handshake::client(FSID, b"?", [6; 32], "attacker");
        server_b.on_frame(&hello_b).unwrap();
        let reflected = Frame::new(MessageType::Response, 0, proof_a);
        assert_eq!(server_b.on_frame(&reflected), Err(HandshakeError::AuthenticationFailed));
    }

    #[test]
    fn out_of_order_messages_fail() {
        let mut server = Handshake::server(FSID, b"s", [2; 32]);
        let early = Frame::new(MessageType::Response, 0, Bytes::from(vec![0u8; 32]));
        assert_eq!(server.on_frame(&early), Err(HandshakeError::Unexpected(Some(MessageType::Response))));
    }

    #[test]
    fn version_mismatch_is_reported() {
        let (_, mut hello) = Handshake::client(FSID, b"s", [1; 32], "old");
        let mut payload = hello.payload.to_vec();
        payload[0] = 99;
        hello.payload = Bytes::from(payload);
        let mut server = Handshake::server(FSID, b"s", [2; 32]);
        assert_eq!(
            server.on_frame(&hello),
            Err(HandshakeError::VersionMismatch { ours: PROTOCOL_VERSION, theirs: 99 })
        );
    }

    proptest! {
        #[test]
        fn random_frames_never_panic_either_side(kind in any::<u8>(), payload in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut frame = Frame::new(MessageType::Hello, 0, Bytes::from(payload));
            frame.header.message_type = kind;
            let mut server = Handshake::server(FSID, b"s", [2; 32]);
            let _ = server.on_frame(&frame);
            let (mut client, _) = Handshake::client(FSID, b"s", [1; 32], "c");
            let _ = client.on_frame(&frame);
        }
    }
}
