//! [`Client`]: a connection to a Duplex cluster, shared by every thread
//! that holds a clone of it.
//!
//! Each operation has an asynchronous form (`submit`, with a callback) and
//! the blocking forms below built on it. Many operations may be in flight
//! at once; they are pipelined over one connection per OSD.
//!
//! ```no_run
//! use duplex_client::{Client, ClientConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ClientConfig::from_file("duplex-dev/client.toml".as_ref())?;
//! let client = Client::connect(config)?;
//! let pool = client.pool_id("rbd")?;
//! client.write(pool, b"greeting", 0, b"hello".to_vec().into())?;
//! assert_eq!(&client.read(pool, b"greeting", 0, 5)?[..], b"hello");
//! client.set_attr(pool, b"greeting", b"lang", b"en")?;
//! assert_eq!(client.stat(pool, b"greeting")?.size, 5);
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use crossbeam_channel::Sender;
use duplex_map::ClusterMap;
use duplex_mon_client::Credentials;
use duplex_mon_client::MonClient;
use duplex_proto::osd::{decode_attrs, decode_names, Attrs, ObjectStat, OpKind};

use crate::error::ClientError;
use crate::runtime::{follow_map, Callback, Command, ObjectOp, Runtime, RuntimeConfig, WAKER};

/// Where the cluster is and how to prove membership. (No `Debug`: it
/// holds the cluster secret.)
#[derive(Clone)]
pub struct ClientConfig {
    pub monitors: Vec<(u64, SocketAddr)>,
    pub credentials: Credentials,
    /// How long one operation may take, retries included, before it fails.
    pub op_timeout: Duration,
    /// How long connecting to one OSD may take.
    pub connect_timeout: Duration,
}

/// The client configuration file (`duplex dev up` writes one):
///
/// ```toml
/// fsid = "00112233445566778899aabbccddeeff"
/// secret_file = "secret"            # relative to this file
/// monitors = ["1=127.0.0.1:6789"]
/// op_timeout_ms = 30000             # optional
/// ```
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    fsid: String,
    secret_file: std::path::PathBuf,
    monitors: Vec<String>,
    #[serde(default)]
    op_timeout_ms: Option<u64>,
    #[serde(default)]
    name: Option<String>,
}

impl ClientConfig {
    pub fn new(monitors: Vec<(u64, SocketAddr)>, credentials: Credentials) -> ClientConfig {
        ClientConfig {
            monitors,
            credentials,
            op_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(2),
        }
    }

    /// Reads a client configuration file (format above).
    pub fn from_file(path: &Path) -> Result<ClientConfig, ClientError> {
        let bad = |why: String| ClientError::Invalid(format!("{}: {why}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let file: ConfigFile = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let fsid = duplex_proto::parse_fsid(&file.fsid).ok_or_else(|| bad("fsid must be 32 hex digits".into()))?;
        let secret_path = path.parent().unwrap_or(Path::new(".")).join(&file.secret_file);
        let secret = std::fs::read(&secret_path).map_err(|e| bad(format!("{}: {e}", secret_path.display())))?;
        let mut monitors = Vec::new();
        for monitor in &file.monitors {
            monitors.push(parse_monitor(monitor).map_err(bad)?);
        }
        if monitors.is_empty() {
            return Err(bad("no monitors listed".into()));
        }
        let name = file.name.unwrap_or_else(|| "client".into());
        let mut config = ClientConfig::new(monitors, Credentials { fsid, secret, name });
        if let Some(ms) = file.op_timeout_ms {
            config.op_timeout = Duration::from_millis(ms);
        }
        Ok(config)
    }
}

/// `ID=IP:PORT`.
pub fn parse_monitor(text: &str) -> Result<(u64, SocketAddr), String> {
    let (id, addr) = text.split_once('=').ok_or_else(|| format!("monitor '{text}': expected ID=IP:PORT"))?;
    let id = id.trim().parse().map_err(|_| format!("monitor '{text}': bad id"))?;
    let addr = addr.trim().parse().map_err(|_| format!("monitor '{text}': bad address"))?;
    Ok((id, addr))
}

struct Handle {
    commands: Sender<Command>,
    waker: Arc<mio::Waker>,
    map: Arc<RwLock<Arc<ClusterMap>>>,
    stop: Arc<AtomicBool>,
    config: ClientConfig,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.commands.send(Command::Shutdown);
        let _ = self.waker.wake();
        for thread in self.threads.drain(..) {
            // The last clone may go in a callback, on the I/O thread itself,
            // which cannot join itself: it stops on its own after Shutdown.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

/// A cluster client. Cheap to clone; the I/O thread stops with the last clone.
#[derive(Clone)]
pub struct Client {
    handle: Arc<Handle>,
}

impl Client {
    /// Fetches the map, starts the I/O thread and the map follower.
    pub fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        if config.monitors.is_empty() {
            return Err(ClientError::Unavailable("no monitors configured".into()));
        }
        let map = Arc::new(fetch_map(&config.monitors, &config.credentials)?);
        let published = Arc::new(RwLock::new(map.clone()));
        let poll = mio::Poll::new().map_err(|e| ClientError::Unavailable(e.to_string()))?;
        let waker =
            Arc::new(mio::Waker::new(poll.registry(), WAKER).map_err(|e| ClientError::Unavailable(e.to_string()))?);
        let (commands, inbox) = crossbeam_channel::unbounded();
        let client_id = loop {
            let id = rand::random::<u64>();
            if id != 0 {
                break id;
            }
        };
        let runtime = Runtime::new(
            poll,
            inbox,
            RuntimeConfig {
                map,
                credentials: config.credentials.clone(),
                client_id,
                op_timeout: config.op_timeout,
                connect_timeout: config.connect_timeout,
            },
        );
        let spawn_err = |e: std::io::Error| ClientError::Unavailable(format!("cannot start a client thread: {e}"));
        let io =
            std::thread::Builder::new().name("duplex-client".into()).spawn(move || runtime.run()).map_err(spawn_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let follower = {
            let (monitors, credentials) = (config.monitors.clone(), config.credentials.clone());
            let (published, commands, waker, stop) = (published.clone(), commands.clone(), waker.clone(), stop.clone());
            std::thread::Builder::new()
                .name("duplex-client-map".into())
                .spawn(move || follow_map(monitors, credentials, published, commands, waker, stop))
                .map_err(spawn_err)?
        };
        Ok(Client {
            handle: Arc::new(Handle { commands, waker, map: published, stop, config, threads: vec![io, follower] }),
        })
    }

    /// The newest map this client has.
    pub fn map(&self) -> Arc<ClusterMap> {
        self.handle.map.read().expect("map lock").clone()
    }

    pub fn config(&self) -> &ClientConfig {
        &self.handle.config
    }

    /// A monitor client with this client's monitors and credentials (pools, status).
    pub fn monitor(&self) -> MonClient {
        MonClient::new(self.handle.config.monitors.clone(), self.handle.config.credentials.clone())
    }

    /// The id of the pool named `name`.
    pub fn pool_id(&self, name: &str) -> Result<u32, ClientError> {
        self.map().pool_by_name(name).map(|p| p.id).ok_or_else(|| ClientError::NoSuchPool(name.into()))
    }

    /// Starts `op`; `done` runs on the client's I/O thread when it ends
    /// (keep it short; never wait there for another operation). The client
    /// does not bound submissions: a caller keeps its own in-flight limit,
    /// as the NBD server (per connection), `bench` (its queue depth) and
    /// image management (64) do.
    pub fn submit(&self, op: ObjectOp, done: Callback) {
        if let Err(crossbeam_channel::SendError(Command::Submit(_, done))) =
            self.handle.commands.send(Command::Submit(op, done))
        {
            done(Err(ClientError::Shutdown));
            return;
        }
        let _ = self.handle.waker.wake();
    }

    /// Runs `op` and waits for it.
    pub fn call(&self, op: ObjectOp) -> Result<Bytes, ClientError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.submit(
            op,
            Box::new(move |result| {
                let _ = tx.send(result);
            }),
        );
        rx.recv().unwrap_or(Err(ClientError::Shutdown))
    }

    /// Up to `len` bytes from `offset` (fewer past the object's end).
    pub fn read(&self, pool: u32, object: &[u8], offset: u64, len: u32) -> Result<Bytes, ClientError> {
        self.call(ObjectOp { length: len, offset, ..op(pool, OpKind::Read, object) })
    }

    /// Writes `data` at `offset`, creating the object if needed.
    pub fn write(&self, pool: u32, object: &[u8], offset: u64, data: Bytes) -> Result<(), ClientError> {
        self.call(ObjectOp { offset, data, ..op(pool, OpKind::Write, object) }).map(drop)
    }

    /// Sets the object's size (creating it if needed).
    pub fn truncate(&self, pool: u32, object: &[u8], size: u64) -> Result<(), ClientError> {
        self.call(ObjectOp { offset: size, ..op(pool, OpKind::Truncate, object) }).map(drop)
    }

    /// Removes the object (no error if it is absent).
    pub fn delete(&self, pool: u32, object: &[u8]) -> Result<(), ClientError> {
        self.call(op(pool, OpKind::Delete, object)).map(drop)
    }

    pub fn stat(&self, pool: u32, object: &[u8]) -> Result<ObjectStat, ClientError> {
        let data = self.call(op(pool, OpKind::Stat, object))?;
        ObjectStat::decode(&data).map_err(|e| ClientError::Corrupt(format!("stat reply: {e}")))
    }

    /// Creates the object with `size` bytes reserved in one extent (no-op if it exists).
    pub fn create_preallocated(&self, pool: u32, object: &[u8], size: u64) -> Result<(), ClientError> {
        self.call(ObjectOp { offset: size, ..op(pool, OpKind::CreatePreallocated, object) }).map(drop)
    }

    pub fn get_attr(&self, pool: u32, object: &[u8], name: &[u8]) -> Result<Bytes, ClientError> {
        self.call(ObjectOp { data: Bytes::copy_from_slice(name), ..op(pool, OpKind::GetAttr, object) })
    }

    /// Sets an attribute (names up to 255 bytes, values up to 4 KiB, all of
    /// one object's attributes together up to 16 KiB).
    pub fn set_attr(&self, pool: u32, object: &[u8], name: &[u8], value: &[u8]) -> Result<(), ClientError> {
        // The OSD cannot check the per-object total before logging: check it here.
        let existing = match self.list_attrs(pool, object) {
            Ok(attrs) => attrs,
            Err(ClientError::NotFound) => Vec::new(),
            Err(err) => return Err(err),
        };
        let total: usize = existing.iter().filter(|(n, _)| n != name).map(|(n, v)| n.len() + v.len()).sum::<usize>()
            + name.len()
            + value.len();
        if total > MAX_ATTR_TOTAL {
            return Err(ClientError::Invalid(format!(
                "the object's attributes would total {total} bytes; the limit is {MAX_ATTR_TOTAL}"
            )));
        }
        let data = Bytes::from([name, value].concat());
        self.call(ObjectOp { offset: name.len() as u64, data, ..op(pool, OpKind::SetAttr, object) }).map(drop)
    }

    pub fn remove_attr(&self, pool: u32, object: &[u8], name: &[u8]) -> Result<(), ClientError> {
        self.call(ObjectOp { data: Bytes::copy_from_slice(name), ..op(pool, OpKind::RemoveAttr, object) }).map(drop)
    }

    pub fn list_attrs(&self, pool: u32, object: &[u8]) -> Result<Attrs, ClientError> {
        let data = self.call(op(pool, OpKind::ListAttrs, object))?;
        decode_attrs(&data).map_err(|e| ClientError::Corrupt(format!("attribute list: {e}")))
    }

    /// Every object of the pool whose name starts with `prefix` (one listing
    /// per PG; the order is by PG, then by name).
    pub fn list_objects(&self, pool: u32, prefix: &[u8]) -> Result<Vec<Vec<u8>>, ClientError> {
        let pg_num = self.map().pools.get(&pool).map(|p| p.pg_num).ok_or(ClientError::NoSuchPool(pool.to_string()))?;
        let mut names = Vec::new();
        for pg in 0..pg_num {
            let mut cursor = Bytes::new();
            loop {
                let request = ObjectOp {
                    data: Bytes::copy_from_slice(prefix),
                    pg: Some(pg),
                    ..ObjectOp::new(pool, OpKind::List, cursor.clone())
                };
                let reply = self.call(request)?;
                let (page, more) =
                    decode_names(&reply).map_err(|e| ClientError::Corrupt(format!("object listing: {e}")))?;
                let last = page.last().cloned();
                names.extend(page);
                match last {
                    // Pages go up by name; one that does not would loop for ever.
                    Some(last) if more && last.as_slice() > &cursor[..] => cursor = Bytes::from(last),
                    Some(_) if more => {
                        return Err(ClientError::Corrupt(format!("PG {pg}'s listing did not move past its cursor")))
                    }
                    _ => break,
                }
            }
        }
        Ok(names)
    }
}

/// The store's limit on one object's attributes together.
pub const MAX_ATTR_TOTAL: usize = 16 << 10;

fn op(pool: u32, kind: OpKind, object: &[u8]) -> ObjectOp {
    ObjectOp::new(pool, kind, Bytes::copy_from_slice(object))
}

/// The newest map any monitor has.
pub(crate) fn fetch_map(monitors: &[(u64, SocketAddr)], credentials: &Credentials) -> Result<ClusterMap, ClientError> {
    let client = MonClient::new(monitors.to_vec(), credentials.clone());
    let mut best: Option<ClusterMap> = None;
    let mut last_error = String::from("no monitors");
    for (id, addr) in monitors {
        match client.map(*id) {
            Ok(map) => {
                if best.as_ref().is_none_or(|b| map.epoch > b.epoch) {
                    best = Some(map);
                }
            }
            Err(err) => last_error = format!("monitor {id} at {addr}: {err}"),
        }
    }
    best.ok_or(ClientError::Unavailable(last_error))
}
