//! A minimal NBD client written from the spec, independent of the crate's
//! `protocol` module (literal numbers on purpose), so encoding mistakes in
//! the server cannot be mirrored here.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const FLAG_FUA: u16 = 1;
pub const FLAG_NO_HOLE: u16 = 2;

pub const EPERM: u32 = 1;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;

/// Long enough for any test step, short enough that a server bug fails the
/// test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

pub trait Socket: Read + Write + Send {}
impl<T: Read + Write + Send> Socket for T {}

pub fn tcp(addr: SocketAddr) -> Box<dyn Socket> {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_nodelay(true).unwrap();
    Box::new(stream)
}

pub fn unix(path: &Path) -> Box<dyn Socket> {
    let stream = UnixStream::connect(path).expect("connect");
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
    Box::new(stream)
}

pub fn read_u16(socket: &mut dyn Socket) -> io::Result<u16> {
    let mut bytes = [0u8; 2];
    socket.read_exact(&mut bytes)?;
    Ok(u16::from_be_bytes(bytes))
}

pub fn read_u32(socket: &mut dyn Socket) -> io::Result<u32> {
    let mut bytes = [0u8; 4];
    socket.read_exact(&mut bytes)?;
    Ok(u32::from_be_bytes(bytes))
}

pub fn read_u64(socket: &mut dyn Socket) -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    socket.read_exact(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

/// Reads the greeting and sends fixed-newstyle + no-zeroes client flags.
pub fn greet(socket: &mut dyn Socket) -> io::Result<()> {
    assert_eq!(read_u64(socket)?, NBDMAGIC);
    assert_eq!(read_u64(socket)?, IHAVEOPT);
    assert_eq!(read_u16(socket)?, 0b11, "FIXED_NEWSTYLE | NO_ZEROES");
    socket.write_all(&3u32.to_be_bytes())
}

pub fn send_option(socket: &mut dyn Socket, option: u32, data: &[u8]) -> io::Result<()> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    socket.write_all(&bytes)
}

/// (option, reply type, data)
pub fn read_option_reply(socket: &mut dyn Socket) -> io::Result<(u32, u32, Vec<u8>)> {
    assert_eq!(read_u64(socket)?, REPLY_MAGIC);
    let option = read_u32(socket)?;
    let reply_type = read_u32(socket)?;
    let mut data = vec![0u8; read_u32(socket)? as usize];
    socket.read_exact(&mut data)?;
    Ok((option, reply_type, data))
}

pub fn go_data(name: &str, info_types: &[u16]) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&(info_types.len() as u16).to_be_bytes());
    for info_type in info_types {
        data.extend_from_slice(&info_type.to_be_bytes());
    }
    data
}

/// A connection in the transmission phase.
pub struct Client {
    pub socket: Box<dyn Socket>,
    pub size: u64,
    pub transmission_flags: u16,
    /// (minimum, preferred, maximum) from NBD_INFO_BLOCK_SIZE.
    pub block_size: Option<(u32, u32, u32)>,
}

#[derive(Debug)]
pub struct Reply {
    pub error: u32,
    pub handle: u64,
    pub data: Vec<u8>,
}

impl Client {
    /// Greets and sends NBD_OPT_GO for `name`, asking for the block size.
    pub fn go(mut socket: Box<dyn Socket>, name: &str) -> io::Result<Client> {
        greet(&mut *socket)?;
        Self::go_after_greeting(socket, name)
    }

    pub fn go_after_greeting(mut socket: Box<dyn Socket>, name: &str) -> io::Result<Client> {
        send_option(&mut *socket, OPT_GO, &go_data(name, &[3]))?;
        let mut export = None;
        let mut block_size = None;
        loop {
            let (option, reply_type, data) = read_option_reply(&mut *socket)?;
            assert_eq!(option, OPT_GO);
            match reply_type {
                REP_INFO => match u16::from_be_bytes([data[0], data[1]]) {
                    0 => {
                        assert_eq!(data.len(), 12);
                        let size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                        export = Some((size, u16::from_be_bytes([data[10], data[11]])));
                    }
                    3 => {
                        assert_eq!(data.len(), 14);
                        let word = |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap());
                        block_size = Some((word(2), word(6), word(10)));
                    }
                    _ => {}
                },
                REP_ACK => break,
                other => return Err(io::Error::other(format!("GO failed with reply type {other:#x}"))),
            }
        }
        let (size, transmission_flags) = export.expect("NBD_INFO_EXPORT before ACK");
        Ok(Client { socket, size, transmission_flags, block_size })
    }

    pub fn send(&mut self, flags: u16, command: u16, handle: u64, offset: u64, length: u32, payload: &[u8]) {
        let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
        bytes.extend_from_slice(&flags.to_be_bytes());
        bytes.extend_from_slice(&command.to_be_bytes());
        bytes.extend_from_slice(&handle.to_be_bytes());
        bytes.extend_from_slice(&offset.to_be_bytes());
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend_from_slice(payload);
        self.socket.write_all(&bytes).expect("send request");
    }

    /// Reads one simple reply; `data_len(handle)` says how many payload bytes
    /// follow a successful reply for that handle (the client must know).
    pub fn reply(&mut self, data_len: impl FnOnce(u64) -> usize) -> io::Result<Reply> {
        let magic = read_u32(&mut *self.socket)?;
        assert_eq!(magic, SIMPLE_REPLY_MAGIC);
        let error = read_u32(&mut *self.socket)?;
        let handle = read_u64(&mut *self.socket)?;
        let mut data = Vec::new();
        if error == 0 {
            data.resize(data_len(handle), 0);
            self.socket.read_exact(&mut data)?;
        }
        Ok(Reply { error, handle, data })
    }

    fn call(&mut self, flags: u16, command: u16, offset: u64, length: u32, payload: &[u8], data_len: usize) -> Reply {
        const HANDLE: u64 = 0xC0FFEE;
        self.send(flags, command, HANDLE, offset, length, payload);
        let reply = self.reply(|_| data_len).expect("reply");
        assert_eq!(reply.handle, HANDLE);
        reply
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Result<Vec<u8>, u32> {
        let reply = self.call(0, CMD_READ, offset, length, &[], length as usize);
        if reply.error == 0 {
            Ok(reply.data)
        } else {
            Err(reply.error)
        }
    }

    pub fn write(&mut self, flags: u16, offset: u64, data: &[u8]) -> u32 {
        self.call(flags, CMD_WRITE, offset, data.len() as u32, data, 0).error
    }

    pub fn command(&mut self, flags: u16, command: u16, offset: u64, length: u32) -> u32 {
        self.call(flags, command, offset, length, &[], 0).error
    }

    /// Sends NBD_CMD_DISC and waits for the server to close the connection.
    pub fn disconnect(mut self) {
        self.send(0, CMD_DISC, 0, 0, 0, &[]);
        assert_closed(&mut *self.socket);
    }
}

/// Asserts the server closes the connection (EOF or reset), reading and
/// discarding anything it still sends.
pub fn assert_closed(socket: &mut dyn Socket) {
    let mut sink = [0u8; 4096];
    loop {
        match socket.read(&mut sink) {
            Ok(0) => return,
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return,
            Err(error) => panic!("expected the server to close the connection, got {error}"),
        }
    }
}
