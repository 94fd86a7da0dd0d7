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
use duplex_proto::omap;
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
    ///
    /// A read of a deduplicated pool reads the chunks evicted from the
    /// object in its chunk pool ([`crate::tier`]).
    pub fn submit(&self, op: ObjectOp, done: Callback) {
        if op.kind == OpKind::Read {
            if let Some(tier) = self.map().pools.get(&op.pool).and_then(|pool| pool.dedup) {
                return crate::tier::submit_read(self, op, tier.chunk_pool, done);
            }
        }
        self.submit_direct(op, done)
    }

    /// [`Client::submit`] as it is, to the object's PG.
    pub(crate) fn submit_direct(&self, op: ObjectOp, done: Callback) {
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
        self.call_with(op, Client::submit)
    }

    fn call_direct(&self, op: ObjectOp) -> Result<Bytes, ClientError> {
        self.call_with(op, Client::submit_direct)
    }

    fn call_with(&self, op: ObjectOp, submit: fn(&Client, ObjectOp, Callback)) -> Result<Bytes, ClientError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        submit(
            self,
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

    /// Sets omap entries (keys of 1 to 255 bytes, values up to 4 KiB, one
    /// object's omap up to 64 KiB in all), creating the object if needed.
    /// A key given twice takes its last value.
    pub fn omap_set(&self, pool: u32, object: &[u8], entries: &[(Vec<u8>, Vec<u8>)]) -> Result<(), ClientError> {
        let entries: omap::Entries =
            entries.iter().cloned().collect::<std::collections::BTreeMap<_, _>>().into_iter().collect();
        if entries.is_empty() {
            return Ok(());
        }
        if let Some((key, value)) =
            entries.iter().find(|(k, v)| k.is_empty() || k.len() > omap::MAX_KEY_LEN || v.len() > omap::MAX_VALUE_LEN)
        {
            return Err(ClientError::Invalid(format!(
                "omap keys are 1 to {} bytes and values at most {} (a key of {}, a value of {})",
                omap::MAX_KEY_LEN,
                omap::MAX_VALUE_LEN,
                key.len(),
                value.len()
            )));
        }
        // The OSD cannot check the object's total before logging: check it here.
        let existing = match self.omap_list_all(pool, object) {
            Ok(existing) => existing,
            Err(ClientError::NotFound) => Vec::new(),
            Err(err) => return Err(err),
        };
        let kept: usize = existing
            .iter()
            .filter(|(k, _)| entries.binary_search_by(|(n, _)| n.cmp(k)).is_err())
            .map(|(k, v)| k.len() + v.len())
            .sum();
        let total = kept + entries.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if total > omap::MAX_BYTES {
            return Err(ClientError::Invalid(format!(
                "the object's omap would total {total} bytes; the limit is {}",
                omap::MAX_BYTES
            )));
        }
        let data = Bytes::from(omap::encode_entries(&entries));
        self.call(ObjectOp { data, ..op(pool, OpKind::OmapSet, object) }).map(drop)
    }

    /// The omap entries of `keys` that exist, in key order.
    pub fn omap_get(&self, pool: u32, object: &[u8], keys: &[Vec<u8>]) -> Result<omap::Entries, ClientError> {
        let keys = checked_keys(keys)?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let data = Bytes::from(omap::encode_keys(&keys));
        let reply = self.call(ObjectOp { data, ..op(pool, OpKind::OmapGet, object) })?;
        omap::decode_entries(&reply).map_err(|e| ClientError::Corrupt(format!("omap reply: {e}")))
    }

    /// At most `limit` (1 to 1024) omap entries with keys in `[start, end)`
    /// (`end = None`: to the last), in key order.
    pub fn omap_list(
        &self,
        pool: u32,
        object: &[u8],
        start: &[u8],
        end: Option<&[u8]>,
        limit: u64,
    ) -> Result<omap::Entries, ClientError> {
        if limit == 0 || limit > duplex_proto::osd::MAX_OMAP_LIST {
            return Err(ClientError::Invalid(format!(
                "an omap listing returns 1 to {} entries, not {limit}",
                duplex_proto::osd::MAX_OMAP_LIST
            )));
        }
        if start.len() > omap::MAX_KEY_LEN || end.is_some_and(|end| end.len() > omap::MAX_KEY_LEN) {
            return Err(ClientError::Invalid(format!("omap keys are at most {} bytes", omap::MAX_KEY_LEN)));
        }
        let range = omap::KeyRange { start: start.to_vec(), end: end.map(<[u8]>::to_vec) };
        let data = Bytes::from(omap::encode_range(&range));
        let reply = self.call(ObjectOp { data, offset: limit, ..op(pool, OpKind::OmapList, object) })?;
        omap::decode_entries(&reply).map_err(|e| ClientError::Corrupt(format!("omap listing: {e}")))
    }

    /// The object's whole omap, listed a page at a time.
    pub fn omap_list_all(&self, pool: u32, object: &[u8]) -> Result<omap::Entries, ClientError> {
        let page = duplex_proto::osd::MAX_OMAP_LIST;
        let mut all = Vec::new();
        let mut start = Vec::new();
        loop {
            let got = self.omap_list(pool, object, &start, None, page)?;
            let full = got.len() as u64 == page;
            if let Some((last, _)) = got.last() {
                start = last.clone();
                start.push(0);
            }
            all.extend(got);
            if !full {
                return Ok(all);
            }
        }
    }

    /// Removes the omap entries of `keys` (absent ones are skipped).
    pub fn omap_remove(&self, pool: u32, object: &[u8], keys: &[Vec<u8>]) -> Result<(), ClientError> {
        let keys = checked_keys(keys)?;
        if keys.is_empty() {
            return Ok(());
        }
        let data = Bytes::from(omap::encode_keys(&keys));
        self.call(ObjectOp { data, ..op(pool, OpKind::OmapRemove, object) }).map(drop)
    }

    /// Removes the omap entries with keys in `[start, end)` (`end = None`:
    /// to the last; an empty start and no end clear the omap).
    pub fn omap_remove_range(
        &self,
        pool: u32,
        object: &[u8],
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Result<(), ClientError> {
        if start.len() > omap::MAX_KEY_LEN || end.is_some_and(|end| end.len() > omap::MAX_KEY_LEN) {
            return Err(ClientError::Invalid(format!("omap keys are at most {} bytes", omap::MAX_KEY_LEN)));
        }
        let range = omap::KeyRange { start: start.to_vec(), end: end.map(<[u8]>::to_vec) };
        let data = Bytes::from(omap::encode_range(&range));
        self.call(ObjectOp { data, ..op(pool, OpKind::OmapRemoveRange, object) }).map(drop)
    }

    /// A dedup tier's chunk object `object` gains the reference `reference`
    /// (1 to 255 bytes); `chunk` (1 byte to 1 MiB) is written only if the
    /// object does not exist yet (docs/DEDUP.md). Idempotent.
    pub fn chunk_put(&self, pool: u32, object: &[u8], reference: &[u8], chunk: &[u8]) -> Result<(), ClientError> {
        if reference.is_empty() || reference.len() > omap::MAX_KEY_LEN {
            return Err(ClientError::Invalid(format!("a chunk reference is 1 to {} bytes", omap::MAX_KEY_LEN)));
        }
        if chunk.is_empty() || chunk.len() > duplex_proto::osd::MAX_CHUNK {
            return Err(ClientError::Invalid(format!("a chunk is 1 to {} bytes", duplex_proto::osd::MAX_CHUNK)));
        }
        let data = Bytes::from([reference, chunk].concat());
        self.call(ObjectOp { offset: reference.len() as u64, data, ..op(pool, OpKind::ChunkPut, object) }).map(drop)
    }

    /// A deduplicated object's bytes `[offset, offset + len)` as stored
    /// (evicted chunks read as holes), with its chunk map entries there and
    /// its generation (the deduplication engine's read).
    pub fn tier_read(
        &self,
        pool: u32,
        object: &[u8],
        offset: u64,
        len: u32,
    ) -> Result<duplex_proto::tier::TierReadReply, ClientError> {
        let reply = self.call_direct(ObjectOp { offset, length: len, ..op(pool, OpKind::TierRead, object) })?;
        duplex_proto::tier::TierReadReply::decode(&reply).map_err(|e| ClientError::Corrupt(format!("tier read: {e}")))
    }

    /// The deduplication engine's change of an object, made only if it is
    /// still as `guard` says (else `Invalid`, naming the stale guard).
    pub fn tier_update(
        &self,
        pool: u32,
        object: &[u8],
        guard: &duplex_proto::tier::Guard,
        actions: &[duplex_proto::tier::Action],
    ) -> Result<(), ClientError> {
        let data = Bytes::from(duplex_proto::tier::encode_update(guard, actions));
        self.call(ObjectOp { data, ..op(pool, OpKind::TierUpdate, object) }).map(drop)
    }

    /// A chunk object loses the reference `reference`, and is deleted if
    /// that was its last. Idempotent.
    pub fn chunk_unref(&self, pool: u32, object: &[u8], reference: &[u8]) -> Result<(), ClientError> {
        if reference.is_empty() || reference.len() > omap::MAX_KEY_LEN {
            return Err(ClientError::Invalid(format!("a chunk reference is 1 to {} bytes", omap::MAX_KEY_LEN)));
        }
        let data = Bytes::copy_from_slice(reference);
        self.call(ObjectOp { data, ..op(pool, OpKind::ChunkUnref, object) }).map(drop)
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

/// `keys` sorted, without repeats, each 1 to 255 bytes.
fn checked_keys(keys: &[Vec<u8>]) -> Result<Vec<Vec<u8>>, ClientError> {
    if let Some(bad) = keys.iter().find(|k| k.is_empty() || k.len() > omap::MAX_KEY_LEN) {
        return Err(ClientError::Invalid(format!("omap keys are 1 to {} bytes, not {}", omap::MAX_KEY_LEN, bad.len())));
    }
    Ok(keys.iter().cloned().collect::<std::collections::BTreeSet<_>>().into_iter().collect())
}

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
