//! Hostile and broken clients: each must be answered with an NBD error or a
//! closed connection, and the server must go on serving good clients.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use crate::client::*;
use crate::tcp_server;

/// Writes raw bytes, then expects the server to hang up.
fn send_and_expect_close(socket: &mut dyn Socket, bytes: &[u8]) {
    // The server may close before reading everything; a failed write is fine.
    let _ = socket.write_all(bytes);
    assert_closed(socket);
}

fn option_header(option: u32, length: u32) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

fn request(flags: u16, command: u16, handle: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut bytes = REQUEST_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&handle.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

#[test]
fn garbage_during_the_handshake_closes_the_connection() {
    let (_, server) = tcp_server();

    // Not even valid client flags.
    let mut socket = server.connect();
    let mut greeting = [0u8; 18];
    socket.read_exact(&mut greeting).unwrap();
    send_and_expect_close(&mut *socket, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");

    // Bad option magic.
    let mut socket = server.connect();
    greet(&mut *socket).unwrap();
    send_and_expect_close(&mut *socket, &[0xFF; 64]);

    // NBD_OPT_EXPORT_NAME for a missing export cannot be answered with an error.
    let mut socket = server.connect();
    greet(&mut *socket).unwrap();
    let mut bytes = option_header(1, 7);
    bytes.extend_from_slice(b"missing");
    send_and_expect_close(&mut *socket, &bytes);

    server.assert_serves();
}

#[test]
fn huge_option_length_is_refused_without_waiting_for_the_data() {
    let (_, server) = tcp_server();
    let mut socket = server.connect();
    greet(&mut *socket).unwrap();
    let started = Instant::now();
    send_and_expect_close(&mut *socket, &option_header(OPT_GO, u32::MAX));
    assert!(started.elapsed() < Duration::from_secs(2), "must not wait for 4 GiB of option data");

    let mut socket = server.connect();
    greet(&mut *socket).unwrap();
    send_and_expect_close(&mut *socket, &option_header(12345, 64 * 1024 + 1));
    server.assert_serves();
}

#[test]
fn option_length_lies_get_err_invalid_and_haggling_continues() {
    let (_, server) = tcp_server();
    let mut socket = server.connect();
    greet(&mut *socket).unwrap();
    // GO whose name length points past the option data.
    let mut data = 1000u32.to_be_bytes().to_vec();
    data.extend_from_slice(b"disk\0\0");
    send_option(&mut *socket, OPT_GO, &data).unwrap();
    let (option, reply_type, _) = read_option_reply(&mut *socket).unwrap();
    assert_eq!((option, reply_type), (OPT_GO, 0x8000_0003), "NBD_REP_ERR_INVALID");
    // LIST with data.
    send_option(&mut *socket, OPT_LIST, b"x").unwrap();
    assert_eq!(read_option_reply(&mut *socket).unwrap().1, 0x8000_0003);

    let mut client = Client::go_after_greeting(socket, "disk").unwrap();
    assert_eq!(client.read(0, 8), Ok(vec![0; 8]));
    client.disconnect();
}

#[test]
fn unrecoverable_requests_close_the_connection() {
    let (disk, server) = tcp_server();

    // Bad request magic.
    let mut client = server.go("disk");
    let mut bytes = request(0, CMD_READ, 1, 0, 512);
    bytes[0] = 0;
    send_and_expect_close(&mut *client.socket, &bytes);

    // A WRITE payload over 32 MiB: the server will not buffer it, so it cannot resync.
    let mut client = server.go("disk");
    send_and_expect_close(&mut *client.socket, &request(0, CMD_WRITE, 2, 0, u32::MAX));

    // A truncated request, then the client goes away.
    let mut client = server.go("disk");
    client.socket.write_all(&request(0, CMD_WRITE, 3, 0, 4096)[..20]).unwrap();
    drop(client);

    // A truncated WRITE payload, then the client goes away.
    let mut client = server.go("disk");
    let mut bytes = request(0, CMD_WRITE, 4, 0, 4096);
    bytes.extend_from_slice(&[0xAB; 100]);
    client.socket.write_all(&bytes).unwrap();
    drop(client);

    // Many requests whose replies the client never reads, then it vanishes.
    let mut client = server.go("disk");
    for handle in 0..200 {
        client.send(0, CMD_READ, handle, 0, 64 * 1024, &[]);
    }
    drop(client);

    server.assert_serves();
    assert!(disk.contents()[..4096].iter().all(|&byte| byte != 0xAB), "truncated write must not be applied");
}

#[test]
fn recoverable_abuse_gets_errors_on_a_live_connection() {
    let (_, server) = tcp_server();
    let mut client = server.go("disk");
    assert_eq!(client.read(0, u32::MAX), Err(EINVAL));
    assert_eq!(client.command(0xFFFF, CMD_FLUSH, 0, 0), EINVAL);
    assert_eq!(client.command(0, 0xFFFF, u64::MAX, u32::MAX), EINVAL);
    assert_eq!(client.command(0, CMD_TRIM, u64::MAX, u32::MAX), EINVAL);
    assert_eq!(client.command(0, CMD_WRITE_ZEROES, u64::MAX, 1), ENOSPC);
    // Zero-length commands are odd but legal.
    assert_eq!(client.read(0, 0), Ok(Vec::new()));
    assert_eq!(client.write(0, 0, &[]), 0);
    assert_eq!(client.read(12, 4), Ok(vec![0; 4]));
    client.disconnect();
}

#[test]
fn random_bytes_never_take_the_server_down() {
    let (_, server) = tcp_server();
    // A fixed-seed xorshift: reproducible without a rand dependency.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for round in 0..24 {
        let len = (next() % 300) as usize;
        let noise: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        match round % 3 {
            // Straight after connecting, or after valid client flags. The
            // half-close makes short noise end in EOF rather than a wait for
            // the handshake deadline.
            0 | 1 => {
                let stream = TcpStream::connect(server.addr.unwrap()).unwrap();
                stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
                let mut socket: Box<dyn Socket> = Box::new(stream.try_clone().unwrap());
                if round % 3 == 1 {
                    greet(&mut *socket).unwrap();
                }
                let _ = socket.write_all(&noise);
                let _ = stream.shutdown(Shutdown::Write);
                assert_closed(&mut *socket);
            }
            // In the transmission phase, after a valid request.
            _ => {
                let mut client = server.go("disk");
                assert_eq!(client.read(0, 4), Ok(vec![0; 4]));
                let _ = client.socket.write_all(&noise);
                drop(client);
            }
        }
    }
    server.assert_serves();
}
