//! Bounds and lifecycle: in-flight limit, DISC draining, connection limit,
//! handshake deadline, shutdown.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_nbd::{Done, Errno, Export, ExportMap, ServerConfig};

use crate::client::*;
use crate::{exports, wait_for, TestServer};

/// Holds every read's completion until the test releases it, so tests can
/// see how many commands the server has in flight.
#[derive(Default)]
struct HeldExport {
    held: Mutex<Vec<(u32, Done<Bytes>)>>,
}

impl HeldExport {
    fn held(&self) -> usize {
        self.held.lock().unwrap().len()
    }

    fn release_all(&self) {
        let held: Vec<_> = self.held.lock().unwrap().drain(..).collect();
        for (len, done) in held {
            done(Ok(Bytes::from(vec![0xEE; len as usize])));
        }
    }
}

impl Export for HeldExport {
    fn size(&self) -> u64 {
        1 << 20
    }
    fn read(&self, _offset: u64, len: u32, done: Done<Bytes>) {
        self.held.lock().unwrap().push((len, done));
    }
    fn write(&self, _offset: u64, _data: Bytes, _fua: bool, done: Done<()>) {
        done(Err(Errno::Io));
    }
    fn flush(&self, done: Done<()>) {
        done(Ok(()));
    }
    fn trim(&self, _offset: u64, _len: u32, done: Done<()>) {
        done(Ok(()));
    }
    fn write_zeroes(&self, _offset: u64, _len: u32, _may_trim: bool, done: Done<()>) {
        done(Ok(()));
    }
}

fn held_server(config: ServerConfig) -> (Arc<HeldExport>, TestServer) {
    let export = Arc::new(HeldExport::default());
    let exports = ExportMap::new().with("disk", export.clone() as Arc<dyn Export>);
    (export, TestServer::tcp(Arc::new(exports), config))
}

#[test]
fn in_flight_commands_are_bounded_per_connection() {
    let config = ServerConfig { max_in_flight_per_connection: 2, ..ServerConfig::default() };
    let (export, server) = held_server(config);
    let mut client = server.go("disk");
    for handle in 0..5 {
        client.send(0, CMD_READ, handle, handle * 512, 512, &[]);
    }
    assert!(wait_for(Duration::from_secs(2), || export.held() == 2));
    thread::sleep(Duration::from_millis(100));
    assert_eq!(export.held(), 2, "the server must stop reading at the in-flight bound");

    let mut replied = Vec::new();
    while replied.len() < 5 {
        assert!(wait_for(Duration::from_secs(2), || export.held() > 0), "more commands must start as replies go out");
        assert!(export.held() <= 2);
        let batch = export.held();
        export.release_all();
        for _ in 0..batch {
            let reply = client.reply(|_| 512).unwrap();
            assert_eq!((reply.error, reply.data.len()), (0, 512));
            replied.push(reply.handle);
        }
    }
    replied.sort_unstable();
    assert_eq!(replied, [0, 1, 2, 3, 4]);
    client.disconnect();
}

/// A client whose socket the test can also time reads on and half-close.
fn raw_client(server: &TestServer) -> (TcpStream, Client) {
    let stream = TcpStream::connect(server.addr.unwrap()).unwrap();
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
    let client = Client::go(Box::new(stream.try_clone().unwrap()), "disk").unwrap();
    (stream, client)
}

/// Asserts nothing arrives and the connection stays open for a while.
fn assert_still_open(stream: &TcpStream) {
    stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut byte = [0u8; 1];
    let early = (&*stream).read(&mut byte);
    assert!(
        matches!(&early, Err(error) if matches!(error.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)),
        "connection must stay open while a reply is owed, got {early:?}"
    );
    stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
}

#[test]
fn disconnect_waits_for_in_flight_replies() {
    let (export, server) = held_server(ServerConfig::default());
    let (stream, mut client) = raw_client(&server);
    client.send(0, CMD_READ, 1, 0, 4, &[]);
    client.send(0, CMD_READ, 2, 4, 4, &[]);
    client.send(0, CMD_DISC, 3, 0, 0, &[]);
    assert!(wait_for(Duration::from_secs(2), || export.held() == 2));
    assert_still_open(&stream);

    export.release_all();
    let mut handles = [client.reply(|_| 4).unwrap().handle, client.reply(|_| 4).unwrap().handle];
    handles.sort_unstable();
    assert_eq!(handles, [1, 2], "both in-flight reads answered after DISC");
    assert_closed(&mut *client.socket);
}

#[test]
fn end_of_stream_also_drains_in_flight_replies() {
    let (export, server) = held_server(ServerConfig::default());
    let (stream, mut client) = raw_client(&server);
    client.send(0, CMD_READ, 7, 0, 16, &[]);
    assert!(wait_for(Duration::from_secs(2), || export.held() == 1));
    stream.shutdown(Shutdown::Write).unwrap();
    assert_still_open(&stream);

    export.release_all();
    let reply = client.reply(|_| 16).unwrap();
    assert_eq!((reply.error, reply.handle, reply.data), (0, 7, vec![0xEE; 16]));
    assert_closed(&mut *client.socket);
}

#[test]
fn connections_beyond_the_limit_are_refused() {
    let (_, exports) = exports();
    let config = ServerConfig { max_connections: 1, ..ServerConfig::default() };
    let server = TestServer::tcp(exports, config);
    let first = server.go("disk");

    let mut refused = server.connect();
    let mut byte = [0u8; 1];
    match refused.read(&mut byte) {
        Ok(0) => {}
        Err(error) if error.kind() == io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the extra connection to be closed, got {other:?}"),
    }

    first.disconnect();
    // The slot frees once the connection thread has finished.
    let admitted = wait_for(Duration::from_secs(2), || Client::go(server.connect(), "disk").is_ok());
    assert!(admitted, "a new connection is served once the first one is gone");
}

#[test]
fn handshake_deadline_closes_silent_and_dribbling_clients() {
    let (_, exports) = exports();
    let config = ServerConfig { handshake_timeout: Duration::from_millis(300), ..ServerConfig::default() };
    let server = TestServer::tcp(exports, config);

    let started = Instant::now();
    let mut silent = server.connect();
    let mut greeting = [0u8; 18];
    silent.read_exact(&mut greeting).unwrap();
    assert_closed(&mut *silent);
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(250) && elapsed < Duration::from_secs(3), "closed after {elapsed:?}");

    // One byte every 50 ms never lets a per-read timeout fire; the deadline must.
    let started = Instant::now();
    let mut dribbler = server.connect();
    dribbler.read_exact(&mut greeting).unwrap();
    let mut handshake = 3u32.to_be_bytes().to_vec();
    handshake.extend_from_slice(&IHAVEOPT.to_be_bytes());
    handshake.extend_from_slice(&OPT_GO.to_be_bytes());
    handshake.extend_from_slice(&200u32.to_be_bytes());
    handshake.extend_from_slice(&[0; 200]);
    let mut closed = false;
    for byte in handshake {
        if dribbler.write_all(&[byte]).is_err() {
            closed = true;
            break;
        }
        thread::sleep(Duration::from_millis(50));
        if started.elapsed() > Duration::from_secs(2) {
            break;
        }
    }
    if !closed {
        assert_closed(&mut *dribbler);
    }
    assert!(started.elapsed() < Duration::from_secs(3), "the deadline covers the whole handshake");
    server.assert_serves();
}

#[test]
fn shutdown_closes_connections_and_returns() {
    let (_, exports) = exports();
    let server = TestServer::tcp(exports, ServerConfig::default());
    let mut in_transmission = server.go("disk");
    let mut in_handshake = server.connect();
    let mut greeting = [0u8; 18];
    in_handshake.read_exact(&mut greeting).unwrap();
    assert_eq!(in_transmission.read(0, 1), Ok(vec![0]));

    let started = Instant::now();
    server.stop().expect("run returns Ok after shutdown");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_closed(&mut *in_transmission.socket);
    assert_closed(&mut *in_handshake);
}

#[test]
fn shutdown_before_run_returns_at_once() {
    let (_, exports) = exports();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let server = duplex_nbd::Server::new(duplex_nbd::Listener::Tcp(listener), exports, ServerConfig::default());
    let handle = server.shutdown_handle();
    handle.shutdown();
    assert!(handle.is_shutdown());
    server.run().unwrap();
}

#[test]
fn shutdown_answers_in_flight_commands_within_the_grace() {
    let (export, server) = held_server(ServerConfig::default());
    let (_stream, mut client) = raw_client(&server);
    client.send(0, CMD_READ, 5, 0, 8, &[]);
    assert!(wait_for(Duration::from_secs(2), || export.held() == 1));

    let stopping = thread::spawn(move || server.stop());
    thread::sleep(Duration::from_millis(100));
    assert!(!stopping.is_finished(), "shutdown waits for the in-flight read");
    export.release_all();
    let reply = client.reply(|_| 8).unwrap();
    assert_eq!((reply.error, reply.handle, reply.data), (0, 5, vec![0xEE; 8]));
    assert_closed(&mut *client.socket);
    stopping.join().unwrap().unwrap();
}

#[test]
fn shutdown_closes_stuck_connections_after_the_grace() {
    let config = ServerConfig { shutdown_grace: Duration::from_millis(200), ..ServerConfig::default() };
    let (export, server) = held_server(config);
    let (_stream, mut client) = raw_client(&server);
    client.send(0, CMD_READ, 5, 0, 8, &[]);
    assert!(wait_for(Duration::from_secs(2), || export.held() == 1));

    let started = Instant::now();
    server.stop().unwrap();
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(150) && elapsed < Duration::from_secs(2), "stopped after {elapsed:?}");
    assert_closed(&mut *client.socket);
    // The export completing late must not disturb anything.
    export.release_all();
}
