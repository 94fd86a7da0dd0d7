//! `duplex nbd serve`: one image as an NBD export.
//!
//! Durability: an acknowledged NBD write is already in the operation log of
//! every replica (what that survives depends on the OSDs' oplog mode, see
//! docs/OSD.md), so FLUSH has nothing left to do and FUA is implied. Reads
//! go to each PG's primary, which sees every acknowledged write, so several
//! connections to one export (multi-conn) see one consistent disk.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use duplex_client::{ClientError, Image};
use duplex_nbd::{Done, Errno, Export, ExportMap, Listener, Server, ServerConfig};

use duplex_store::units::format_size;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The image to export, or IMAGE@SNAP for a snapshot, read-only (the
    /// export's name is IMAGE or IMAGE@SNAP; clients may also ask for "").
    #[arg(long)]
    pub image: String,
    /// TCP address to listen on (loopback by default; NBD has no authentication).
    #[arg(long, conflicts_with = "socket")]
    pub listen: Option<SocketAddr>,
    /// Unix socket to listen on instead of TCP.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Connections served at once.
    #[arg(long, default_value_t = 64)]
    pub max_connections: usize,
}

/// An image as an NBD export.
pub struct ImageExport {
    image: Arc<Image>,
}

impl ImageExport {
    pub fn new(image: Arc<Image>) -> ImageExport {
        ImageExport { image }
    }
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it starts
/// from now on (call it before the client starts its threads), so that
/// [`close_on_stop_signal`]'s thread alone receives them.
pub fn block_stop_signals() {
    // SAFETY: plain libc calls on a local, initialized signal set.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// On SIGINT or SIGTERM: ends the image's watch (so that a snapshot need
/// not wait for this gateway to be found dead), then exits.
pub fn close_on_stop_signal(image: Arc<Image>) -> Result<()> {
    std::thread::Builder::new()
        .name("duplex-nbd-signals".into())
        .spawn(move || {
            let mut signal = 0;
            // SAFETY: sigwait on a local, initialized set of signals this
            // process blocked in every thread (block_stop_signals).
            let waited = unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGINT);
                libc::sigaddset(&mut set, libc::SIGTERM);
                libc::sigwait(&set, &mut signal)
            };
            if waited == 0 {
                tracing::info!(signal, "stopping: the image's watch ends first");
                image.close();
                std::process::exit(0);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

fn errno(err: ClientError) -> Errno {
    tracing::warn!(%err, "NBD command failed");
    match err {
        ClientError::Invalid(_) => Errno::Inval,
        ClientError::NoSpace(_) => Errno::NoSpc,
        ClientError::Shutdown => Errno::Shutdown,
        ClientError::ReadOnly(_) => Errno::Perm,
        _ => Errno::Io,
    }
}

impl Export for ImageExport {
    fn size(&self) -> u64 {
        self.image.size()
    }

    fn read_only(&self) -> bool {
        self.image.snapshot().is_some()
    }

    fn read(&self, offset: u64, len: u32, done: Done<Bytes>) {
        self.image.read_async(offset, len, Box::new(move |r| done(r.map_err(errno))));
    }

    fn write(&self, offset: u64, data: Bytes, _fua: bool, done: Done<()>) {
        // FUA needs nothing more: acknowledged means logged on every replica.
        self.image.write_async(offset, data, Box::new(move |r| done(r.map_err(errno))));
    }

    fn flush(&self, done: Done<()>) {
        self.image.flush_async(Box::new(move |r| done(r.map_err(errno))));
    }

    fn trim(&self, offset: u64, len: u32, done: Done<()>) {
        self.image.discard_async(offset, len as u64, Box::new(move |r| done(r.map_err(errno))));
    }

    fn write_zeroes(&self, offset: u64, len: u32, _may_trim: bool, done: Done<()>) {
        self.image.write_zeroes_async(offset, len as u64, Box::new(move |r| done(r.map_err(errno))));
    }
}

fn image_is_snapshot(export: &str) -> bool {
    export.contains('@')
}

/// Binds the listener and builds the server (not yet running).
pub fn server(image: Arc<Image>, args: &ServeArgs) -> Result<Server> {
    let name = match image.snapshot() {
        Some(snap) => format!("{}@{}", image.info().name, snap.name),
        None => image.info().name.clone(),
    };
    let size = image.size();
    let exports = ExportMap::new().with(name.clone(), Arc::new(ImageExport::new(image))).with_default(name.clone());
    let listener = match (&args.socket, args.listen) {
        (Some(path), _) => {
            if path.exists() {
                bail!("{} exists; remove it or pick another --socket", path.display());
            }
            Listener::Unix(
                std::os::unix::net::UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?,
            )
        }
        (None, listen) => {
            let addr = listen.unwrap_or_else(|| "127.0.0.1:10809".parse().expect("static address"));
            Listener::Tcp(std::net::TcpListener::bind(addr).with_context(|| format!("binding {addr}"))?)
        }
    };
    if args.max_connections == 0 {
        bail!("--max-connections must be at least 1");
    }
    let config = ServerConfig { max_connections: args.max_connections, ..ServerConfig::default() };
    let server = Server::new(listener, Arc::new(exports), config);
    let uri = match &args.socket {
        Some(path) => format!("nbd+unix:///{name}?socket={}", path.display()),
        None => format!("nbd://{}/{name}", server.local_addr()),
    };
    let what = if image_is_snapshot(&name) { "snapshot (read-only)" } else { "image" };
    println!("serving {what} '{name}' ({}) at {uri}", format_size(size));
    Ok(server)
}
