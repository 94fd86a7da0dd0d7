//! Fixed-newstyle option haggling, up to the choice of an export.
//!
//! The server sends the greeting, reads the client flags, then answers
//! options one at a time (the client must wait for the final reply of one
//! option before sending the next) until NBD_OPT_GO succeeds,
//! NBD_OPT_EXPORT_NAME names an export, or the client aborts.
//!
//! Malformed data in a known option gets NBD_REP_ERR_INVALID and haggling
//! goes on; what cannot be answered (unknown client flags, a bad option
//! magic, an option longer than [`OPTION_DATA_LEN_MAX`], an unusable
//! NBD_OPT_EXPORT_NAME) ends the session with a hard disconnect, as the spec
//! allows. Generic over Read/Write so tests can drive it from memory; the
//! server wraps the socket so the whole handshake has one deadline.

use std::io::{self, Read, Write};
use std::sync::Arc;

use thiserror::Error;
use tracing::{debug, warn};

use crate::protocol::*;
use crate::{Export, Exports};

/// Options are small (a name and a few info requests); anything bigger is
/// hostile or broken and is not worth reading.
pub(crate) const OPTION_DATA_LEN_MAX: u32 = 64 * 1024;
/// A well-behaved client needs a handful; the bound keeps one connection
/// from spinning the server forever even without a deadline.
pub(crate) const OPTIONS_PER_HANDSHAKE_MAX: usize = 1024;

const HANDSHAKE_FLAGS: u16 = FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES;

/// The transmission flags for an export: everything the server implements.
pub(crate) fn transmission_flags(read_only: bool) -> u16 {
    let flags = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_CAN_MULTI_CONN;
    if read_only {
        flags | FLAG_READ_ONLY
    } else {
        flags
    }
}

#[derive(Debug, Error)]
pub(crate) enum HandshakeError {
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
}

/// The export the client chose.
pub(crate) struct Negotiated {
    pub(crate) name: String,
    pub(crate) export: Arc<dyn Export>,
    /// As advertised; fixed for the session.
    pub(crate) read_only: bool,
}

pub(crate) enum Outcome {
    Transmission(Negotiated),
    Aborted,
}

pub(crate) fn negotiate<R: Read, W: Write>(
    reader: &mut R,
    writer: &mut W,
    exports: &dyn Exports,
) -> Result<Outcome, HandshakeError> {
    writer.write_all(&encode_greeting(HANDSHAKE_FLAGS))?;
    writer.flush()?;
    let mut flag_bytes = [0u8; CLIENT_FLAGS_LEN];
    reader.read_exact(&mut flag_bytes)?;
    let client_flags = u32::from_be_bytes(flag_bytes);
    if client_flags & !CLIENT_FLAGS_KNOWN != 0 {
        return Err(HandshakeError::Protocol(format!("unknown client flags {client_flags:#x}")));
    }
    let fixed_newstyle = client_flags & FLAG_C_FIXED_NEWSTYLE != 0;
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;

    for _ in 0..OPTIONS_PER_HANDSHAKE_MAX {
        let mut header_bytes = [0u8; OPTION_HEADER_LEN];
        reader.read_exact(&mut header_bytes)?;
        let header = decode_option_header(&header_bytes)
            .map_err(|error| HandshakeError::Protocol(format!("option header: {error}")))?;
        if header.length > OPTION_DATA_LEN_MAX {
            return Err(HandshakeError::Protocol(format!(
                "option {} claims {} bytes of data (max {OPTION_DATA_LEN_MAX})",
                header.option, header.length
            )));
        }
        // Non-fixed newstyle clients cannot parse option replies.
        if !fixed_newstyle && header.option != OPT_EXPORT_NAME {
            return Err(HandshakeError::Protocol(format!("option {} from a non-fixed-newstyle client", header.option)));
        }
        let mut data = vec![0u8; header.length as usize];
        reader.read_exact(&mut data)?;

        let mut replies = Vec::new();
        let step = answer(header.option, &data, exports, no_zeroes, &mut replies)?;
        writer.write_all(&replies)?;
        writer.flush()?;
        match step {
            Step::Continue => {}
            Step::Done(outcome) => return Ok(outcome),
        }
    }
    Err(HandshakeError::Protocol(format!("more than {OPTIONS_PER_HANDSHAKE_MAX} options")))
}

enum Step {
    Continue,
    Done(Outcome),
}

/// Appends the reply to one option to `out` and says whether haggling goes on.
fn answer(
    option: u32,
    data: &[u8],
    exports: &dyn Exports,
    no_zeroes: bool,
    out: &mut Vec<u8>,
) -> Result<Step, HandshakeError> {
    let decoded = match decode_option(option, data) {
        Ok(decoded) => decoded,
        // EXPORT_NAME has no error reply; the spec mandates a disconnect.
        Err(error) if option == OPT_EXPORT_NAME => {
            return Err(HandshakeError::Protocol(format!("NBD_OPT_EXPORT_NAME: {error}")));
        }
        Err(error) => {
            warn!(option, %error, "malformed NBD option");
            encode_option_reply(option, REP_ERR_INVALID, error.to_string().as_bytes(), out);
            return Ok(Step::Continue);
        }
    };
    match decoded {
        ClientOption::ExportName(name) => {
            let export = exports
                .open(&name)
                .ok_or_else(|| HandshakeError::Protocol(format!("NBD_OPT_EXPORT_NAME for unknown export {name:?}")))?;
            let read_only = export.read_only();
            out.extend_from_slice(&encode_export_name_reply(export.size(), transmission_flags(read_only), no_zeroes));
            Ok(Step::Done(Outcome::Transmission(Negotiated { name, export, read_only })))
        }
        ClientOption::Abort => {
            encode_option_reply(option, REP_ACK, &[], out);
            Ok(Step::Done(Outcome::Aborted))
        }
        ClientOption::List => {
            for name in exports.names() {
                let description = exports.description(&name);
                encode_option_reply(option, REP_SERVER, &encode_server_entry(&name, description.as_deref()), out);
            }
            encode_option_reply(option, REP_ACK, &[], out);
            Ok(Step::Continue)
        }
        ClientOption::Info(request) => {
            answer_info(option, request, exports, out);
            Ok(Step::Continue)
        }
        ClientOption::Go(request) => match answer_info(option, request, exports, out) {
            Some(negotiated) => Ok(Step::Done(Outcome::Transmission(negotiated))),
            None => Ok(Step::Continue),
        },
        ClientOption::Unsupported(code) => {
            debug!(option = code, "unsupported NBD option");
            encode_option_reply(option, REP_ERR_UNSUP, b"option not supported by this server", out);
            Ok(Step::Continue)
        }
    }
}

/// Answers NBD_OPT_INFO or NBD_OPT_GO; returns the export when it exists.
fn answer_info(option: u32, request: InfoRequest, exports: &dyn Exports, out: &mut Vec<u8>) -> Option<Negotiated> {
    let Some(export) = exports.open(&request.name) else {
        let message = format!("unknown export {:?}", request.name);
        encode_option_reply(option, REP_ERR_UNKNOWN, message.as_bytes(), out);
        return None;
    };
    let read_only = export.read_only();
    let mut sent = Vec::with_capacity(4);
    for info_type in request.info_types {
        // A client MUST NOT repeat a request, but a repeat must not make us repeat an answer.
        if sent.contains(&info_type) {
            continue;
        }
        sent.push(info_type);
        let info = match info_type {
            INFO_NAME => Info::Name(request.name.clone()),
            INFO_DESCRIPTION => match exports.description(&request.name) {
                Some(description) => Info::Description(description),
                None => continue,
            },
            INFO_BLOCK_SIZE => {
                Info::BlockSize { minimum: BLOCK_SIZE_MIN, preferred: BLOCK_SIZE_PREFERRED, maximum: BLOCK_SIZE_MAX }
            }
            // INFO_EXPORT is always sent below; unknown types are ignored, as the spec requires.
            _ => continue,
        };
        encode_option_reply(option, REP_INFO, &encode_info(&info), out);
    }
    let info = Info::Export { size: export.size(), transmission_flags: transmission_flags(read_only) };
    encode_option_reply(option, REP_INFO, &encode_info(&info), out);
    encode_option_reply(option, REP_ACK, &[], out);
    Some(Negotiated { name: request.name, export, read_only })
}

#[cfg(test)]
mod tests;
