//! The NBD wire format: constants and pure encoders/decoders, no I/O.
//!
//! Every integer is big-endian. The messages this crate speaks
//! (fixed-newstyle handshake, simple replies only):
//!
//! ```text
//! greeting        S: u64 NBDMAGIC, u64 IHAVEOPT, u16 handshake flags     (18 bytes)
//! client flags    C: u32                                                 (4 bytes)
//! option          C: u64 IHAVEOPT, u32 option, u32 length, data[length]  (16 + length)
//! option reply    S: u64 OPTION_REPLY_MAGIC, u32 option, u32 type,
//!                    u32 length, data[length]                            (20 + length)
//! EXPORT_NAME end S: u64 size, u16 transmission flags, [124 zero bytes
//!                    unless both sides set NO_ZEROES]
//! request         C: u32 REQUEST_MAGIC, u16 flags, u16 type, u64 handle,
//!                    u64 offset, u32 length, [length bytes if WRITE]     (28 + payload)
//! simple reply    S: u32 SIMPLE_REPLY_MAGIC, u32 error, u64 handle,
//!                    [length bytes if READ and error == 0]               (16 + payload)
//! ```
//!
//! Decoders take byte slices of any length and return [`DecodeError`]
//! instead of panicking, so they can be fed raw network bytes; the
//! proptests in `tests/nbd/protocol.rs` hold them to that.

use thiserror::Error;

/// "NBDMAGIC": the first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// "IHAVEOPT": sent by the server after NBD_MAGIC and by the client before every option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Starts every fixed-newstyle option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Starts every request in the transmission phase.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Starts every simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

// Handshake flags (server, 16 bits).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

// Client flags (32 bits).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;
/// The only client flags a client may set given the handshake flags we send.
pub const CLIENT_FLAGS_KNOWN: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

// Transmission flags (16 bits).
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Option types.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types; errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_FLAG_ERROR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

// NBD_REP_INFO information types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_RESIZE: u16 = 8;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Message sizes.
pub const GREETING_LEN: usize = 18;
pub const CLIENT_FLAGS_LEN: usize = 4;
pub const OPTION_HEADER_LEN: usize = 16;
pub const OPTION_REPLY_HEADER_LEN: usize = 20;
pub const EXPORT_NAME_REPLY_PADDING_LEN: usize = 124;
pub const REQUEST_LEN: usize = 28;
pub const SIMPLE_REPLY_HEADER_LEN: usize = 16;
/// Fixed part of NBD_OPT_INFO/GO data: u32 name length + u16 request count.
pub const INFO_REQUEST_FIXED_LEN: usize = 6;

// Block sizes advertised with NBD_INFO_BLOCK_SIZE.
pub const BLOCK_SIZE_MIN: u32 = 1;
pub const BLOCK_SIZE_PREFERRED: u32 = 4096;
/// The largest READ/WRITE/CACHE the server accepts; also the largest
/// payload it will buffer for one request (the spec's interoperable maximum).
pub const BLOCK_SIZE_MAX: u32 = 32 * 1024 * 1024;
/// Strings (export names, descriptions) MUST be no longer than this.
pub const STRING_LEN_MAX: usize = 4096;

const _: () = assert!(BLOCK_SIZE_MIN.is_power_of_two() && BLOCK_SIZE_MIN <= 65_536);
const _: () = assert!(BLOCK_SIZE_PREFERRED.is_power_of_two() && BLOCK_SIZE_PREFERRED >= 512);
// A power of two at least the preferred size is a multiple of any valid minimum.
const _: () = assert!(BLOCK_SIZE_MAX.is_power_of_two() && BLOCK_SIZE_MAX >= BLOCK_SIZE_PREFERRED);
const _: () = assert!(GREETING_LEN == 8 + 8 + 2 && REQUEST_LEN == 4 + 2 + 2 + 8 + 8 + 4);
const _: () = assert!(OPTION_REPLY_HEADER_LEN == 8 + 4 + 4 + 4 && SIMPLE_REPLY_HEADER_LEN == 4 + 4 + 8);

/// Why bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    #[error("message truncated: need {needed} bytes, have {have}")]
    Short { needed: usize, have: usize },
    #[error("bad magic {found:#x}")]
    BadMagic { found: u64 },
    #[error("{0}")]
    Invalid(&'static str),
}

/// Bounds-checked big-endian reader over a slice; never panics.
struct Cursor<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, position: 0 }
    }

    fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.position.checked_add(len).ok_or(DecodeError::Invalid("length overflow"))?;
        let slice =
            self.bytes.get(self.position..end).ok_or(DecodeError::Short { needed: end, have: self.bytes.len() })?;
        self.position = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn rest(&mut self) -> &'a [u8] {
        let rest = self.bytes.get(self.position..).unwrap_or(&[]);
        self.position = self.bytes.len();
        rest
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.position == self.bytes.len() {
            Ok(())
        } else {
            Err(DecodeError::Invalid("trailing bytes"))
        }
    }
}

fn decode_string(bytes: &[u8]) -> Result<String, DecodeError> {
    if bytes.len() > STRING_LEN_MAX {
        return Err(DecodeError::Invalid("string longer than 4096 bytes"));
    }
    if bytes.contains(&0) {
        return Err(DecodeError::Invalid("string contains NUL"));
    }
    String::from_utf8(bytes.to_vec()).map_err(|_| DecodeError::Invalid("string is not UTF-8"))
}

/// The server's first message.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_LEN] {
    let mut out = [0u8; GREETING_LEN];
    out[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    out
}

/// Decodes the greeting (client side); returns the handshake flags.
pub fn decode_greeting(bytes: &[u8]) -> Result<u16, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let magic = cursor.u64()?;
    if magic != NBD_MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let newstyle = cursor.u64()?;
    if newstyle != IHAVEOPT {
        return Err(DecodeError::BadMagic { found: newstyle });
    }
    let flags = cursor.u16()?;
    cursor.finish()?;
    Ok(flags)
}

/// The client flags word (validation of the bits is the handshake's job).
pub fn decode_client_flags(bytes: &[u8]) -> Result<u32, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let flags = cursor.u32()?;
    cursor.finish()?;
    Ok(flags)
}

/// The fixed 16-byte header in front of every client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

pub fn encode_option_header(header: &OptionHeader) -> [u8; OPTION_HEADER_LEN] {
    let mut out = [0u8; OPTION_HEADER_LEN];
    out[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[8..12].copy_from_slice(&header.option.to_be_bytes());
    out[12..16].copy_from_slice(&header.length.to_be_bytes());
    out
}

pub fn decode_option_header(bytes: &[u8]) -> Result<OptionHeader, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let magic = cursor.u64()?;
    if magic != IHAVEOPT {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let header = OptionHeader { option: cursor.u32()?, length: cursor.u32()? };
    cursor.finish()?;
    Ok(header)
}

/// The data of NBD_OPT_INFO and NBD_OPT_GO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub info_types: Vec<u16>,
}

/// A client option the server understands, or the code of one it does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    Info(InfoRequest),
    Go(InfoRequest),
    /// Answered with NBD_REP_ERR_UNSUP (STARTTLS, STRUCTURED_REPLY, META_CONTEXT, ...).
    Unsupported(u32),
}

/// Decodes an option's data. An error means the option is known but its data
/// is malformed (the server answers NBD_REP_ERR_INVALID).
pub fn decode_option(option: u32, data: &[u8]) -> Result<ClientOption, DecodeError> {
    match option {
        OPT_EXPORT_NAME => Ok(ClientOption::ExportName(decode_string(data)?)),
        // The spec asks servers to ignore stray data on ABORT rather than refuse it.
        OPT_ABORT => Ok(ClientOption::Abort),
        OPT_LIST if data.is_empty() => Ok(ClientOption::List),
        OPT_LIST => Err(DecodeError::Invalid("NBD_OPT_LIST carries no data")),
        OPT_INFO => Ok(ClientOption::Info(decode_info_request(data)?)),
        OPT_GO => Ok(ClientOption::Go(decode_info_request(data)?)),
        other => Ok(ClientOption::Unsupported(other)),
    }
}

fn decode_info_request(data: &[u8]) -> Result<InfoRequest, DecodeError> {
    let mut cursor = Cursor::new(data);
    let name_len = cursor.u32()? as usize;
    if name_len > data.len().saturating_sub(INFO_REQUEST_FIXED_LEN) {
        return Err(DecodeError::Invalid("name length exceeds option length"));
    }
    let name = decode_string(cursor.take(name_len)?)?;
    let count = usize::from(cursor.u16()?);
    let requests = cursor.rest();
    if requests.len() != count * 2 {
        return Err(DecodeError::Invalid("information request count does not match option length"));
    }
    let info_types = requests.chunks_exact(2).map(|pair| u16::from_be_bytes([pair[0], pair[1]])).collect();
    Ok(InfoRequest { name, info_types })
}

/// Encodes an option as a client sends it: (option code, data).
pub fn encode_option(option: &ClientOption) -> (u32, Vec<u8>) {
    match option {
        ClientOption::ExportName(name) => (OPT_EXPORT_NAME, name.as_bytes().to_vec()),
        ClientOption::Abort => (OPT_ABORT, Vec::new()),
        ClientOption::List => (OPT_LIST, Vec::new()),
        ClientOption::Info(request) => (OPT_INFO, encode_info_request(request)),
        ClientOption::Go(request) => (OPT_GO, encode_info_request(request)),
        ClientOption::Unsupported(code) => (*code, Vec::new()),
    }
}

fn encode_info_request(request: &InfoRequest) -> Vec<u8> {
    let mut out = Vec::with_capacity(INFO_REQUEST_FIXED_LEN + request.name.len() + request.info_types.len() * 2);
    out.extend_from_slice(&(request.name.len() as u32).to_be_bytes());
    out.extend_from_slice(request.name.as_bytes());
    out.extend_from_slice(&(request.info_types.len() as u16).to_be_bytes());
    for info_type in &request.info_types {
        out.extend_from_slice(&info_type.to_be_bytes());
    }
    out
}

/// The header of one option reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

/// Appends one option reply (header and data) to `out`.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8], out: &mut Vec<u8>) {
    // Replies are built by the server from bounded data (names and
    // descriptions it controls), never near 4 GiB.
    assert!(data.len() <= u32::MAX as usize);
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

pub fn decode_option_reply_header(bytes: &[u8]) -> Result<OptionReplyHeader, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let magic = cursor.u64()?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(DecodeError::BadMagic { found: magic });
    }
    let header = OptionReplyHeader { option: cursor.u32()?, reply_type: cursor.u32()?, length: cursor.u32()? };
    cursor.finish()?;
    Ok(header)
}

/// The payload of one NBD_REP_INFO reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Info {
    Export { size: u64, transmission_flags: u16 },
    Name(String),
    Description(String),
    BlockSize { minimum: u32, preferred: u32, maximum: u32 },
    Unknown(u16),
}

pub fn encode_info(info: &Info) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    match info {
        Info::Export { size, transmission_flags } => {
            out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
            out.extend_from_slice(&size.to_be_bytes());
            out.extend_from_slice(&transmission_flags.to_be_bytes());
        }
        Info::Name(name) => {
            out.extend_from_slice(&INFO_NAME.to_be_bytes());
            out.extend_from_slice(name.as_bytes());
        }
        Info::Description(description) => {
            out.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
            out.extend_from_slice(description.as_bytes());
        }
        Info::BlockSize { minimum, preferred, maximum } => {
            out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
            out.extend_from_slice(&minimum.to_be_bytes());
            out.extend_from_slice(&preferred.to_be_bytes());
            out.extend_from_slice(&maximum.to_be_bytes());
        }
        Info::Unknown(info_type) => out.extend_from_slice(&info_type.to_be_bytes()),
    }
    out
}

pub fn decode_info(data: &[u8]) -> Result<Info, DecodeError> {
    let mut cursor = Cursor::new(data);
    let info = match cursor.u16()? {
        INFO_EXPORT => Info::Export { size: cursor.u64()?, transmission_flags: cursor.u16()? },
        INFO_NAME => Info::Name(decode_string(cursor.rest())?),
        INFO_DESCRIPTION => Info::Description(decode_string(cursor.rest())?),
        INFO_BLOCK_SIZE => Info::BlockSize { minimum: cursor.u32()?, preferred: cursor.u32()?, maximum: cursor.u32()? },
        other => {
            cursor.rest();
            Info::Unknown(other)
        }
    };
    cursor.finish()?;
    Ok(info)
}

/// NBD_REP_SERVER data: u32 name length, name, then a human-readable description.
pub fn encode_server_entry(name: &str, description: Option<&str>) -> Vec<u8> {
    let description = description.unwrap_or("");
    let mut out = Vec::with_capacity(4 + name.len() + description.len());
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

/// Decodes NBD_REP_SERVER data into (name, description).
pub fn decode_server_entry(data: &[u8]) -> Result<(String, String), DecodeError> {
    let mut cursor = Cursor::new(data);
    let name_len = cursor.u32()? as usize;
    let name = decode_string(cursor.take(name_len)?)?;
    let description = decode_string(cursor.rest())?;
    Ok((name, description))
}

/// The reply that ends a handshake begun with NBD_OPT_EXPORT_NAME.
pub fn encode_export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + EXPORT_NAME_REPLY_PADDING_LEN);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.resize(out.len() + EXPORT_NAME_REPLY_PADDING_LEN, 0);
    }
    out
}

/// One transmission-phase request header (the WRITE payload follows it on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

pub fn encode_request(request: &Request) -> [u8; REQUEST_LEN] {
    let mut out = [0u8; REQUEST_LEN];
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&request.flags.to_be_bytes());
    out[6..8].copy_from_slice(&request.command.to_be_bytes());
    out[8..16].copy_from_slice(&request.handle.to_be_bytes());
    out[16..24].copy_from_slice(&request.offset.to_be_bytes());
    out[24..28].copy_from_slice(&request.length.to_be_bytes());
    out
}

/// Decodes a request header; a bad magic means the stream cannot be resynchronised.
pub fn decode_request(bytes: &[u8]) -> Result<Request, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let magic = cursor.u32()?;
    if magic != REQUEST_MAGIC {
        return Err(DecodeError::BadMagic { found: u64::from(magic) });
    }
    let request = Request {
        flags: cursor.u16()?,
        command: cursor.u16()?,
        handle: cursor.u64()?,
        offset: cursor.u64()?,
        length: cursor.u32()?,
    };
    cursor.finish()?;
    Ok(request)
}

/// The header of a simple reply; for a successful READ the data follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReplyHeader {
    pub error: u32,
    pub handle: u64,
}

pub fn encode_simple_reply_header(header: &SimpleReplyHeader) -> [u8; SIMPLE_REPLY_HEADER_LEN] {
    let mut out = [0u8; SIMPLE_REPLY_HEADER_LEN];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&header.error.to_be_bytes());
    out[8..16].copy_from_slice(&header.handle.to_be_bytes());
    out
}

pub fn decode_simple_reply_header(bytes: &[u8]) -> Result<SimpleReplyHeader, DecodeError> {
    let mut cursor = Cursor::new(bytes);
    let magic = cursor.u32()?;
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(DecodeError::BadMagic { found: u64::from(magic) });
    }
    let header = SimpleReplyHeader { error: cursor.u32()?, handle: cursor.u64()? };
    cursor.finish()?;
    Ok(header)
}
