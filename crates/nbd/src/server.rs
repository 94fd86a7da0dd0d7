//! The listener side: accept loop, connection limit, shutdown.
//!
//! [`Server::run`] polls the listener together with a wake-up socket, so
//! [`ShutdownHandle::shutdown`] from any thread makes it stop accepting and
//! stop reading requests, wait up to [`ServerConfig::shutdown_grace`] for
//! in-flight commands to be answered, close every connection and join the
//! connection threads before returning.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

pub use crate::config::ServerConfig;
use crate::connection::{self, ConnectionControl};
use crate::stream::Stream;
use crate::Exports;

/// How long to back off after a failing accept (e.g. EMFILE), which would
/// otherwise spin: the listener stays readable.
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(50);
/// How often shutdown checks whether connections have drained.
const SHUTDOWN_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Where a server listens.
pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn accept(&self) -> io::Result<Stream> {
        match self {
            Listener::Tcp(listener) => listener.accept().map(|(stream, _)| Stream::Tcp(stream)),
            Listener::Unix(listener) => listener.accept().map(|(stream, _)| Stream::Unix(stream)),
        }
    }

    fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Listener::Tcp(listener) => listener.set_nonblocking(true),
            Listener::Unix(listener) => listener.set_nonblocking(true),
        }
    }

    fn raw_fd(&self) -> RawFd {
        match self {
            Listener::Tcp(listener) => listener.as_raw_fd(),
            Listener::Unix(listener) => listener.as_raw_fd(),
        }
    }
}

struct ShutdownState {
    requested: AtomicBool,
    /// Write end of the wake-up socket pair; `None` if it could not be
    /// created (then [`Server::run`] fails at once).
    waker: Option<UnixStream>,
}

/// Stops a running [`Server`] from any thread; cheap to clone.
#[derive(Clone)]
pub struct ShutdownHandle {
    state: Arc<ShutdownState>,
}

impl ShutdownHandle {
    /// Makes [`Server::run`] close every connection and return. Idempotent;
    /// works before `run` starts too.
    pub fn shutdown(&self) {
        self.state.requested.store(true, Ordering::SeqCst);
        if let Some(waker) = &self.state.waker {
            // Non-blocking: if the socket buffer is full, a wake-up is already pending.
            let _ = (&*waker).write(&[1]);
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.state.requested.load(Ordering::SeqCst)
    }
}

/// An NBD server over one listener.
pub struct Server {
    listener: Listener,
    exports: Arc<dyn Exports>,
    config: ServerConfig,
    shutdown: ShutdownHandle,
    /// Read end of the wake-up pair, or why it could not be made.
    wake: io::Result<UnixStream>,
}

impl Server {
    /// Panics if a limit in `config` is zero.
    pub fn new(listener: Listener, exports: Arc<dyn Exports>, config: ServerConfig) -> Server {
        assert!(config.max_connections > 0, "max_connections must be positive");
        assert!(config.max_in_flight_per_connection > 0, "max_in_flight_per_connection must be positive");
        assert!(config.max_in_flight_bytes_per_connection > 0, "max_in_flight_bytes_per_connection must be positive");
        assert!(!config.handshake_timeout.is_zero(), "handshake_timeout must be positive");
        let pair = UnixStream::pair().and_then(|(waker, wake)| {
            waker.set_nonblocking(true)?;
            wake.set_nonblocking(true)?;
            Ok((waker, wake))
        });
        let (waker, wake) = match pair {
            Ok((waker, wake)) => (Some(waker), Ok(wake)),
            Err(error) => (None, Err(error)),
        };
        let shutdown = ShutdownHandle { state: Arc::new(ShutdownState { requested: AtomicBool::new(false), waker }) };
        Server { listener, exports, config, shutdown, wake }
    }

    /// The listening address for printing: `ip:port`, or `unix:PATH`.
    pub fn local_addr(&self) -> String {
        match &self.listener {
            Listener::Tcp(listener) => listener.local_addr().map_or_else(|_| "tcp:?".to_string(), |a| a.to_string()),
            Listener::Unix(listener) => match listener.local_addr() {
                Ok(addr) => match addr.as_pathname() {
                    Some(path) => format!("unix:{}", path.display()),
                    None => "unix:(unnamed)".to_string(),
                },
                Err(_) => "unix:?".to_string(),
            },
        }
    }

    /// The TCP address, if listening on TCP (e.g. to learn the port of `127.0.0.1:0`).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match &self.listener {
            Listener::Tcp(listener) => listener.local_addr().ok(),
            Listener::Unix(_) => None,
        }
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Accepts and serves connections until shutdown, then closes them all.
    pub fn run(self) -> io::Result<()> {
        info!(addr = %self.local_addr(), "nbd server listening");
        let Server { listener, exports, config, shutdown, wake } = self;
        let wake = wake?;
        listener.set_nonblocking()?;
        let mut connections = Connections::default();
        let result = loop {
            if shutdown.is_shutdown() {
                break Ok(());
            }
            if let Err(error) = wait_readable(listener.raw_fd(), wake.as_raw_fd()) {
                break Err(error);
            }
            accept_ready(&listener, &shutdown, &mut connections, &exports, &config);
            connections.reap();
        };
        info!(open = connections.live(), "nbd server shutting down");
        connections.close_all(config.shutdown_grace);
        result
    }
}

/// Accepts until the listener has no more pending connections.
fn accept_ready(
    listener: &Listener,
    shutdown: &ShutdownHandle,
    connections: &mut Connections,
    exports: &Arc<dyn Exports>,
    config: &ServerConfig,
) {
    while !shutdown.is_shutdown() {
        match listener.accept() {
            Ok(stream) => connections.admit(stream, exports, config),
            Err(error) => match error.kind() {
                io::ErrorKind::WouldBlock => return,
                io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted => {}
                _ => {
                    warn!(%error, "nbd accept failed");
                    thread::sleep(ACCEPT_ERROR_BACKOFF);
                    return;
                }
            },
        }
    }
}

/// Blocks until the listener or the wake-up socket is readable.
fn wait_readable(listener_fd: RawFd, wake_fd: RawFd) -> io::Result<()> {
    let mut fds = [
        libc::pollfd { fd: listener_fd, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: wake_fd, events: libc::POLLIN, revents: 0 },
    ];
    // SAFETY: `fds` is a live array of `fds.len()` pollfd structs for the whole call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, -1) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
    Ok(())
}

type Registry = Arc<Mutex<HashMap<u64, Arc<ConnectionControl>>>>;

fn lock(registry: &Registry) -> MutexGuard<'_, HashMap<u64, Arc<ConnectionControl>>> {
    // Inserts and removes are single operations; a poisoned map is still consistent.
    registry.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Live connections (shared with their threads, which remove themselves)
/// and the threads serving them (owned by the accept loop).
#[derive(Default)]
struct Connections {
    registry: Registry,
    threads: Vec<JoinHandle<()>>,
    next_id: u64,
}

/// Removes a connection from the registry when its thread ends, however it ends.
struct Deregister {
    id: u64,
    registry: Registry,
}

impl Drop for Deregister {
    fn drop(&mut self) {
        lock(&self.registry).remove(&self.id);
    }
}

impl Connections {
    fn live(&self) -> usize {
        lock(&self.registry).len()
    }

    fn admit(&mut self, stream: Stream, exports: &Arc<dyn Exports>, config: &ServerConfig) {
        let peer = stream.peer();
        if let Err(error) = stream.configure() {
            debug!(%peer, %error, "could not configure nbd connection; closing");
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let control = Arc::new(ConnectionControl::new(stream, config));
        {
            let mut registry = lock(&self.registry);
            if registry.len() >= config.max_connections {
                warn!(%peer, max_connections = config.max_connections, "nbd connection limit reached; refusing");
                drop(registry);
                control.close();
                return;
            }
            registry.insert(id, Arc::clone(&control));
        }
        let deregister = Deregister { id, registry: Arc::clone(&self.registry) };
        let exports = Arc::clone(exports);
        let thread_config = config.clone();
        let thread_control = Arc::clone(&control);
        let spawned = thread::Builder::new().name(format!("nbd-conn-{id}")).spawn(move || {
            let _deregister = deregister;
            connection::serve(id, thread_control, &*exports, &thread_config);
        });
        match spawned {
            Ok(handle) => self.threads.push(handle),
            Err(error) => {
                // The closure (and its Deregister) was dropped with the failed spawn.
                warn!(%peer, %error, "could not start an nbd connection thread");
                control.close();
            }
        }
    }

    /// Forgets threads that have finished, so the list stays bounded by the live count.
    fn reap(&mut self) {
        self.threads.retain(|handle| !handle.is_finished());
    }

    /// Stops reading from every connection, gives in-flight commands up to
    /// `grace` to be answered (the spec asks servers to serve them before a
    /// shutdown disconnect), then closes whatever is left and joins.
    fn close_all(&mut self, grace: Duration) {
        let open: Vec<Arc<ConnectionControl>> = lock(&self.registry).values().cloned().collect();
        for control in &open {
            control.stop_reading();
        }
        let deadline = Instant::now() + grace;
        while self.threads.iter().any(|handle| !handle.is_finished()) && Instant::now() < deadline {
            thread::sleep(SHUTDOWN_POLL_INTERVAL);
        }
        for control in &open {
            control.close();
        }
        for handle in self.threads.drain(..) {
            if handle.join().is_err() {
                warn!("an nbd connection thread panicked");
            }
        }
    }
}
