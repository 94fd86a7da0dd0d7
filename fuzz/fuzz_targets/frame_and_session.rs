//! Arbitrary bytes from an unauthenticated peer: frame decoding, then the
//! server-side session gate and handshake. Nothing may panic.
#![no_main]

use bytes::BytesMut;
use duplex_proto::{FrameDecoder, Handshake, Session};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut buffer = BytesMut::from(data);
    let decoder = FrameDecoder::with_max_payload(1 << 16);
    let mut session = Session::new(Handshake::server([7; 16], b"fuzz secret", [3; 32]));
    while let Ok(Some(frame)) = decoder.decode(&mut buffer) {
        if session.on_frame(frame).is_err() {
            break;
        }
    }
});
