//! Image snapshots: the table in the image's header object, and what
//! `snap create`, `remove`, `rollback`, `protect` and diffs do with it.
//!
//! The OSD keeps the data (DESIGN.md §8, the OSD's `snaps` module): an
//! image's writes carry its newest live snapshot id, and the first write
//! to an object after a snapshot clones the object, sharing its blocks.
//! Reading at a snapshot reads the clone that covers it.
//!
//! The table lives in the header object at [`TABLE_OFFSET`], written whole
//! in one write (so atomically): the sequence (the last id given out) and
//! one record per snapshot. Ids only grow, and a removed snapshot's id is
//! never given out again.
//!
//! ```text
//! 0 magic "DPXS"  4 version u32  8 seq u64  16 count u32
//! 20 records: name length u8, name, id u64, size u64, created u64, flags u8
//! then crc32c u32 of all that precedes it
//! ```

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use duplex_proto::osd::{OpKind, SnapDiff, SnapList};

use crate::client::Client;
use crate::error::ClientError;
use crate::image::{check_name_of, data_object, header_object, ImageInfo};
use crate::runtime::ObjectOp;

/// Where the snapshot table starts in the header object.
pub const TABLE_OFFSET: u64 = 4096;
/// The largest table: about 2,000 snapshots of long names.
pub const MAX_TABLE: u32 = 256 << 10;
const TABLE_MAGIC: &[u8; 4] = b"DPXS";
/// 2 added `reach`; a version 1 table is read with the reach its snapshots give.
const TABLE_VERSION: u32 = 2;
const FLAG_PROTECTED: u8 = 1;

/// One snapshot of an image.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SnapInfo {
    pub name: String,
    /// Grows with each snapshot of the image; what the OSDs know it by.
    pub id: u64,
    /// The image's size when it was taken.
    pub size: u64,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub protected: bool,
}

/// An image's snapshots, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SnapTable {
    /// The last id given out (0: none yet).
    pub seq: u64,
    /// The largest size any snapshot ever taken had, removed ones too:
    /// objects past it have no clone, so a trim looks no further (and a
    /// `snap remove` cut short leaves none beyond it).
    pub reach: u64,
    pub snaps: Vec<SnapInfo>,
}

impl SnapTable {
    /// The newest live snapshot's id: writes are logged under it (0: none,
    /// and then writes clone nothing).
    pub fn newest_live(&self) -> u64 {
        self.snaps.iter().map(|s| s.id).max().unwrap_or(0)
    }

    pub fn find(&self, name: &str) -> Option<&SnapInfo> {
        self.snaps.iter().find(|s| s.name == name)
    }

    /// Snapshot `snap` of `image`, or the error naming it.
    pub fn get(&self, image: &str, snap: &str) -> Result<&SnapInfo, ClientError> {
        self.find(snap).ok_or_else(|| ClientError::NoSuchSnapshot(format!("{image}@{snap}")))
    }

    pub fn encode(&self) -> Bytes {
        let mut out = Vec::with_capacity(24 + self.snaps.len() * 64);
        out.extend_from_slice(TABLE_MAGIC);
        out.extend_from_slice(&TABLE_VERSION.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.extend_from_slice(&self.reach.to_le_bytes());
        out.extend_from_slice(&(self.snaps.len() as u32).to_le_bytes());
        for snap in &self.snaps {
            debug_assert!(snap.name.len() <= crate::image::MAX_NAME_LEN, "a snapshot name past the limit");
            out.push(snap.name.len() as u8);
            out.extend_from_slice(snap.name.as_bytes());
            out.extend_from_slice(&snap.id.to_le_bytes());
            out.extend_from_slice(&snap.size.to_le_bytes());
            out.extend_from_slice(&snap.created.to_le_bytes());
            out.push(if snap.protected { FLAG_PROTECTED } else { 0 });
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        Bytes::from(out)
    }

    /// The table in `bytes` (trailing bytes ignored); empty bytes, or
    /// zeros, are an image that never had a snapshot.
    pub fn decode(bytes: &[u8]) -> Result<SnapTable, String> {
        if bytes.len() < 4 || bytes[..4] == [0; 4] {
            return Ok(SnapTable::default());
        }
        if &bytes[..4] != TABLE_MAGIC {
            return Err("bad magic".into());
        }
        let mut reader = Reader { bytes, at: 4 };
        let mut take = |n: usize| reader.take(n);
        let long = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
        let version = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
        if version != 1 && version != TABLE_VERSION {
            return Err(format!("unknown version {version}"));
        }
        let seq = long(take(8)?);
        let reach = if version >= 2 { Some(long(take(8)?)) } else { None };
        let count = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        if count > MAX_TABLE as usize / 26 {
            return Err("more snapshots than a table holds".into());
        }
        let mut snaps = Vec::with_capacity(count);
        for _ in 0..count {
            let len = take(1)?[0] as usize;
            let name = String::from_utf8(take(len)?.to_vec()).map_err(|_| "a name that is not UTF-8")?;
            let (id, size, created) = (long(take(8)?), long(take(8)?), long(take(8)?));
            let protected = take(1)?[0] & FLAG_PROTECTED != 0;
            if id == 0 || id > seq {
                return Err(format!("snapshot '{name}' has id {id}, outside 1..={seq}"));
            }
            snaps.push(SnapInfo { name, id, size, created, protected });
        }
        let end = reader.at;
        let crc = u32::from_le_bytes(reader.take(4)?.try_into().expect("4 bytes"));
        if crc32c::crc32c(&bytes[..end]) != crc {
            return Err("checksum mismatch".into());
        }
        if snaps.windows(2).any(|w| w[0].id >= w[1].id) {
            return Err("snapshots out of order".into());
        }
        let reach = reach.unwrap_or_else(|| snaps.iter().map(|s| s.size).max().unwrap_or(0));
        if snaps.iter().any(|s| s.size > reach) {
            return Err("a snapshot larger than the table's reach".into());
        }
        Ok(SnapTable { seq, reach, snaps })
    }
}

/// A decoder's position in its bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let piece = self.bytes.get(self.at..self.at.saturating_add(n)).ok_or("truncated")?;
        self.at += n;
        Ok(piece)
    }
}

/// The snapshot table in `header`.
pub(crate) fn read_table(client: &Client, pool: u32, header: &[u8]) -> Result<SnapTable, ClientError> {
    let bytes = match client.read(pool, header, TABLE_OFFSET, MAX_TABLE) {
        Ok(bytes) => bytes,
        Err(ClientError::NotFound) => Bytes::new(),
        Err(err) => return Err(err),
    };
    SnapTable::decode(&bytes).map_err(|why| ClientError::Corrupt(format!("snapshot table of {}: {why}", show(header))))
}

fn write_table(client: &Client, pool: u32, header: &[u8], table: &SnapTable) -> Result<(), ClientError> {
    let bytes = table.encode();
    if bytes.len() > MAX_TABLE as usize {
        return Err(ClientError::Invalid(format!("an image holds at most about {} snapshots", MAX_TABLE / 160)));
    }
    client.write(pool, header, TABLE_OFFSET, bytes)
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// What `snap create` waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Quiesced {
    /// Gateways writing the image that adopted the snapshot.
    pub acknowledged: usize,
    /// Gateways that had stopped renewing their watch and were dropped.
    pub dropped: usize,
}

/// One object's changes between two snapshots, in image byte offsets.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Extent {
    pub offset: u64,
    pub len: u64,
    /// Reads as zeros at the later snapshot (the object is gone or shorter there).
    pub zero: bool,
}

impl Client {
    /// The image's snapshots, oldest first.
    pub fn list_snapshots(&self, pool: u32, image: &str) -> Result<Vec<SnapInfo>, ClientError> {
        let info = self.image_info(pool, image)?;
        Ok(read_table(self, pool, &header_object(&info.id))?.snaps)
    }

    /// The snapshot named `snap` of `image`.
    pub fn snapshot_info(&self, pool: u32, image: &str, snap: &str) -> Result<SnapInfo, ClientError> {
        let info = self.image_info(pool, image)?;
        read_table(self, pool, &header_object(&info.id))?.get(image, snap).cloned()
    }

    /// Takes a snapshot. Returns once every gateway writing the image has
    /// adopted it (or was found dead), so that it holds every write
    /// acknowledged before and none started after (crate::watch).
    pub fn create_snapshot(&self, pool: u32, image: &str, snap: &str) -> Result<(SnapInfo, Quiesced), ClientError> {
        check_name_of("snapshot", snap)?;
        let info = self.image_info(pool, image)?;
        if info.data_pool.is_some_and(|data_pool| self.map().pools.get(&data_pool).is_some_and(|p| p.is_erasure())) {
            return Err(ClientError::Invalid(format!(
                "{image} keeps its data in an erasure-coded pool, whose objects take no snapshots yet"
            )));
        }
        let header = header_object(&info.id);
        let mut table = read_table(self, pool, &header)?;
        if table.find(snap).is_some() {
            return Err(ClientError::SnapshotExists(format!("{image}@{snap}")));
        }
        table.seq += 1;
        table.reach = table.reach.max(info.size);
        let created = SnapInfo { name: snap.into(), id: table.seq, size: info.size, created: now(), protected: false };
        table.snaps.push(created.clone());
        write_table(self, pool, &header, &table)?;
        // Every gateway quiesced (or was found dead): now they may go on
        // under the new sequence, none before another stopped.
        let (acknowledged, dropped) = crate::watch::wait_for_watchers(self, pool, &header, table.seq)?;
        crate::watch::release(self, pool, &header, table.seq)?;
        Ok((created, Quiesced { acknowledged, dropped }))
    }

    /// Protects a snapshot from removal (clones need their parent's), or
    /// lifts that.
    pub fn protect_snapshot(&self, pool: u32, image: &str, snap: &str, protect: bool) -> Result<(), ClientError> {
        let info = self.image_info(pool, image)?;
        let header = header_object(&info.id);
        let mut table = read_table(self, pool, &header)?;
        let entry = table
            .snaps
            .iter_mut()
            .find(|s| s.name == snap)
            .ok_or_else(|| ClientError::NoSuchSnapshot(format!("{image}@{snap}")))?;
        if !protect {
            let children = self.children_of(pool, image, snap)?;
            if !children.is_empty() {
                return Err(ClientError::Busy(format!(
                    "{image}@{snap} has {} clone(s) reading from it ({}): flatten or remove them first",
                    children.len(),
                    children.join(", ")
                )));
            }
        }
        entry.protected = protect;
        write_table(self, pool, &header, &table)
    }

    /// Removes a snapshot. The clones only it needed are trimmed by the
    /// OSDs in the background (`TrimSnaps` to every PG of the pool); if an
    /// OSD cannot, here, with `progress` getting (objects done, objects).
    /// Returns whether the trim went to the background.
    pub fn remove_snapshot(
        &self,
        pool: u32,
        image: &str,
        snap: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<bool, ClientError> {
        let info = self.image_info(pool, image)?;
        let header = header_object(&info.id);
        let mut table = read_table(self, pool, &header)?;
        let Some(at) = table.snaps.iter().position(|s| s.name == snap) else {
            return Err(ClientError::NoSuchSnapshot(format!("{image}@{snap}")));
        };
        if table.snaps[at].protected {
            return Err(ClientError::Invalid(format!(
                "{image}@{snap} is protected; unprotect it first (`duplex snap unprotect {image}@{snap}`)"
            )));
        }
        table.snaps.remove(at);
        // The table first: a crash before the trim leaves clones no
        // snapshot reads, which the next removal's trim finds (each trim
        // looks for every clone the live snapshots do not read).
        write_table(self, pool, &header, &table)?;
        match self.trim_in_background(pool, &info, &table) {
            Ok(()) => Ok(true),
            Err(err) => {
                tracing::warn!(%err, "the OSDs could not take the trim; trimming here");
                let objects = objects_ever(&info, &table, None);
                self.trim(pool, &info, &table, objects, progress).map(|()| false)
            }
        }
    }

    /// Asks every PG's primary to trim, in the background, the image's
    /// clones that no snapshot of `table` reads.
    fn trim_in_background(&self, pool: u32, info: &ImageInfo, table: &SnapTable) -> Result<(), ClientError> {
        let pg_num = self.map().pools.get(&pool).map(|p| p.pg_num).ok_or(ClientError::NoSuchPool(pool.to_string()))?;
        let live: Vec<u8> = table.snaps.iter().flat_map(|s| s.id.to_le_bytes()).collect();
        let (prefix, live) = (Bytes::from(format!("{}.", info.id)), Bytes::from(live));
        let ops = (0..pg_num)
            .map(|pg| ObjectOp {
                pg: Some(pg),
                data: live.clone(),
                ..ObjectOp::new(pool, OpKind::TrimSnaps, prefix.clone())
            })
            .collect();
        self.run_collect(ops).map(drop)
    }

    /// Deletes each object's clones that no live snapshot of `table` reads.
    pub(crate) fn trim(
        &self,
        pool: u32,
        info: &ImageInfo,
        table: &SnapTable,
        objects: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), ClientError> {
        let live: Vec<u64> = table.snaps.iter().map(|s| s.id).collect();
        let mut done = 0;
        for first in (0..objects).step_by(64) {
            let batch: Vec<u64> = (first..objects.min(first + 64)).collect();
            let lists = self.run_collect(
                batch.iter().map(|n| ObjectOp::new(pool, OpKind::ListSnaps, data_object(&info.id, *n))).collect(),
            )?;
            let mut trims = Vec::new();
            for (n, list) in batch.iter().zip(lists) {
                let list = SnapList::decode(&list).map_err(|e| ClientError::Corrupt(format!("snapshot list: {e}")))?;
                for clone in list.clones {
                    // The clone is what snapshots in (from, seq] read.
                    if !live.iter().any(|s| clone.from < *s && *s <= clone.seq) {
                        trims.push(ObjectOp {
                            offset: clone.seq,
                            ..ObjectOp::new(pool, OpKind::TrimClone, data_object(&info.id, *n))
                        });
                    }
                }
            }
            self.run_collect(trims)?;
            done += batch.len() as u64;
            progress(done, objects);
        }
        Ok(())
    }

    /// Where the image at snapshot `to` (None: now) differs from snapshot
    /// `from` (None: from an empty image), in image byte ranges, sorted.
    /// Found from the OSDs' block maps, reading no data.
    pub fn diff_image(
        &self,
        pool: u32,
        image: &str,
        from: Option<&str>,
        to: Option<&str>,
    ) -> Result<(u64, Vec<Extent>), ClientError> {
        let info = self.image_info(pool, image)?;
        let table = read_table(self, pool, &header_object(&info.id))?;
        let find = |name: &str| table.get(image, name).cloned();
        let from = from.map(find).transpose()?;
        let to = to.map(find).transpose()?;
        let (to_id, to_size) = to.as_ref().map_or((0, info.size), |s| (s.id, s.size));
        if let Some(from) = &from {
            if to.as_ref().is_some_and(|to| to.id < from.id) {
                return Err(ClientError::Invalid(format!(
                    "{image}@{} is newer than {image}@{}: a diff goes from the older snapshot",
                    from.name,
                    to.as_ref().map_or("", |t| t.name.as_str())
                )));
            }
        }
        let object_size = info.object_size as u64;
        let objects = to_size.div_ceil(object_size);
        let from_id = from.as_ref().map_or(0, |s| s.id);
        // A clone's object it does not hold reads its parent's bytes.
        let link = crate::layering::read_link(self, pool, &info.id)?;
        let through =
            |n: u64| link.as_ref().map_or(0, |link| link.overlap.saturating_sub(n * object_size).min(object_size));
        let diff_op = |n: u64, from: u64, to: u64| ObjectOp {
            offset: from,
            snap: to,
            ..ObjectOp::new(pool, OpKind::Diff, data_object(&info.id, n))
        };
        let mut extents = Vec::new();
        for first in (0..objects).step_by(64) {
            let batch: Vec<u64> = (first..objects.min(first + 64)).collect();
            let diffs = self.run_collect(batch.iter().map(|n| diff_op(*n, from_id, to_id)).collect())?;
            // Whether each of a clone's objects existed at `from` (a diff from
            // nothing says): if that differs from `to`, its bytes went from
            // its parent's to its own or back, and all of them count.
            let held_before: Vec<bool> = match (&link, from_id) {
                (Some(_), from_id) if from_id != 0 => self
                    .run_collect(batch.iter().map(|n| diff_op(*n, 0, from_id)).collect())?
                    .iter()
                    .map(|reply| SnapDiff::decode(reply).map(|d| d.exists))
                    .collect::<Result<_, _>>()
                    .map_err(|e| ClientError::Corrupt(format!("snapshot diff: {e}")))?,
                _ => vec![false; batch.len()],
            };
            for ((n, diff), held_before) in batch.iter().zip(diffs).zip(held_before) {
                let diff = SnapDiff::decode(&diff).map_err(|e| ClientError::Corrupt(format!("snapshot diff: {e}")))?;
                let base = n * object_size;
                let object_end = object_size.min(to_size - base);
                let parent_part = through(*n).min(object_end);
                // From nothing, an object it does not hold is its parent's bytes.
                let whole = parent_part > 0 && if from_id == 0 { !diff.exists } else { diff.exists != held_before };
                if whole {
                    extents.push(Extent { offset: base, len: parent_part, zero: false });
                }
                let skip_below = if whole { parent_part } else { 0 };
                for (offset, len) in diff.ranges {
                    let start = offset.max(skip_below).min(object_end);
                    let end = (offset + len).min(object_end);
                    if start < end {
                        // Past the object's end at `to` it reads as zeros.
                        let data_end = end.min(diff.size).max(start);
                        if data_end > start {
                            extents.push(Extent { offset: base + start, len: data_end - start, zero: !diff.exists });
                        }
                        if end > data_end {
                            extents.push(Extent { offset: base + data_end, len: end - data_end, zero: true });
                        }
                    }
                }
            }
        }
        Ok((to_size, merge(extents)))
    }

    /// Makes the image what it was at `snap`: copies back only the byte
    /// ranges that changed since (from the OSDs' block maps), deletes the
    /// objects made since, and sets the snapshot's size. The image must not
    /// be in use: gateways still renewing a watch make it refuse.
    pub fn rollback_snapshot(
        &self,
        pool: u32,
        image: &str,
        snap: &str,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(), ClientError> {
        let info = self.image_info(pool, image)?;
        let header = header_object(&info.id);
        let table = read_table(self, pool, &header)?;
        let target = table.get(image, snap)?.clone();
        let live = crate::watch::live_watchers(self, pool, &header)?;
        if live > 0 {
            return Err(ClientError::Busy(format!(
                "{image} is in use by {live} gateway(s) (an NBD server, a benchmark, an import): \
                 stop them before rolling it back"
            )));
        }
        let write_snap = table.newest_live();
        let object_size = info.object_size as u64;
        let objects = info.object_count().max(target.size.div_ceil(object_size));
        for first in (0..objects).step_by(64) {
            let batch: Vec<u64> = (first..objects.min(first + 64)).collect();
            // From the head back to the snapshot: what differs there.
            let diffs = self.run_collect(
                batch
                    .iter()
                    .map(|n| ObjectOp {
                        offset: target.id,
                        snap: 0,
                        ..ObjectOp::new(pool, OpKind::Diff, data_object(&info.id, *n))
                    })
                    .collect(),
            )?;
            let mut reads = Vec::new();
            let mut after = Vec::new();
            for (n, diff) in batch.iter().zip(diffs) {
                let diff = SnapDiff::decode(&diff).map_err(|e| ClientError::Corrupt(format!("snapshot diff: {e}")))?;
                if diff.ranges.is_empty() {
                    continue;
                }
                let object = data_object(&info.id, *n);
                // What the snapshot held of the object: its size (absent: delete).
                let at_snap =
                    self.call(ObjectOp { snap: target.id, ..ObjectOp::new(pool, OpKind::Stat, object.clone()) });
                let size = match at_snap {
                    Ok(stat) => {
                        duplex_proto::osd::ObjectStat::decode(&stat)
                            .map_err(|e| ClientError::Corrupt(format!("stat reply: {e}")))?
                            .size
                    }
                    Err(ClientError::NotFound) => {
                        after.push(ObjectOp { snap: write_snap, ..ObjectOp::new(pool, OpKind::Delete, object) });
                        continue;
                    }
                    Err(err) => return Err(err),
                };
                for (offset, len) in diff.ranges {
                    let end = (offset + len).min(size);
                    let mut at = offset;
                    while at < end {
                        let piece = (end - at).min(crate::image::MAX_WRITE_PIECE);
                        reads.push((
                            object.clone(),
                            at,
                            ObjectOp {
                                offset: at,
                                length: piece as u32,
                                snap: target.id,
                                ..ObjectOp::new(pool, OpKind::Read, object.clone())
                            },
                        ));
                        at += piece;
                    }
                }
                after.push(ObjectOp {
                    offset: size,
                    snap: write_snap,
                    ..ObjectOp::new(pool, OpKind::Truncate, object)
                });
            }
            let data = self.run_collect(reads.iter().map(|(_, _, op)| op.clone()).collect())?;
            let writes = reads
                .into_iter()
                .zip(data)
                .map(|((object, at, _), bytes)| ObjectOp {
                    offset: at,
                    data: bytes,
                    snap: write_snap,
                    ..ObjectOp::new(pool, OpKind::Write, object)
                })
                .collect();
            self.run_collect(writes)?;
            self.run_collect(after)?;
            progress(first + batch.len() as u64, objects);
        }
        if info.size != target.size {
            self.set_image_size(pool, &info, target.size)?;
        }
        Ok(())
    }

    /// Runs `ops`, 64 in flight, and returns their replies in order; the
    /// first error wins. A read or stat of an absent object answers empty.
    pub(crate) fn run_collect(&self, ops: Vec<ObjectOp>) -> Result<Vec<Bytes>, ClientError> {
        let (tx, rx) = std::sync::mpsc::channel();
        let count = ops.len();
        let mut results: Vec<Option<Result<Bytes, ClientError>>> = (0..count).map(|_| None).collect();
        let mut ops = ops.into_iter().enumerate();
        let mut in_flight = 0;
        let mut received = 0;
        while received < count {
            while in_flight < 64 {
                let Some((i, op)) = ops.next() else { break };
                let kind = op.kind;
                let tx = tx.clone();
                self.submit(
                    op,
                    Box::new(move |result| {
                        let result = match result {
                            Err(ClientError::NotFound)
                                if matches!(kind, OpKind::Read | OpKind::Delete | OpKind::TrimClone) =>
                            {
                                Ok(Bytes::new())
                            }
                            other => other,
                        };
                        let _ = tx.send((i, result));
                    }),
                );
                in_flight += 1;
            }
            let (i, result) = rx.recv().map_err(|_| ClientError::Shutdown)?;
            in_flight -= 1;
            received += 1;
            results[i] = Some(result);
        }
        results.into_iter().map(|r| r.expect("every op answered")).collect()
    }
}

/// Objects the image has had at any size it or a snapshot of it had.
pub(crate) fn objects_ever(info: &ImageInfo, table: &SnapTable, removed: Option<&SnapInfo>) -> u64 {
    let sizes = table.snaps.iter().chain(removed).map(|s| s.size).chain([info.size, table.reach]);
    sizes.map(|size| size.div_ceil(info.object_size as u64)).max().unwrap_or(0)
}

/// Sorted extents with touching ones of the same kind joined.
fn merge(mut extents: Vec<Extent>) -> Vec<Extent> {
    extents.sort_by_key(|e| e.offset);
    let mut out: Vec<Extent> = Vec::with_capacity(extents.len());
    for extent in extents {
        match out.last_mut() {
            Some(last) if last.offset + last.len == extent.offset && last.zero == extent.zero => last.len += extent.len,
            _ => out.push(extent),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn tables_round_trip_and_reject_damage(
            names in proptest::collection::btree_set("[a-z0-9._-]{1,20}", 0..12),
            flip in any::<usize>(),
        ) {
            let snaps: Vec<SnapInfo> = names.into_iter().enumerate().map(|(i, name)| SnapInfo {
                name, id: 2 * i as u64 + 1, size: 1 << 30, created: 7, protected: i % 2 == 0,
            }).collect();
            let table = SnapTable { seq: 2 * snaps.len() as u64 + 3, reach: 3 << 30, snaps };
            let bytes = table.encode();
            prop_assert_eq!(SnapTable::decode(&bytes), Ok(table.clone()));
            let mut bad = bytes.to_vec();
            bad[flip % bytes.len()] ^= 0x20;
            prop_assert_ne!(SnapTable::decode(&bad), Ok(table));
        }

        #[test]
        fn the_table_decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = SnapTable::decode(&bytes);
        }
    }

    #[test]
    fn no_table_is_an_empty_one_and_writes_follow_the_newest_live_snapshot() {
        assert_eq!(SnapTable::decode(&[]), Ok(SnapTable::default()));
        assert_eq!(SnapTable::decode(&[0u8; 64]), Ok(SnapTable::default()));
        let snap = |name: &str, id| SnapInfo { name: name.into(), id, size: 1, created: 1, protected: false };
        let table = SnapTable { seq: 9, reach: 1, snaps: vec![snap("a", 3), snap("b", 7)] };
        assert_eq!(table.newest_live(), 7);
        assert_eq!(SnapTable::default().newest_live(), 0);
    }

    /// Tables written before `reach` read with the reach of their
    /// snapshots; a snapshot past the reach is damage.
    #[test]
    fn a_version_1_table_reads_with_its_snapshots_reach() {
        let mut v1 = Vec::new();
        v1.extend_from_slice(TABLE_MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&4u64.to_le_bytes());
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.push(3);
        v1.extend_from_slice(b"mon");
        for word in [2u64, 5 << 30, 99] {
            v1.extend_from_slice(&word.to_le_bytes());
        }
        v1.push(0);
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        let table = SnapTable::decode(&v1).unwrap();
        assert_eq!((table.seq, table.reach, table.snaps.len()), (4, 5 << 30, 1));
        let short = SnapTable { reach: 1 << 30, ..table };
        assert_eq!(SnapTable::decode(&short.encode()), Err("a snapshot larger than the table's reach".into()));
    }

    #[test]
    fn extents_merge_only_when_touching_and_alike() {
        let e = |offset, len, zero| Extent { offset, len, zero };
        assert_eq!(
            merge(vec![e(8, 4, false), e(0, 4, false), e(4, 4, false), e(12, 4, true), e(20, 1, true)]),
            vec![e(0, 12, false), e(12, 4, true), e(20, 1, true)]
        );
    }
}
