//! A well-behaved client over a real socket: handshake, every command, errors, pipelining.

use std::collections::HashMap;
use std::sync::Arc;

use duplex_nbd::ServerConfig;

use crate::client::*;
use crate::{exports, tcp_server, TestServer, DISK_BYTES};

#[test]
fn go_advertises_size_flags_and_block_size() {
    let (_, server) = tcp_server();
    let client = server.go("disk");
    assert_eq!(client.size, DISK_BYTES as u64);
    // HAS_FLAGS | SEND_FLUSH | SEND_FUA | SEND_TRIM | SEND_WRITE_ZEROES | CAN_MULTI_CONN
    assert_eq!(client.transmission_flags, 0x1 | 0x4 | 0x8 | 0x20 | 0x40 | 0x100);
    assert_eq!(client.block_size, Some((1, 4096, 32 << 20)));
    client.disconnect();

    let read_only = server.go("ro");
    assert_eq!(read_only.size, 64 * 1024);
    assert_eq!(read_only.transmission_flags & 0x2, 0x2, "READ_ONLY");
    read_only.disconnect();

    let default = server.go("");
    assert_eq!(default.size, DISK_BYTES as u64);
    default.disconnect();
}

#[test]
fn every_command_reaches_the_export() {
    let (disk, server) = tcp_server();
    let mut client = server.go("disk");
    let pattern: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();

    assert_eq!(client.write(0, 1000, &pattern), 0);
    assert_eq!(client.read(1000, 10_000).unwrap(), pattern);
    assert_eq!(disk.contents()[1000..11_000], pattern[..]);
    assert_eq!(client.read(999, 2).unwrap(), vec![0, pattern[0]]);

    assert_eq!(client.write(FLAG_FUA, 20_000, b"durable"), 0);
    assert_eq!(client.command(0, CMD_FLUSH, 0, 0), 0);
    assert_eq!(client.command(0, CMD_TRIM, 1000, 100), 0);
    assert_eq!(client.read(1000, 100).unwrap(), vec![0; 100], "MemoryExport zeroes trimmed ranges");
    assert_eq!(client.command(FLAG_NO_HOLE, CMD_WRITE_ZEROES, 2000, 500), 0);
    assert_eq!(client.command(FLAG_FUA, CMD_WRITE_ZEROES, 3000, 10), 0);
    assert_eq!(client.read(1900, 200).unwrap(), [&pattern[900..1000], &[0u8; 100][..]].concat());
    assert_eq!(client.command(0, CMD_CACHE, 0, 4096), 0);
    assert_eq!(client.read(20_000, 7).unwrap(), b"durable");
    client.disconnect();

    let stats = disk.stats();
    assert_eq!(stats.fua_writes, 1);
    assert_eq!(stats.trims, 1);
    assert_eq!((stats.write_zeroes, stats.write_zeroes_no_hole), (2, 1));
    assert_eq!(stats.flushes, 2, "one NBD_CMD_FLUSH and one for the FUA write_zeroes");
}

#[test]
fn bad_requests_get_nbd_errors_and_the_connection_survives() {
    let (disk, server) = tcp_server();
    let mut client = server.go("disk");
    let size = DISK_BYTES as u64;
    assert_eq!(client.read(size - 1, 2), Err(EINVAL));
    assert_eq!(client.read(u64::MAX - 1, 4), Err(EINVAL));
    assert_eq!(client.read(0, (32 << 20) + 1), Err(EINVAL), "over the advertised maximum");
    // The rejected write's payload is consumed: the next request still parses.
    assert_eq!(client.write(0, size - 2, b"four"), ENOSPC);
    assert_eq!(client.command(0, CMD_TRIM, size, 1), EINVAL);
    assert_eq!(client.command(0, CMD_WRITE_ZEROES, size - 1, 2), ENOSPC);
    assert_eq!(client.command(0, 42, 0, 0), EINVAL, "unknown command");
    assert_eq!(client.command(0, 7, 0, 512), EINVAL, "BLOCK_STATUS without negotiation");
    assert_eq!(client.command(4, CMD_READ, 0, 512), EINVAL, "DF flag without structured replies");
    assert_eq!(client.command(0x10, CMD_WRITE_ZEROES, 0, 512), EINVAL, "FAST_ZERO not advertised");
    assert_eq!(client.read(size - 4, 4), Ok(vec![0; 4]));
    client.disconnect();
    assert_eq!(disk.contents(), vec![0; DISK_BYTES], "no rejected request wrote anything");

    let mut read_only = server.go("ro");
    assert_eq!(read_only.write(0, 0, b"nope"), EPERM);
    assert_eq!(read_only.command(0, CMD_TRIM, 0, 512), EPERM);
    assert_eq!(read_only.command(0, CMD_WRITE_ZEROES, 0, 512), EPERM);
    assert_eq!(read_only.read(0, 4), Ok(vec![0; 4]));
    read_only.disconnect();
}

#[test]
fn pipelined_requests_each_get_exactly_one_reply() {
    let (disk, server) = tcp_server();
    let mut client = server.go("disk");
    const BLOCKS: u64 = 100;
    let block = |i: u64| vec![i as u8 ^ 0x5A; 4096];

    for i in 0..BLOCKS {
        client.send(0, CMD_WRITE, 1000 + i, i * 4096, 4096, &block(i));
    }
    let mut seen = HashMap::new();
    for _ in 0..BLOCKS {
        let reply = client.reply(|_| 0).expect("write reply");
        assert_eq!(reply.error, 0);
        assert!(seen.insert(reply.handle, ()).is_none(), "duplicate reply for {}", reply.handle);
    }
    assert_eq!(seen.len() as u64, BLOCKS);
    assert!(seen.keys().all(|handle| (1000..1000 + BLOCKS).contains(handle)));

    // Reads interleaved with flushes and a bad request; replies in any order.
    for i in 0..BLOCKS {
        client.send(0, CMD_READ, 5000 + i, i * 4096, 4096, &[]);
        if i % 10 == 0 {
            client.send(0, CMD_FLUSH, 9000 + i, 0, 0, &[]);
        }
    }
    client.send(0, CMD_READ, 9999, DISK_BYTES as u64, 1, &[]);
    let expected = BLOCKS + BLOCKS / 10 + 1;
    let mut reads = HashMap::new();
    for _ in 0..expected {
        let reply = client.reply(|handle| if handle < 9000 { 4096 } else { 0 }).expect("reply");
        match reply.handle {
            9999 => assert_eq!(reply.error, EINVAL),
            handle @ 9000.. => assert_eq!(reply.error, 0, "flush {handle}"),
            handle => {
                assert_eq!(reply.error, 0);
                assert!(reads.insert(handle - 5000, reply.data).is_none(), "duplicate reply");
            }
        }
    }
    for i in 0..BLOCKS {
        assert_eq!(reads[&i], block(i), "block {i}");
    }
    client.disconnect();
    assert_eq!(disk.contents()[..4096], block(0)[..]);
}

#[test]
fn largest_payloads_round_trip() {
    let disk = Arc::new(duplex_nbd::memory::MemoryExport::new(40 << 20));
    let exports = duplex_nbd::ExportMap::new().with("disk", disk.clone() as Arc<dyn duplex_nbd::Export>);
    let server = TestServer::tcp(Arc::new(exports), ServerConfig::default());
    let mut client = server.go("disk");
    let max = 32usize << 20;
    let payload: Vec<u8> = (0..max).map(|i| (i / 4096) as u8).collect();
    assert_eq!(client.write(0, 4096, &payload), 0);
    assert_eq!(client.read(4096, max as u32).unwrap(), payload);
    client.disconnect();
}

#[test]
fn connections_to_one_export_see_each_others_writes() {
    let (_, server) = tcp_server();
    let mut first = server.go("disk");
    let mut second = server.go("");
    assert_eq!(first.write(FLAG_FUA, 4096, b"shared"), 0);
    assert_eq!(second.read(4096, 6).unwrap(), b"shared");
    assert_eq!(second.command(0, CMD_WRITE_ZEROES, 4096, 6), 0);
    assert_eq!(first.read(4096, 6).unwrap(), vec![0; 6]);
    first.disconnect();
    second.disconnect();
}

#[test]
fn options_over_a_socket() {
    let (_, server) = tcp_server();
    let mut socket = server.connect();
    greet(&mut *socket).unwrap();

    send_option(&mut *socket, OPT_STRUCTURED_REPLY, &[]).unwrap();
    assert_eq!(read_option_reply(&mut *socket).unwrap().1, REP_ERR_UNSUP);

    send_option(&mut *socket, OPT_LIST, &[]).unwrap();
    let mut names = Vec::new();
    loop {
        let (option, reply_type, data) = read_option_reply(&mut *socket).unwrap();
        assert_eq!(option, OPT_LIST);
        if reply_type == REP_ACK {
            break;
        }
        assert_eq!(reply_type, REP_SERVER);
        let name_len = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
        names.push(String::from_utf8(data[4..4 + name_len].to_vec()).unwrap());
    }
    assert_eq!(names, ["disk", "ro"]);

    send_option(&mut *socket, OPT_GO, &go_data("missing", &[])).unwrap();
    let (_, reply_type, message) = read_option_reply(&mut *socket).unwrap();
    assert_eq!(reply_type, REP_ERR_UNKNOWN);
    assert!(String::from_utf8_lossy(&message).contains("missing"));

    let mut client = Client::go_after_greeting(socket, "disk").unwrap();
    assert_eq!(client.read(0, 1), Ok(vec![0]));
    client.disconnect();
}

#[test]
fn abort_ends_the_handshake() {
    let (_, server) = tcp_server();
    let mut socket = server.connect();
    greet(&mut *socket).unwrap();
    send_option(&mut *socket, OPT_ABORT, &[]).unwrap();
    let (option, reply_type, _) = read_option_reply(&mut *socket).unwrap();
    assert_eq!((option, reply_type), (OPT_ABORT, REP_ACK));
    assert_closed(&mut *socket);
}

#[test]
fn unix_socket_serves_the_same_protocol() {
    let (disk, exports) = exports();
    let server = TestServer::unix(exports, ServerConfig::default());
    let mut client = server.go("disk");
    assert_eq!(client.size, DISK_BYTES as u64);
    assert_eq!(client.write(0, 77, b"over unix"), 0);
    assert_eq!(client.read(77, 9).unwrap(), b"over unix");
    client.disconnect();
    assert_eq!(&disk.contents()[77..86], b"over unix");
    server.stop().unwrap();
}
