//! Block images: a virtual disk of N bytes striped over fixed-size objects
//! (DESIGN.md §3).
//!
//! Per image, in its pool:
//!
//! | object | holds |
//! | --- | --- |
//! | `image.<name>` | the image's id (16 hex digits): the name → id directory entry |
//! | `<id>.header` | [`ImageInfo`] in a fixed checksummed layout |
//! | `<id>.<object number, 16 hex digits>` | the data, from offset object number × object size |
//!
//! Data objects exist only where something was written (thin), or all from
//! creation with `preallocate` (each reserves its whole extent). A missing
//! object, or bytes past an object's end, read as zeros.
//!
//! An image may keep its data objects in another pool than its header and
//! directory entry (its *data pool*, as Ceph's `--data-pool`): an
//! erasure-coded pool holds the data, a replicated one the rest (an
//! erasure-coded pool takes no attributes, watches or snapshots yet).
//!
//! I/O that crosses object boundaries is split and the pieces issued in
//! parallel; the I/O completes when all of them have. Management
//! operations (create, resize, remove) assume one administrator at a time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use duplex_proto::osd::{OpKind, MAX_IO_BYTES};

use crate::client::Client;
use crate::error::ClientError;
use crate::runtime::{Callback, ObjectOp};

pub const DEFAULT_OBJECT_SIZE: u32 = 4 << 20;
/// Object sizes an image may use: powers of two from 4 KiB to 64 MiB.
pub const MIN_OBJECT_SIZE: u32 = 4 << 10;
pub const MAX_OBJECT_SIZE: u32 = 64 << 20;
/// Longest image name.
pub const MAX_NAME_LEN: usize = 128;
/// The largest piece a write is split into. Each piece is one entry in a
/// PG's operation log, which takes entries up to half its size: 256 KiB
/// fits every log of 1 MiB or more (OSDs refuse smaller logs).
pub const MAX_WRITE_PIECE: u64 = 256 << 10;
/// Operations a management task (create, remove, resize) keeps in flight.
const MANAGEMENT_DEPTH: usize = 64;
/// Object operations one image operation keeps in flight: a discard of
/// the whole disk must not queue thousands of requests at once.
const RUN_WINDOW: usize = 64;

const HEADER_MAGIC: &[u8; 4] = b"DPXI";
/// 2: a data pool (bytes 48..52); version 1 headers (none) still read.
const HEADER_VERSION: u32 = 2;
const HEADER_LEN: usize = 64;
const FLAG_PREALLOCATED: u64 = 1;
const FLAG_DATA_POOL: u64 = 2;

pub type Done<T> = Box<dyn FnOnce(Result<T, ClientError>) + Send + 'static>;

/// What an image is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ImageInfo {
    pub name: String,
    /// 16 hex digits; names its objects.
    pub id: String,
    pub size: u64,
    pub object_size: u32,
    pub preallocated: bool,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// The pool holding its data objects, when not its own.
    pub data_pool: Option<u32>,
}

impl ImageInfo {
    /// The name of its data object `number` (bytes `number × object_size`
    /// on): where placement puts that part of the image.
    pub fn object_name(&self, number: u64) -> Bytes {
        data_object(&self.id, number)
    }

    /// The pool holding its data objects, for an image whose header is in `pool`.
    pub fn data_pool_in(&self, pool: u32) -> u32 {
        self.data_pool.unwrap_or(pool)
    }

    pub fn object_count(&self) -> u64 {
        self.size.div_ceil(self.object_size as u64)
    }

    fn encode(&self) -> Bytes {
        let mut out = vec![0u8; HEADER_LEN];
        out[0..4].copy_from_slice(HEADER_MAGIC);
        out[4..8].copy_from_slice(&HEADER_VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.size.to_le_bytes());
        out[16..20].copy_from_slice(&self.object_size.to_le_bytes());
        let mut flags = if self.preallocated { FLAG_PREALLOCATED } else { 0 };
        if let Some(data_pool) = self.data_pool {
            flags |= FLAG_DATA_POOL;
            out[48..52].copy_from_slice(&data_pool.to_le_bytes());
        }
        out[24..32].copy_from_slice(&flags.to_le_bytes());
        out[32..40].copy_from_slice(&self.created.to_le_bytes());
        let id = u64::from_str_radix(&self.id, 16).expect("ids are 16 hex digits");
        out[40..48].copy_from_slice(&id.to_le_bytes());
        let crc = crc32c::crc32c(&out[..60]);
        out[60..64].copy_from_slice(&crc.to_le_bytes());
        Bytes::from(out)
    }

    fn decode(name: &str, bytes: &[u8]) -> Result<ImageInfo, ClientError> {
        let corrupt = |why: &str| ClientError::Corrupt(format!("image '{name}' header: {why}"));
        if bytes.len() < HEADER_LEN {
            return Err(corrupt("too short"));
        }
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if &bytes[0..4] != HEADER_MAGIC {
            return Err(corrupt("bad magic"));
        }
        if crc32c::crc32c(&bytes[..60]) != word(60) {
            return Err(corrupt("checksum mismatch"));
        }
        if !(1..=HEADER_VERSION).contains(&word(4)) {
            return Err(corrupt("unknown version (a newer client made this image)"));
        }
        let object_size = word(16);
        if !valid_object_size(object_size) {
            return Err(corrupt("bad object size"));
        }
        Ok(ImageInfo {
            name: name.to_string(),
            id: format!("{:016x}", long(40)),
            size: long(8),
            object_size,
            preallocated: long(24) & FLAG_PREALLOCATED != 0,
            created: long(32),
            data_pool: (long(24) & FLAG_DATA_POOL != 0).then(|| word(48)),
        })
    }
}

pub(crate) fn valid_object_size(size: u32) -> bool {
    size.is_power_of_two() && (MIN_OBJECT_SIZE..=MAX_OBJECT_SIZE).contains(&size)
}

/// How to create an image.
#[derive(Clone, Copy, Debug)]
pub struct CreateOptions {
    pub object_size: u32,
    /// Reserve every object's extent now (no allocation on the write path later).
    pub preallocate: bool,
    /// Keep the data objects in this pool (an erasure-coded one, say).
    pub data_pool: Option<u32>,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions { object_size: DEFAULT_OBJECT_SIZE, preallocate: false, data_pool: None }
    }
}

fn check_name(name: &str) -> Result<(), ClientError> {
    check_name_of("image", name)
}

/// Image and snapshot names: what object names and `IMAGE@SNAP` can carry.
pub(crate) fn check_name_of(what: &str, name: &str) -> Result<(), ClientError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ClientError::Invalid(format!(
            "{what} names are 1 to {MAX_NAME_LEN} characters of A-Z a-z 0-9 . _ - (got '{name}')"
        )))
    }
}

fn directory_object(name: &str) -> Vec<u8> {
    format!("image.{name}").into_bytes()
}

pub(crate) fn header_object(id: &str) -> Vec<u8> {
    format!("{id}.header").into_bytes()
}

pub(crate) fn data_object(id: &str, number: u64) -> Bytes {
    Bytes::from(format!("{id}.{number:016x}"))
}

impl Client {
    /// Creates an image of `size` bytes.
    pub fn create_image(
        &self,
        pool: u32,
        name: &str,
        size: u64,
        options: CreateOptions,
    ) -> Result<ImageInfo, ClientError> {
        self.create_image_with(pool, name, size, options, None)
    }

    /// Creates an image; a clone's header carries its parent link.
    pub(crate) fn create_image_with(
        &self,
        pool: u32,
        name: &str,
        size: u64,
        options: CreateOptions,
        parent: Option<&crate::layering::ParentLink>,
    ) -> Result<ImageInfo, ClientError> {
        check_name(name)?;
        if !valid_object_size(options.object_size) {
            return Err(ClientError::Invalid(format!(
                "object size must be a power of two from {MIN_OBJECT_SIZE} to {MAX_OBJECT_SIZE} bytes"
            )));
        }
        self.check_pools(pool, options.data_pool, options.object_size)?;
        if parent.is_some() && options.data_pool.is_some() {
            return Err(ClientError::Invalid("a clone keeps its data in its own pool".into()));
        }
        match self.read(pool, &directory_object(name), 0, 16) {
            Ok(_) => return Err(ClientError::ImageExists(name.into())),
            Err(ClientError::NotFound) => {}
            Err(err) => return Err(err),
        }
        let id = loop {
            let id = rand::random::<u64>();
            if id != 0 {
                break format!("{id:016x}");
            }
        };
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let info = ImageInfo {
            name: name.into(),
            id: id.clone(),
            size,
            object_size: options.object_size,
            preallocated: options.preallocate,
            created,
            data_pool: options.data_pool.filter(|data_pool| *data_pool != pool),
        };
        if options.preallocate {
            self.preallocate(pool, &info, 0..info.object_count())?;
        }
        // The header before the directory entry: a crash between leaves an
        // unreachable header, never a name without an image.
        self.write(pool, &header_object(&id), 0, info.encode())?;
        if let Some(link) = parent {
            self.write(pool, &header_object(&id), crate::layering::PARENT_OFFSET, link.encode())?;
        }
        self.write(pool, &directory_object(name), 0, Bytes::from(id.into_bytes()))?;
        Ok(info)
    }

    /// An image's header goes in a replicated pool (it takes attributes
    /// and watches); its data may go in an erasure-coded one, whose stripes
    /// must tile its objects.
    fn check_pools(&self, pool: u32, data_pool: Option<u32>, object_size: u32) -> Result<(), ClientError> {
        let map = self.map();
        let info = map.pools.get(&pool).ok_or_else(|| ClientError::NoSuchPool(format!("id {pool}")))?;
        if info.is_erasure() {
            return Err(ClientError::Invalid(format!(
                "pool '{}' is erasure-coded: an image's header needs a replicated pool; create the image in one \
                 with --data-pool {}",
                info.name, info.name
            )));
        }
        let Some(data_pool) = data_pool else { return Ok(()) };
        let data = map.pools.get(&data_pool).ok_or_else(|| ClientError::NoSuchPool(format!("id {data_pool}")))?;
        if let Some(code) = &data.erasure {
            let width = u64::from(code.k) * u64::from(code.stripe_unit);
            if !u64::from(object_size).is_multiple_of(width) {
                return Err(ClientError::Invalid(format!(
                    "pool '{}' stripes {} x {} bytes ({width}), which does not divide the object size ({object_size} \
                     bytes): choose a smaller stripe unit, a k that divides it, or another object size",
                    data.name, code.k, code.stripe_unit
                )));
            }
        }
        Ok(())
    }

    fn preallocate(&self, pool: u32, info: &ImageInfo, objects: std::ops::Range<u64>) -> Result<(), ClientError> {
        let pool = info.data_pool_in(pool);
        let ops = objects.map(|n| ObjectOp {
            offset: info.object_size as u64,
            ..ObjectOp::new(pool, OpKind::CreatePreallocated, data_object(&info.id, n))
        });
        self.run_all(ops, false)
    }

    /// Runs `ops` with [`MANAGEMENT_DEPTH`] in flight; the first error wins.
    /// `missing_ok`: a NotFound answer counts as done.
    fn run_all(&self, ops: impl Iterator<Item = ObjectOp>, missing_ok: bool) -> Result<(), ClientError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let mut in_flight = 0usize;
        let mut first_error = None;
        let mut ops = ops.peekable();
        while ops.peek().is_some() || in_flight > 0 {
            while in_flight < MANAGEMENT_DEPTH && first_error.is_none() {
                let Some(op) = ops.next() else { break };
                let tx = tx.clone();
                self.submit(
                    op,
                    Box::new(move |r| {
                        let _ = tx.send(r);
                    }),
                );
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            let result = rx.recv().unwrap_or(Err(ClientError::Shutdown));
            in_flight -= 1;
            match result {
                Ok(_) => {}
                Err(ClientError::NotFound) if missing_ok => {}
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The names of the pool's images, sorted.
    pub fn list_images(&self, pool: u32) -> Result<Vec<String>, ClientError> {
        let mut names: Vec<String> = self
            .list_objects(pool, b"image.")?
            .into_iter()
            .filter_map(|n| String::from_utf8(n).ok())
            .filter_map(|n| n.strip_prefix("image.").map(str::to_string))
            .collect();
        names.sort();
        Ok(names)
    }

    pub fn image_info(&self, pool: u32, name: &str) -> Result<ImageInfo, ClientError> {
        check_name(name)?;
        let id = match self.read(pool, &directory_object(name), 0, 16) {
            Ok(id) => id,
            Err(ClientError::NotFound) => return Err(ClientError::NoSuchImage(name.into())),
            Err(err) => return Err(err),
        };
        let id = std::str::from_utf8(&id)
            .ok()
            .filter(|id| id.len() == 16 && u64::from_str_radix(id, 16).is_ok())
            .ok_or_else(|| ClientError::Corrupt(format!("image '{name}': bad directory entry")))?
            .to_string();
        let header = match self.read(pool, &header_object(&id), 0, HEADER_LEN as u32) {
            Ok(header) => header,
            Err(ClientError::NotFound) => {
                return Err(ClientError::Corrupt(format!("image '{name}': header object {id}.header is missing")))
            }
            Err(err) => return Err(err),
        };
        let info = ImageInfo::decode(name, &header)?;
        if info.id != id {
            return Err(ClientError::Corrupt(format!("image '{name}': header names another id")));
        }
        Ok(info)
    }

    /// Grows or shrinks an image. Shrinking discards the data past the new end.
    pub fn resize_image(&self, pool: u32, name: &str, new_size: u64) -> Result<ImageInfo, ClientError> {
        let mut info = self.image_info(pool, name)?;
        let object_size = info.object_size as u64;
        let (old_objects, new_objects) = (info.object_count(), new_size.div_ceil(object_size));
        let mut link = crate::layering::read_link(self, pool, &info.id)?;
        // What a shrink deletes and cuts, the snapshots keep (copy-on-write).
        let table = crate::snapshot::read_table(self, pool, &header_object(&info.id))?;
        let write_snap = table.newest_live();
        if link.as_ref().is_some_and(|link| new_size < link.overlap) && !table.snaps.is_empty() {
            return Err(ClientError::Busy(format!(
                "{name} is a clone with snapshots, which read through its first {} of its parent: \
                 a shrink below that would empty them (remove the snapshots first)",
                link.as_ref().map_or(0, |link| link.overlap)
            )));
        }
        if let Some(link) = link.as_mut().filter(|link| new_size < link.overlap) {
            // A clone shrunk reads less of its parent, even if it grows again.
            // Its tail object keeps what it read through before the cut.
            let tail = new_size % object_size;
            if tail != 0 {
                let layer = std::sync::Arc::new(crate::layering::Layer::new(link.clone(), &info, pool));
                wait(|done| crate::layering::copy_up(self, &layer, new_objects - 1, write_snap, done))?;
            }
            link.overlap = new_size;
            self.write(pool, &header_object(&info.id), crate::layering::PARENT_OFFSET, link.encode())?;
        }
        if new_size < info.size {
            // Data first, header last: a crash in between leaves the old size
            // with zeros past the new end, never stale data a later grow could expose.
            let data_pool = info.data_pool_in(pool);
            let ops = (new_objects..old_objects).map(|n| ObjectOp {
                snap: write_snap,
                ..ObjectOp::new(data_pool, OpKind::Delete, data_object(&info.id, n))
            });
            self.run_all(ops, true)?;
            let tail = new_size % object_size;
            if tail != 0 {
                let last = data_object(&info.id, new_objects - 1);
                let zero = (tail, object_size - tail);
                let hides_parent = link.as_ref().is_some_and(|link| link.overlap > (new_objects - 1) * object_size);
                let ops = zero_ops(data_pool, &info, last, zero.0, zero.1, hides_parent);
                self.run_all(ops.into_iter().map(|op| ObjectOp { snap: write_snap, ..op }), true)?;
            }
        } else if info.preallocated && new_objects > old_objects {
            self.preallocate(pool, &info, old_objects..new_objects)?;
        }
        info.size = new_size;
        self.write(pool, &header_object(&info.id), 0, info.encode())?;
        Ok(info)
    }

    /// Sets the size in the header alone (the objects are already right).
    pub(crate) fn set_image_size(&self, pool: u32, info: &ImageInfo, size: u64) -> Result<(), ClientError> {
        let info = ImageInfo { size, ..info.clone() };
        self.write(pool, &header_object(&info.id), 0, info.encode())
    }

    /// Deletes an image and all its objects. An image with snapshots is
    /// refused: their clones would be left behind. So is one a gateway
    /// serves (as `rbd rm` refuses an image with watchers): its watch would
    /// write the header again.
    pub fn remove_image(&self, pool: u32, name: &str) -> Result<(), ClientError> {
        let info = self.image_info(pool, name)?;
        let table = crate::snapshot::read_table(self, pool, &header_object(&info.id))?;
        let snaps = &table.snaps;
        if !snaps.is_empty() {
            let names: Vec<String> = snaps.iter().map(|s| format!("{name}@{}", s.name)).collect();
            return Err(ClientError::Busy(format!(
                "{name} has {} snapshot(s) ({}): remove them first (`duplex snap purge {name}`)",
                snaps.len(),
                names.join(", ")
            )));
        }
        let live = crate::watch::live_watchers(self, pool, &header_object(&info.id))?;
        if live > 0 {
            return Err(ClientError::Busy(format!(
                "{name} is in use by {live} gateway(s) (an NBD server, a benchmark, an import): stop them first \
                 (one that crashed does not count)"
            )));
        }
        if table.seq > 0 {
            // It had snapshots: a removal cut short may have left clones,
            // which no listing shows, up to the largest snapshot's end.
            // None is left after this.
            let objects = crate::snapshot::objects_ever(&info, &table, None);
            self.trim(pool, &info, &table, objects, &mut |_, _| {})?;
        }
        let link = crate::layering::read_link(self, pool, &info.id)?;
        let prefix = format!("{}.", info.id);
        if let Some(data_pool) = info.data_pool {
            let objects = self.list_objects(data_pool, prefix.as_bytes())?;
            let ops = objects.into_iter().map(|n| ObjectOp::new(data_pool, OpKind::Delete, Bytes::from(n)));
            self.run_all(ops, true)?;
        }
        let objects = self.list_objects(pool, prefix.as_bytes())?;
        let ops = objects.into_iter().map(|n| ObjectOp::new(pool, OpKind::Delete, Bytes::from(n)));
        self.run_all(ops, true)?;
        self.delete(pool, &directory_object(name))?;
        self.forget_image_qos(info.data_pool_in(pool), &info.id);
        // The parent's snapshot may be unprotected once no clone is left.
        match link {
            Some(link) => self.unregister_child(&link, &info.id),
            None => Ok(()),
        }
    }

    /// Opens an image for I/O. The image is watched while open
    /// (crate::watch), so that snapshots wait for its writes.
    pub fn open_image(&self, pool: u32, name: &str) -> Result<Image, ClientError> {
        let info = self.image_info(pool, name)?;
        let layer = self.layer_of(pool, &info)?;
        // The watch sets the limits from the header at each renewal, the first before it returns.
        let throttle = Arc::new(crate::qos::Throttle::new(duplex_qos::Limits::default()));
        let watch = crate::watch::Watch::start(self, pool, header_object(&info.id), Some(Arc::downgrade(&throttle)))?;
        let core = ImageCore { client: self.clone(), pool, info, watch: Some(watch), read_snap: None, layer };
        Ok(Image { core: Arc::new(core), throttle: Some(throttle) })
    }

    /// Opens snapshot `snap` of an image, read-only: the image as it was
    /// when the snapshot was taken.
    pub fn open_snapshot(&self, pool: u32, name: &str, snap: &str) -> Result<Image, ClientError> {
        let mut info = self.image_info(pool, name)?;
        let snapshot = self.snapshot_info(pool, name, snap)?;
        let layer = self.layer_of(pool, &info)?;
        info.size = snapshot.size;
        let core = ImageCore { client: self.clone(), pool, info, watch: None, read_snap: Some(snapshot), layer };
        Ok(Image { core: Arc::new(core), throttle: None })
    }

    fn layer_of(&self, pool: u32, info: &ImageInfo) -> Result<Option<Arc<crate::layering::Layer>>, ClientError> {
        let link = crate::layering::read_link(self, pool, &info.id)?;
        Ok(link.map(|link| Arc::new(crate::layering::Layer::new(link, info, pool))))
    }

    /// `IMAGE` or `IMAGE@SNAP`: the head read-write, or the snapshot read-only.
    pub fn open_spec(&self, pool: u32, spec: &str) -> Result<Image, ClientError> {
        match spec.split_once('@') {
            Some((name, snap)) => self.open_snapshot(pool, name, snap),
            None => self.open_image(pool, spec),
        }
    }
}

/// Operations that make `len` bytes of `object` from `offset` read as zeros.
/// `hides_parent`: the object of a clone that reads through where it is
/// absent, so it is emptied (truncated to nothing), never deleted.
fn zero_ops(pool: u32, info: &ImageInfo, object: Bytes, offset: u64, len: u64, hides_parent: bool) -> Vec<ObjectOp> {
    let object_size = info.object_size as u64;
    if !info.preallocated {
        if offset == 0 && len == object_size && hides_parent {
            return vec![ObjectOp::new(pool, OpKind::Truncate, object)];
        }
        if offset == 0 && len == object_size {
            return vec![ObjectOp::new(pool, OpKind::Delete, object)];
        }
        if offset + len == object_size {
            // Cut the tail (an object shorter than `offset` grows, reading as zeros).
            return vec![ObjectOp { offset, ..ObjectOp::new(pool, OpKind::Truncate, object) }];
        }
    }
    // Inside an object: its held blocks are zeroed in place (pre-allocated
    // objects keep their extents) and holes stay holes, taking no space, so
    // a discard goes on when the cluster is full.
    vec![ObjectOp {
        offset,
        data: Bytes::copy_from_slice(&len.to_le_bytes()),
        ..ObjectOp::new(pool, OpKind::Zero, object)
    }]
}

/// Submits the next of `queue`'s operations; its completion submits the one after.
fn submit_next(client: &Client, queue: &Arc<Mutex<std::vec::IntoIter<ObjectOp>>>, join: &Arc<Join>, missing_ok: bool) {
    let Some(op) = queue.lock().unwrap_or_else(|p| p.into_inner()).next() else { return };
    let (next_client, queue, join) = (client.clone(), Arc::clone(queue), Arc::clone(join));
    client.submit(
        op,
        Box::new(move |result| {
            match result {
                Err(ClientError::NotFound) if missing_ok => join.piece_done(Ok(())),
                other => join.piece_done(other.map(drop)),
            }
            submit_next(&next_client, &queue, &join, missing_ok);
        }),
    );
}

/// What an open image's I/O needs, shared with the I/O its limits hold
/// back (crate::qos); [`Image`] is its face.
struct ImageCore {
    client: Client,
    pool: u32,
    info: ImageInfo,
    /// Renews the image's watch while it is open for writing.
    watch: Option<crate::watch::Watch>,
    /// Opened at a snapshot: reads see it, writes are refused.
    read_snap: Option<crate::snapshot::SnapInfo>,
    /// A clone: its parent, read through where it holds no object.
    layer: Option<Arc<crate::layering::Layer>>,
}

/// Where a piece of an image I/O lands: the object, the offset in it, the
/// length, and the offset in the I/O's buffer.
struct Piece {
    object: Bytes,
    offset: u64,
    len: u64,
    at: usize,
}

impl ImageCore {
    pub fn info(&self) -> &ImageInfo {
        &self.info
    }

    pub fn size(&self) -> u64 {
        self.info.size
    }

    /// Ends this gateway's watch (crate::watch) at once: a process about
    /// to exit calls it, so that no `snap create` waits for it to be
    /// found dead. Writes after it fail.
    pub fn close(&self) {
        if let Some(watch) = &self.watch {
            watch.stop();
        }
    }

    /// The snapshot this image was opened at (read-only), if any.
    pub fn snapshot(&self) -> Option<&crate::snapshot::SnapInfo> {
        self.read_snap.as_ref()
    }

    fn refuse_writes(&self) -> Result<(), ClientError> {
        match &self.read_snap {
            Some(snap) => Err(ClientError::ReadOnly(format!("{}@{}", self.info.name, snap.name))),
            None => Ok(()),
        }
    }

    /// Runs mutations under the snapshot sequence the watch says; a
    /// clone copies its parent's objects up first where they change.
    fn run_writes(&self, ops: Vec<ObjectOp>, missing_ok: bool, done: Done<()>) {
        let Some(watch) = &self.watch else { return run(&self.client, ops, missing_ok, done) };
        let client = self.client.clone();
        let layer = self.layer.clone();
        watch.when_fresh(Box::new(move |entered| match entered {
            Ok((snap, in_flight)) => {
                let ops: Vec<ObjectOp> = ops.into_iter().map(|op| ObjectOp { snap, ..op }).collect();
                let done: Done<()> = Box::new(move |result| {
                    drop(in_flight);
                    done(result)
                });
                match layer {
                    Some(layer) => copy_up_then_run(client, layer, ops, snap, missing_ok, done),
                    None => run(&client, ops, missing_ok, done),
                }
            }
            Err(err) => done(Err(err)),
        }));
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.info.size => Ok(()),
            _ => Err(ClientError::Invalid(format!(
                "bytes {offset}..{} are past the image's end ({})",
                offset.saturating_add(len),
                self.info.size
            ))),
        }
    }

    /// The pieces of `offset..offset+len`, split at object boundaries and
    /// into at most `max_piece` bytes.
    fn pieces(&self, offset: u64, len: u64, max_piece: u64) -> Vec<Piece> {
        let object_size = self.info.object_size as u64;
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let number = at / object_size;
            let in_object = at % object_size;
            let piece = (object_size - in_object).min(offset + len - at).min(max_piece);
            pieces.push(Piece {
                object: data_object(&self.info.id, number),
                offset: in_object,
                len: piece,
                at: (at - offset) as usize,
            });
            at += piece;
        }
        debug_assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len, "pieces cover the I/O exactly");
        pieces
    }

    /// Reads `len` bytes from `offset`; `done` gets exactly `len` bytes.
    pub fn read_async(&self, offset: u64, len: u32, done: Done<Bytes>) {
        if let Err(err) = self.check_range(offset, len as u64) {
            return done(Err(err));
        }
        if len == 0 {
            return done(Ok(Bytes::new()));
        }
        let pieces = self.pieces(offset, len as u64, MAX_IO_BYTES as u64);
        if pieces.len() == 1 && self.layer.is_none() {
            let want = len as usize;
            let op = self.op(OpKind::Read, &pieces[0]);
            return self.client.submit(
                op,
                Box::new(move |result| {
                    done(match result {
                        Ok(data) if data.len() == want => Ok(data),
                        Ok(data) => {
                            let mut full = BytesMut::zeroed(want);
                            full[..data.len().min(want)].copy_from_slice(&data[..data.len().min(want)]);
                            Ok(full.freeze())
                        }
                        Err(ClientError::NotFound) => Ok(Bytes::from(vec![0u8; want])),
                        Err(err) => Err(err),
                    })
                }),
            );
        }
        let join = Arc::new(Join::new(pieces.len(), BytesMut::zeroed(len as usize), done));
        // While no other gateway changes the image (or at a snapshot, for
        // good), objects found absent are read from the parent at once.
        let generation = match (&self.read_snap, &self.watch) {
            (Some(_), _) => Some(crate::layering::FOR_GOOD),
            (None, Some(watch)) => watch.alone(),
            (None, None) => None,
        };
        for piece in &pieces {
            let join = join.clone();
            let (at, want) = (piece.at, piece.len as usize);
            // A clone's object it does not hold reads through to its parent.
            let through = self.layer.as_ref().and_then(|layer| {
                let number = object_number(&piece.object)?;
                let end = layer.through(number).min(piece.offset + piece.len);
                (end > piece.offset)
                    .then(|| (number, layer.parent_read(number, piece.offset, (end - piece.offset) as u32)))
            });
            let parent_fill = move |join: Arc<Join>| -> Callback {
                Box::new(move |result: Result<Bytes, ClientError>| match result {
                    Ok(data) => {
                        join.fill(at, &data[..data.len().min(want)]);
                        join.piece_done(Ok(()));
                    }
                    Err(ClientError::NotFound) => join.piece_done(Ok(())),
                    Err(err) => join.piece_done(Err(err)),
                })
            };
            let layer = self.layer.clone();
            if let (Some((number, parent_read)), Some(generation), Some(layer)) = (&through, generation, &layer) {
                if layer.absent(*number, generation) {
                    self.client.submit(parent_read.clone(), parent_fill(join));
                    continue;
                }
            }
            let ticket = match (&through, &layer) {
                (Some((number, _)), Some(layer)) if generation.is_some() => layer.read_ticket(*number),
                _ => None,
            };
            let client = self.client.clone();
            self.client.submit(
                self.op(OpKind::Read, piece),
                Box::new(move |result| match result {
                    Ok(data) => {
                        let n = data.len().min(want);
                        join.fill(at, &data[..n]);
                        join.piece_done(Ok(()));
                    }
                    Err(ClientError::NotFound) => match through {
                        Some((number, parent_read)) => {
                            if let (Some(layer), Some(generation), Some(ticket)) = (layer, generation, ticket) {
                                layer.mark_absent(number, generation, ticket);
                            }
                            client.submit(parent_read, parent_fill(join))
                        }
                        None => join.piece_done(Ok(())),
                    },
                    Err(err) => join.piece_done(Err(err)),
                }),
            );
        }
    }

    /// Writes `data` at `offset`. Acknowledged means: in the log of every replica.
    pub fn write_async(&self, offset: u64, data: Bytes, done: Done<()>) {
        if let Err(err) = self.refuse_writes().and_then(|()| self.check_range(offset, data.len() as u64)) {
            return done(Err(err));
        }
        let pieces = self.pieces(offset, data.len() as u64, MAX_WRITE_PIECE);
        let ops: Vec<ObjectOp> = pieces
            .iter()
            .map(|p| ObjectOp { data: data.slice(p.at..p.at + p.len as usize), ..self.op(OpKind::Write, p) })
            .collect();
        self.run_writes(ops, false, done);
    }

    /// Makes `len` bytes from `offset` read as zeros; thin images release
    /// whole objects and cut tails, pre-allocated ones keep their extents.
    pub fn write_zeroes_async(&self, offset: u64, len: u64, done: Done<()>) {
        if let Err(err) = self.refuse_writes().and_then(|()| self.check_range(offset, len)) {
            return done(Err(err));
        }
        let object_size = self.info.object_size as u64;
        let mut ops = Vec::new();
        let mut at = offset;
        while at < offset + len {
            let number = at / object_size;
            let in_object = at % object_size;
            let piece = (object_size - in_object).min(offset + len - at);
            // A clone's object emptied whole must still hide its parent's.
            let through = self.layer.as_ref().is_some_and(|layer| layer.through(number) > 0);
            let object = data_object(&self.info.id, number);
            ops.extend(zero_ops(self.info.data_pool_in(self.pool), &self.info, object, in_object, piece, through));
            at += piece;
        }
        self.run_writes(ops, true, done);
    }

    /// Every acknowledged write is already in every replica's log: nothing to do.
    pub fn flush_async(&self, done: Done<()>) {
        done(Ok(()))
    }

    fn op(&self, kind: OpKind, piece: &Piece) -> ObjectOp {
        let read = kind == OpKind::Read;
        ObjectOp {
            offset: piece.offset,
            length: if read { piece.len as u32 } else { 0 },
            // A read of a snapshot names it; writes get theirs from the watch.
            snap: if read { self.read_snap.as_ref().map_or(0, |s| s.id) } else { 0 },
            ..ObjectOp::new(self.info.data_pool_in(self.pool), kind, piece.object.clone())
        }
    }
}

/// An open image. Cheap to share behind an `Arc`; every method may be
/// called from many threads at once. Its I/O keeps to the image's limits
/// (crate::qos) when it has any.
pub struct Image {
    core: Arc<ImageCore>,
    /// The image's limits (`None`: opened at a snapshot, read-only and unlimited).
    throttle: Option<Arc<crate::qos::Throttle>>,
}

impl Drop for Image {
    fn drop(&mut self) {
        // The I/O its limits hold goes now, and their thread ends.
        if let Some(throttle) = &self.throttle {
            throttle.stop();
        }
    }
}

impl Image {
    pub fn info(&self) -> &ImageInfo {
        self.core.info()
    }

    pub fn size(&self) -> u64 {
        self.core.size()
    }

    /// Ends this gateway's watch (crate::watch) at once: a process about
    /// to exit calls it, so that no `snap create` waits for it to be
    /// found dead. Writes after it fail.
    pub fn close(&self) {
        self.core.close();
        // The I/O its limits hold goes now (and fails: the watch ended).
        if let Some(throttle) = &self.throttle {
            throttle.stop();
        }
    }

    /// The snapshot this image was opened at (read-only), if any.
    pub fn snapshot(&self) -> Option<&crate::snapshot::SnapInfo> {
        self.core.snapshot()
    }

    /// The limits this gateway keeps to (its share of the image's), and
    /// how many I/Os waited for them since it opened the image.
    pub fn limits(&self) -> Option<(duplex_qos::Limits, u64)> {
        self.throttle.as_ref().map(|t| (t.limits(), t.held()))
    }

    /// Runs `start` now if the limits allow an I/O of `bytes` going
    /// `direction`, else once they do.
    fn limited(&self, direction: duplex_qos::Direction, bytes: u64, start: impl FnOnce(&ImageCore) + Send + 'static) {
        match &self.throttle {
            Some(throttle) if !throttle.pass(direction, bytes) => {
                let core = self.core.clone();
                throttle.hold(direction, bytes, Box::new(move || start(&core)));
            }
            _ => start(&self.core),
        }
    }

    /// Reads `len` bytes from `offset`; `done` gets exactly `len` bytes.
    pub fn read_async(&self, offset: u64, len: u32, done: Done<Bytes>) {
        self.limited(duplex_qos::Direction::Read, len as u64, move |core| core.read_async(offset, len, done))
    }

    /// Writes `data` at `offset`. Acknowledged means: in the log of every replica.
    pub fn write_async(&self, offset: u64, data: Bytes, done: Done<()>) {
        let bytes = data.len() as u64;
        self.limited(duplex_qos::Direction::Write, bytes, move |core| core.write_async(offset, data, done))
    }

    /// Makes `len` bytes from `offset` read as zeros (one write I/O to the
    /// limits, counted without bytes: nothing is sent).
    pub fn write_zeroes_async(&self, offset: u64, len: u64, done: Done<()>) {
        self.limited(duplex_qos::Direction::Write, 0, move |core| core.write_zeroes_async(offset, len, done))
    }

    /// Discard: the same as writing zeros (reads after a discard return zeros).
    pub fn discard_async(&self, offset: u64, len: u64, done: Done<()>) {
        self.write_zeroes_async(offset, len, done)
    }

    /// Every acknowledged write is already in every replica's log: nothing to do.
    pub fn flush_async(&self, done: Done<()>) {
        self.core.flush_async(done)
    }

    pub fn read(&self, offset: u64, len: u32) -> Result<Bytes, ClientError> {
        wait(|done| self.read_async(offset, len, done))
    }

    pub fn write(&self, offset: u64, data: Bytes) -> Result<(), ClientError> {
        wait(|done| self.write_async(offset, data, done))
    }

    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), ClientError> {
        wait(|done| self.write_zeroes_async(offset, len, done))
    }
}

/// The object number of a data object's name (`<id>.<16 hex digits>`).
fn object_number(name: &[u8]) -> Option<u64> {
    let name = std::str::from_utf8(name).ok()?;
    let (_, number) = name.rsplit_once('.')?;
    (number.len() == 16).then(|| u64::from_str_radix(number, 16).ok()).flatten()
}

/// A clone's mutations: each object they change (but for one emptied
/// whole) first holds its parent's data, then they run.
fn copy_up_then_run(
    client: Client,
    layer: Arc<crate::layering::Layer>,
    ops: Vec<ObjectOp>,
    snap: u64,
    missing_ok: bool,
    done: Done<()>,
) {
    // Every object the ops touch may exist after them: not known absent.
    let mut touched: Vec<u64> = ops.iter().filter_map(|op| object_number(&op.object)).collect();
    touched.sort_unstable();
    touched.dedup();
    for number in &touched {
        layer.write_started(*number);
    }
    let done: Done<()> = {
        let layer = layer.clone();
        Box::new(move |result| {
            for number in touched {
                layer.write_ended(number);
            }
            done(result)
        })
    };
    let mut numbers: Vec<u64> = ops
        .iter()
        .filter(|op| !(op.kind == OpKind::Truncate && op.offset == 0))
        .filter_map(|op| object_number(&op.object))
        .collect();
    numbers.sort_unstable();
    numbers.dedup();
    if numbers.is_empty() {
        return run(&client, ops, missing_ok, done);
    }
    let after = Arc::new(Mutex::new(Some((ops, done))));
    let remaining = Arc::new(AtomicUsize::new(numbers.len()));
    let failed: Arc<Mutex<Option<ClientError>>> = Arc::new(Mutex::new(None));
    for number in numbers {
        let (after, remaining, failed, next) = (after.clone(), remaining.clone(), failed.clone(), client.clone());
        crate::layering::copy_up(
            &client,
            &layer,
            number,
            snap,
            Box::new(move |result| {
                if let Err(err) = result {
                    failed.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(err);
                }
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let (ops, done) = after.lock().unwrap_or_else(|p| p.into_inner()).take().expect("run once");
                    match failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
                        Some(err) => done(Err(err)),
                        None => run(&next, ops, missing_ok, done),
                    }
                }
            }),
        );
    }
}

/// Runs `ops`, `RUN_WINDOW` at a time; `done` gets the first error or `Ok`.
fn run(client: &Client, ops: Vec<ObjectOp>, missing_ok: bool, done: Done<()>) {
    if ops.is_empty() {
        return done(Ok(()));
    }
    let join = Arc::new(Join::new(ops.len(), BytesMut::new(), Box::new(move |r: Result<Bytes, _>| done(r.map(drop)))));
    let queue = Arc::new(Mutex::new(ops.into_iter()));
    for _ in 0..RUN_WINDOW {
        submit_next(client, &queue, &join, missing_ok);
    }
}

fn wait<T: Send + 'static>(start: impl FnOnce(Done<T>)) -> Result<T, ClientError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    start(Box::new(move |result| {
        let _ = tx.send(result);
    }));
    rx.recv().unwrap_or(Err(ClientError::Shutdown))
}

/// The pieces of one image I/O: the buffer they fill and the callback the
/// last one to finish calls.
struct Join {
    remaining: AtomicUsize,
    state: Mutex<(BytesMut, Option<ClientError>, Option<Done<Bytes>>)>,
}

impl Join {
    fn new(pieces: usize, buffer: BytesMut, done: Done<Bytes>) -> Join {
        Join { remaining: AtomicUsize::new(pieces), state: Mutex::new((buffer, None, Some(done))) }
    }

    fn fill(&self, at: usize, data: &[u8]) {
        let mut state = self.state.lock().expect("join lock");
        debug_assert!(at + data.len() <= state.0.len(), "a piece lands inside the I/O's buffer");
        state.0[at..at + data.len()].copy_from_slice(data);
    }

    fn piece_done(&self, result: Result<(), ClientError>) {
        if let Err(err) = result {
            self.state.lock().expect("join lock").1.get_or_insert(err);
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            let (buffer, error, done) = {
                let mut state = self.state.lock().expect("join lock");
                (std::mem::take(&mut state.0), state.1.take(), state.2.take())
            };
            let done = done.expect("the last piece finishes once");
            done(match error {
                Some(err) => Err(err),
                None => Ok(buffer.freeze()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn header_round_trips_and_rejects_damage(size in any::<u64>(), order in 12u32..27, prealloc in any::<bool>(), id in 1u64.., flip in 0usize..64) {
            let data_pool = (id % 3 == 0).then_some((id >> 8) as u32);
            let info = ImageInfo { name: "disk".into(), id: format!("{id:016x}"), size, object_size: 1 << order, preallocated: prealloc, created: 5, data_pool };
            let bytes = info.encode();
            prop_assert_eq!(ImageInfo::decode("disk", &bytes), Ok(info));
            let mut bad = bytes.to_vec();
            bad[flip] ^= 1;
            prop_assert!(ImageInfo::decode("disk", &bad).is_err());
        }

        #[test]
        fn header_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = ImageInfo::decode("x", &bytes);
        }
    }

    #[test]
    fn names_are_checked() {
        assert!(check_name("vm-disk_1.img").is_ok());
        for bad in ["", "a/b", "a b", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
