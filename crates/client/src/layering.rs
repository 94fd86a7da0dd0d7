//! Copy-on-write clones of images (`duplex image clone IMAGE@SNAP CHILD`),
//! as RBD's layering: the child starts with no data objects and reads
//! through to its parent's protected snapshot; before the child first
//! changes one of its objects, it copies the parent's up ([`copy_up`], an
//! OSD copy-up that takes effect only while the child object is absent,
//! so racing writers copy it once). `flatten` copies up every object the
//! parent holds and cuts the link.
//!
//! A child's objects are at most [`MAX_CLONE_OBJECT`] (256 KiB): a copy-up
//! is one logged write, which an OSD's PG log takes whole, and a first
//! write to a clone copies up that much of its parent, not 4 MiB (Ceph
//! users know that write amplification well). Child object `n` reads
//! through to the parent's bytes `n × child object size` on, wherever
//! they lie in the parent's (larger) objects.
//!
//! The link lives in the child's header object at [`PARENT_OFFSET`]; the
//! parent knows its children by the attributes `<snap id>.<child id>` of
//! its object `<id>.children`, so that a snapshot with clones can be
//! neither unprotected nor removed.
//!
//! ```text
//! 0 magic "DPXP"  4 version u32  8 pool u32  12 parent id u64  20 snap id u64
//! 28 overlap u64 (bytes of the child that read through)   36 parent's object size u32
//! 40 name length u8, parent image name, snapshot name length u8, snapshot name
//! then crc32c u32 of all that precedes it
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use duplex_proto::osd::OpKind;

use crate::client::Client;
use crate::error::ClientError;
use crate::image::{data_object, header_object, ImageInfo};
use crate::runtime::ObjectOp;

/// Where the parent link starts in a child's header object.
pub const PARENT_OFFSET: u64 = 1024;
const LINK_MAGIC: &[u8; 4] = b"DPXP";
const LINK_VERSION: u32 = 1;
const LINK_MAX: u32 = 1024;
/// A clone's largest object: one copy-up, one logged write.
pub const MAX_CLONE_OBJECT: u32 = crate::image::MAX_WRITE_PIECE as u32;

/// A clone's parent: a snapshot of another image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ParentLink {
    pub pool: u32,
    pub image_id: String,
    pub image: String,
    pub snap_id: u64,
    pub snap: String,
    /// Bytes of the child that read through to the parent (the
    /// snapshot's size when cloned).
    pub overlap: u64,
    /// The parent's object size (the child's may be smaller).
    pub parent_object_size: u32,
}

impl ParentLink {
    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(64 + self.image.len() + self.snap.len());
        out.extend_from_slice(LINK_MAGIC);
        out.extend_from_slice(&LINK_VERSION.to_le_bytes());
        out.extend_from_slice(&self.pool.to_le_bytes());
        let id = u64::from_str_radix(&self.image_id, 16).expect("ids are 16 hex digits");
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&self.snap_id.to_le_bytes());
        out.extend_from_slice(&self.overlap.to_le_bytes());
        out.extend_from_slice(&self.parent_object_size.to_le_bytes());
        for name in [&self.image, &self.snap] {
            out.push(name.len() as u8);
            out.extend_from_slice(name.as_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Bytes::from(out)
    }

    /// The link in `bytes`; `None` for an image that is no clone (no
    /// bytes, or zeros: a flattened clone's link is zeroed).
    pub fn decode(bytes: &[u8]) -> Result<Option<ParentLink>, String> {
        if bytes.len() < 4 || bytes[..4] == [0; 4] {
            return Ok(None);
        }
        if &bytes[..4] != LINK_MAGIC {
            return Err("bad magic".into());
        }
        let get = |at: usize, n: usize| bytes.get(at..at + n).ok_or_else(|| "truncated".to_string());
        let long = |at: usize| get(at, 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
        if u32::from_le_bytes(get(4, 4)?.try_into().expect("4 bytes")) != LINK_VERSION {
            return Err("unknown version".into());
        }
        let pool = u32::from_le_bytes(get(8, 4)?.try_into().expect("4 bytes"));
        let (id, snap_id, overlap) = (long(12)?, long(20)?, long(28)?);
        let parent_object_size = u32::from_le_bytes(get(36, 4)?.try_into().expect("4 bytes"));
        let mut at = 40;
        let mut names = Vec::new();
        for _ in 0..2 {
            let len = get(at, 1)?[0] as usize;
            let name = String::from_utf8(get(at + 1, len)?.to_vec()).map_err(|_| "a name that is not UTF-8")?;
            names.push(name);
            at += 1 + len;
        }
        let crc = u32::from_le_bytes(get(at, 4)?.try_into().expect("4 bytes"));
        if crc32c::crc32c(&bytes[..at]) != crc {
            return Err("checksum mismatch".into());
        }
        if id == 0 || snap_id == 0 {
            return Err("a link to no image or no snapshot".into());
        }
        if !crate::image::valid_object_size(parent_object_size) {
            return Err("a parent object size that is not one".into());
        }
        let snap = names.pop().expect("two names");
        let image = names.pop().expect("two names");
        Ok(Some(ParentLink { pool, image_id: format!("{id:016x}"), image, snap_id, snap, overlap, parent_object_size }))
    }

    /// Objects of the child that may read through (those the overlap reaches).
    pub fn objects(&self, object_size: u32) -> u64 {
        self.overlap.div_ceil(object_size as u64)
    }
}

/// The parent link in the header of image `id`.
pub(crate) fn read_link(client: &Client, pool: u32, id: &str) -> Result<Option<ParentLink>, ClientError> {
    let bytes = match client.read(pool, &header_object(id), PARENT_OFFSET, LINK_MAX) {
        Ok(bytes) => bytes,
        Err(ClientError::NotFound) => Bytes::new(),
        Err(err) => return Err(err),
    };
    ParentLink::decode(&bytes).map_err(|why| ClientError::Corrupt(format!("parent link of image {id}: {why}")))
}

fn children_object(parent_id: &str) -> Vec<u8> {
    format!("{parent_id}.children").into_bytes()
}

fn child_attr(snap_id: u64, child_id: &str) -> Vec<u8> {
    format!("{snap_id:016x}.{child_id}").into_bytes()
}

/// What a cloned image's I/O needs: its parent, which of its objects are
/// known to hold their parent's data already (or need none), and, while
/// its gateway is alone (crate::watch), which are known absent, so that
/// reads of them go straight to the parent: one request, not two.
pub(crate) struct Layer {
    pub link: ParentLink,
    pub object_size: u32,
    pub child_id: String,
    pub pool: u32,
    copied: Mutex<HashSet<u64>>,
    known: Mutex<Known>,
}

/// Child objects found absent (with the watch generation they were found
/// in), and the writes to each: in flight, and how many started ever.
#[derive(Default)]
struct Known {
    absent: std::collections::HashMap<u64, u64>,
    writes: std::collections::HashMap<u64, (u32, u64)>,
}

/// The generation of a snapshot's reads: what a snapshot lacks, it lacks for good.
pub(crate) const FOR_GOOD: u64 = u64::MAX;

impl Layer {
    pub fn new(link: ParentLink, info: &ImageInfo, pool: u32) -> Layer {
        Layer {
            link,
            object_size: info.object_size,
            child_id: info.id.clone(),
            pool,
            copied: Mutex::new(HashSet::new()),
            known: Mutex::new(Known::default()),
        }
    }

    fn known_lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether object `number` is known absent in `generation`.
    pub fn absent(&self, number: u64, generation: u64) -> bool {
        self.known_lock().absent.get(&number) == Some(&generation)
    }

    /// Taken as a read of object `number` is sent: `None` while a write
    /// to it is in flight (an absent answer would not last).
    pub fn read_ticket(&self, number: u64) -> Option<u64> {
        match self.known_lock().writes.get(&number) {
            Some((in_flight, _)) if *in_flight > 0 => None,
            Some((_, started)) => Some(*started),
            None => Some(0),
        }
    }

    /// A read sent with `ticket` found object `number` absent: remembered
    /// in `generation`, unless a write to it started since.
    pub fn mark_absent(&self, number: u64, generation: u64, ticket: u64) {
        let mut known = self.known_lock();
        if known.writes.get(&number).map_or(0, |(_, started)| *started) == ticket {
            known.absent.insert(number, generation);
        }
    }

    /// A write to object `number` starts: it may make it exist.
    pub fn write_started(&self, number: u64) {
        let mut known = self.known_lock();
        known.absent.remove(&number);
        let entry = known.writes.entry(number).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += 1;
    }

    pub fn write_ended(&self, number: u64) {
        let mut known = self.known_lock();
        known.absent.remove(&number);
        if let Some(entry) = known.writes.get_mut(&number) {
            debug_assert!(entry.0 > 0, "a write ended that never started");
            entry.0 = entry.0.saturating_sub(1);
        }
    }

    /// The bytes of object `number` that read through (0: none).
    pub fn through(&self, number: u64) -> u64 {
        let base = number * self.object_size as u64;
        self.link.overlap.saturating_sub(base).min(self.object_size as u64)
    }

    /// A read at the snapshot of the parent's bytes under the child's
    /// object `number`, `offset..+len` of it (within one parent object, as
    /// child objects are no larger and both are powers of two).
    pub fn parent_read(&self, number: u64, offset: u64, len: u32) -> ObjectOp {
        let at = number * self.object_size as u64 + offset;
        let parent_size = self.link.parent_object_size as u64;
        debug_assert!(at % parent_size + len as u64 <= parent_size, "a read through crosses the parent's objects");
        ObjectOp {
            offset: at % parent_size,
            length: len,
            snap: self.link.snap_id,
            ..ObjectOp::new(self.link.pool, OpKind::Read, data_object(&self.link.image_id, at / parent_size))
        }
    }

    fn known(&self, number: u64) -> bool {
        self.through(number) == 0 || self.copied.lock().unwrap_or_else(|p| p.into_inner()).contains(&number)
    }

    fn mark(&self, number: u64) {
        self.copied.lock().unwrap_or_else(|p| p.into_inner()).insert(number);
    }
}

pub(crate) type Then = Box<dyn FnOnce(Result<(), ClientError>) + Send + 'static>;

/// Makes sure the child's object `number` holds its parent's data (or has
/// no need to) before `then` runs: a stat of the child's object, and if it
/// is absent, the parent's object read at the snapshot and copied up
/// (written only if still absent). `snap`: the child's write sequence.
pub(crate) fn copy_up(client: &Client, layer: &Arc<Layer>, number: u64, snap: u64, then: Then) {
    if layer.known(number) {
        return then(Ok(()));
    }
    let child = data_object(&layer.child_id, number);
    let stat = ObjectOp::new(layer.pool, OpKind::Stat, child.clone());
    let (client2, layer2) = (client.clone(), layer.clone());
    client.submit(
        stat,
        Box::new(move |result| match result {
            Ok(_) => {
                layer2.mark(number);
                then(Ok(()))
            }
            Err(ClientError::NotFound) => {
                let through = layer2.through(number);
                let read = layer2.parent_read(number, 0, through as u32);
                let (client3, layer3) = (client2.clone(), layer2.clone());
                client2.submit(
                    read,
                    Box::new(move |result| match result {
                        // Nothing above: the child's own writes make the object.
                        Err(ClientError::NotFound) => {
                            layer3.mark(number);
                            then(Ok(()))
                        }
                        Ok(data) if data.iter().all(|b| *b == 0) => {
                            layer3.mark(number);
                            then(Ok(()))
                        }
                        Ok(data) => {
                            let op = ObjectOp { data, snap, ..ObjectOp::new(layer3.pool, OpKind::CopyUp, child) };
                            client3.submit(
                                op,
                                Box::new(move |result| {
                                    if result.is_ok() {
                                        layer3.mark(number);
                                    }
                                    then(result.map(drop))
                                }),
                            );
                        }
                        Err(err) => then(Err(err)),
                    }),
                );
            }
            Err(err) => then(Err(err)),
        }),
    );
}

impl Client {
    /// Clones `parent@snap` (a protected snapshot) as a new image `child`
    /// of the snapshot's size that reads through to it until written.
    pub fn clone_image(&self, pool: u32, parent: &str, snap: &str, child: &str) -> Result<ImageInfo, ClientError> {
        let parent_info = self.image_info(pool, parent)?;
        let snapshot = self.snapshot_info(pool, parent, snap)?;
        if !snapshot.protected {
            return Err(ClientError::Invalid(format!(
                "{parent}@{snap} is not protected: protect it first (`duplex snap protect {parent}@{snap}`), \
                 so that it cannot be removed while clones read from it"
            )));
        }
        let link = ParentLink {
            pool,
            image_id: parent_info.id.clone(),
            image: parent.into(),
            snap_id: snapshot.id,
            snap: snap.into(),
            overlap: snapshot.size,
            parent_object_size: parent_info.object_size,
        };
        let object_size = parent_info.object_size.min(MAX_CLONE_OBJECT);
        let options = crate::image::CreateOptions { object_size, preallocate: false, data_pool: None };
        let info = self.create_image_with(pool, child, snapshot.size, options, Some(&link))?;
        // Known to the parent once made: a crash before leaves a child the
        // parent does not list, which `image remove` then takes away.
        let children = children_object(&parent_info.id);
        self.set_attr(pool, &children, &child_attr(snapshot.id, &info.id), child.as_bytes())?;
        Ok(info)
    }

    /// The parent of `image`, if it is a clone.
    pub fn parent_of(&self, pool: u32, image: &str) -> Result<Option<ParentLink>, ClientError> {
        let info = self.image_info(pool, image)?;
        read_link(self, pool, &info.id)
    }

    /// The names of the clones of `image@snap`.
    pub fn children_of(&self, pool: u32, image: &str, snap: &str) -> Result<Vec<String>, ClientError> {
        let info = self.image_info(pool, image)?;
        let snapshot = self.snapshot_info(pool, image, snap)?;
        let prefix = format!("{:016x}.", snapshot.id).into_bytes();
        let attrs = match self.list_attrs(pool, &children_object(&info.id)) {
            Ok(attrs) => attrs,
            Err(ClientError::NotFound) => Vec::new(),
            Err(err) => return Err(err),
        };
        let mut names: Vec<String> = attrs
            .into_iter()
            .filter(|(name, _)| name.starts_with(&prefix))
            .map(|(_, value)| String::from_utf8_lossy(&value).into_owned())
            .collect();
        names.sort();
        Ok(names)
    }

    /// Copies up every object the child still reads from its parent, then
    /// cuts the link; the parent's snapshot may go after. `progress` gets
    /// (objects done, objects).
    pub fn flatten_image(&self, pool: u32, image: &str, progress: &mut dyn FnMut(u64, u64)) -> Result<(), ClientError> {
        let info = self.image_info(pool, image)?;
        let Some(link) = read_link(self, pool, &info.id)? else {
            return Err(ClientError::Invalid(format!("{image} is not a clone: nothing to flatten")));
        };
        let table = crate::snapshot::read_table(self, pool, &header_object(&info.id))?;
        if !table.snaps.is_empty() {
            // Its snapshots read through the parent too: cutting the link
            // would empty what they read there.
            return Err(ClientError::Busy(format!(
                "{image} has {} snapshot(s), which read through its parent: remove them first \
                 (`duplex snap purge {image}`)",
                table.snaps.len()
            )));
        }
        let write_snap = table.newest_live();
        // A watcher of its own for the flatten's length: a gateway serving
        // the clone, alone until now, forgets which objects it found absent
        // (crate::watch, "Alone") before any is copied up.
        let watch = crate::watch::Watch::start(self, pool, header_object(&info.id), None)?;
        if watch.alone().is_none() {
            std::thread::sleep(crate::watch::FENCE);
        }
        let layer = Arc::new(Layer::new(link.clone(), &info, pool));
        let objects = link.objects(info.object_size);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut next = 0;
        let mut in_flight = 0;
        let mut done = 0;
        let mut first_error = None;
        while done < objects {
            while in_flight < 16 && next < objects && first_error.is_none() {
                let tx = tx.clone();
                copy_up(
                    self,
                    &layer,
                    next,
                    write_snap,
                    Box::new(move |result| {
                        let _ = tx.send(result);
                    }),
                );
                next += 1;
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            let result = rx.recv().map_err(|_| ClientError::Shutdown)?;
            in_flight -= 1;
            done += 1;
            if let Err(err) = result {
                first_error.get_or_insert(err);
            }
            progress(done, objects);
        }
        if let Some(err) = first_error {
            return Err(err);
        }
        self.write(pool, &header_object(&info.id), PARENT_OFFSET, Bytes::from(vec![0u8; 64]))?;
        self.unregister_child(&link, &info.id)
    }

    /// Forgets `child_id` among its parent's children (no error if it was not there).
    pub(crate) fn unregister_child(&self, link: &ParentLink, child_id: &str) -> Result<(), ClientError> {
        match self.remove_attr(link.pool, &children_object(&link.image_id), &child_attr(link.snap_id, child_id)) {
            Ok(()) | Err(ClientError::NotFound) => Ok(()),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn links_round_trip_and_reject_damage(
            image in "[a-z0-9._-]{1,40}",
            snap in "[a-z0-9._-]{1,40}",
            id in 1u64..,
            snap_id in 1u64..,
            overlap in any::<u64>(),
            flip in any::<usize>(),
        ) {
            let link = ParentLink { pool: 3, image_id: format!("{id:016x}"), image, snap_id, snap, overlap, parent_object_size: 4 << 20 };
            let bytes = link.encode();
            prop_assert_eq!(ParentLink::decode(&bytes), Ok(Some(link.clone())));
            let mut bad = bytes.to_vec();
            bad[flip % bytes.len()] ^= 0x08;
            prop_assert_ne!(ParentLink::decode(&bad), Ok(Some(link)));
        }

        #[test]
        fn the_link_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = ParentLink::decode(&bytes);
        }
    }

    #[test]
    fn no_link_is_no_parent_and_the_overlap_bounds_what_reads_through() {
        assert_eq!(ParentLink::decode(&[]), Ok(None));
        assert_eq!(ParentLink::decode(&[0u8; 64]), Ok(None));
        let link = ParentLink {
            pool: 1,
            image_id: format!("{:016x}", 7),
            image: "base".into(),
            snap_id: 2,
            snap: "gold".into(),
            overlap: 10 << 20,
            parent_object_size: 4 << 20,
        };
        assert_eq!(link.objects(4 << 20), 3);
        let info = ImageInfo {
            name: "child".into(),
            id: format!("{:016x}", 9),
            size: 20 << 20,
            object_size: 1 << 20,
            preallocated: false,
            created: 0,
            data_pool: None,
        };
        let layer = Layer::new(link, &info, 1);
        assert_eq!((layer.through(0), layer.through(9), layer.through(10)), (1 << 20, 1 << 20, 0));
        assert!(layer.known(10), "an object past the overlap reads nothing through");
        // Absence is remembered only if no write to the object started
        // since the read was sent, and only in its generation.
        let ticket = layer.read_ticket(3).expect("no write in flight");
        layer.write_started(3);
        assert_eq!(layer.read_ticket(3), None, "a write is in flight");
        layer.mark_absent(3, 7, ticket);
        assert!(!layer.absent(3, 7), "a write started after the read was sent");
        layer.write_ended(3);
        let ticket = layer.read_ticket(3).expect("no write in flight");
        layer.mark_absent(3, 7, ticket);
        assert!(layer.absent(3, 7) && !layer.absent(3, 8), "known in its generation only");
        layer.write_started(3);
        assert!(!layer.absent(3, 7), "a write forgets it");
        // Child object 5 (bytes 5 MiB on) is in the parent's object 1, 1 MiB in.
        let read = layer.parent_read(5, 4096, 512);
        assert_eq!((read.offset, read.length, read.snap), ((1 << 20) + 4096, 512, 2));
        assert_eq!(read.object, data_object(&format!("{:016x}", 7), 1));
    }
}
