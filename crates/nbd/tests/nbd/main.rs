//! Integration tests: a real Server on 127.0.0.1:0 or a unix socket in a
//! tempdir, driven by a hand-written client, hostile clients, and the real
//! `nbdinfo` and `qemu-io`. One test binary, so the crate links once.

mod client;
mod hostile;
mod limits;
mod protocol;
mod real_clients;
mod transmission;

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use duplex_nbd::memory::MemoryExport;
use duplex_nbd::{Export, ExportMap, Exports, Listener, Server, ServerConfig, ShutdownHandle};

use client::{Client, Socket};

pub const DISK_BYTES: usize = 1 << 20;

/// A server running on its own thread; stopped (and joined) on drop.
pub struct TestServer {
    pub addr: Option<SocketAddr>,
    pub socket_path: Option<PathBuf>,
    shutdown: ShutdownHandle,
    thread: Option<JoinHandle<io::Result<()>>>,
    _dir: Option<tempfile::TempDir>,
}

impl TestServer {
    pub fn tcp(exports: Arc<dyn Exports>, config: ServerConfig) -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let server = Server::new(Listener::Tcp(listener), exports, config);
        let addr = server.tcp_addr();
        assert!(server.local_addr().starts_with("127.0.0.1:"));
        Self::start(server, addr, None, None)
    }

    pub fn unix(exports: Arc<dyn Exports>, config: ServerConfig) -> TestServer {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nbd.sock");
        let listener = UnixListener::bind(&path).expect("bind unix socket");
        let server = Server::new(Listener::Unix(listener), exports, config);
        assert_eq!(server.local_addr(), format!("unix:{}", path.display()));
        Self::start(server, None, Some(path), Some(dir))
    }

    fn start(
        server: Server,
        addr: Option<SocketAddr>,
        socket_path: Option<PathBuf>,
        dir: Option<tempfile::TempDir>,
    ) -> TestServer {
        let shutdown = server.shutdown_handle();
        let thread = thread::Builder::new().name("nbd-test-server".into()).spawn(move || server.run()).unwrap();
        TestServer { addr, socket_path, shutdown, thread: Some(thread), _dir: dir }
    }

    pub fn connect(&self) -> Box<dyn Socket> {
        match (&self.addr, &self.socket_path) {
            (Some(addr), _) => client::tcp(*addr),
            (None, Some(path)) => client::unix(path),
            (None, None) => unreachable!(),
        }
    }

    pub fn go(&self, name: &str) -> Client {
        Client::go(self.connect(), name).expect("handshake")
    }

    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|thread| !thread.is_finished())
    }

    /// Shuts down and returns what `run` returned.
    pub fn stop(mut self) -> io::Result<()> {
        self.shutdown.shutdown();
        self.thread.take().expect("running").join().expect("server thread panicked")
    }

    /// A good client still gets full service: the server survived whatever came before.
    pub fn assert_serves(&self) {
        assert!(self.is_running(), "server thread exited");
        let mut client = self.go("disk");
        let pattern: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        assert_eq!(client.write(0, 8192, &pattern), 0);
        assert_eq!(client.read(8192, 4096), Ok(pattern));
        client.disconnect();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.shutdown();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// "disk" (the default, 1 MiB, with a description) and "ro" (read-only, 64 KiB).
pub fn exports() -> (Arc<MemoryExport>, Arc<dyn Exports>) {
    let disk = Arc::new(MemoryExport::new(DISK_BYTES));
    let read_only: Arc<dyn Export> = Arc::new(MemoryExport::new(64 * 1024).with_read_only(true));
    let map = ExportMap::new()
        .with_description("disk", Arc::clone(&disk) as Arc<dyn Export>, "a test disk")
        .with("ro", read_only)
        .with_default("disk");
    (disk, Arc::new(map))
}

pub fn tcp_server() -> (Arc<MemoryExport>, TestServer) {
    let (disk, exports) = exports();
    (disk, TestServer::tcp(exports, ServerConfig::default()))
}

/// Polls `condition` until it holds or `timeout` passes.
pub fn wait_for(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    condition()
}
