//! A PG member's side of peering and recovery: what the flusher (the one
//! thread that owns the store partition) does when the PG's primary asks
//! ([`duplex_proto::peering`]). The primary's own member side runs here
//! too, asked by its peering thread.

use std::collections::BTreeSet;

use duplex_proto::osd::Status;
use duplex_proto::peering::{
    LoggedRequest, ObjectDigest, ObjectMeta, PeerInfo, PeerOp, PeerReply, PeerRequest, CHUNK_BYTES, DIGEST_PAGE,
};
use duplex_store::{Batch, Key, StoreError};

use crate::flusher::Flusher;
use crate::messages::Completion;
use crate::pg::elide::owed_before_lock;
use crate::pg::{stored_interval, stored_requests};
use crate::pg::{Ack, Activation, SharedPg, StagedCopy};

impl Flusher {
    /// Does one peering step for the PG's primary and says how it went.
    pub fn peer_request(&mut self, request: PeerRequest) -> PeerReply {
        let PeerRequest { pg: key, interval, op } = request;
        let pg = match self.pgs.get_or_open(key) {
            Ok(pg) => pg,
            Err(err) => return PeerReply::Refused(err.to_string()),
        };
        {
            let mut guard = pg.lock().expect("PG lock");
            if interval < guard.asked_interval {
                return PeerReply::Refused(format!(
                    "interval {interval} is older than {} (another primary took over)",
                    guard.asked_interval
                ));
            }
            if let PeerOp::Query = op {
                let dropped = guard.fence(interval);
                drop(guard);
                self.refuse_entries(key, dropped);
                // Fences are rare (one per PG and interval): every thread looks.
                for mailbox in &self.mailboxes {
                    mailbox.post_and_wake(Completion::Fenced);
                }
            } else if interval > guard.asked_interval {
                return PeerReply::Refused(format!("interval {interval} was never queried here"));
            }
        }
        self.peer_step(&pg, key, interval, op).unwrap_or_else(PeerReply::Refused)
    }

    fn peer_step(&mut self, pg: &SharedPg, key: u32, interval: u64, op: PeerOp) -> Result<PeerReply, String> {
        match op {
            PeerOp::Query => self.query(key),
            PeerOp::Touched { after, after_epoch, through } => {
                Ok(PeerReply::Touched(pg.lock().expect("PG lock").touched(after, after_epoch, through)))
            }
            PeerOp::Digests { cursor } => self.digests(key, &cursor),
            PeerOp::Stat { object } => {
                // A backfill target compares its copy under the primary's
                // lock: the writes it logged before must count.
                self.flush_pg(key)?;
                self.stat(key, &object)
            }
            PeerOp::ChunkDigest { object, offset, len } => {
                self.flush_pg(key)?;
                let key = Key::in_group(key, &object).map_err(|e| e.to_string())?;
                let len = len.min(CHUNK_BYTES) as u64;
                match self.partition.read(key.as_bytes(), offset, len) {
                    Ok(data) => Ok(PeerReply::ChunkDigest(Some(crc32c::crc32c(&data)))),
                    // Either way the primary's chunk replaces it.
                    Err(StoreError::NotFound | StoreError::ChecksumMismatch { .. }) => Ok(PeerReply::ChunkDigest(None)),
                    Err(err) => Err(err.to_string()),
                }
            }
            PeerOp::Pull { object, offset, len } => {
                let held = self.held_entries(key, &object);
                let store_key = Key::in_group(key, &object).map_err(|e| e.to_string())?;
                let len = len.min(CHUNK_BYTES) as u64;
                let read = self.partition.read(store_key.as_bytes(), offset, len);
                let read = if held.is_empty() {
                    read
                } else {
                    // As the store would read it once they apply (held.rs).
                    let size = self.held_meta(key, &object, &held)?.map_or(0, |meta| meta.size);
                    crate::flusher::overlay_held(read, offset, len, &held).map(|mut bytes| {
                        bytes.truncate(size.saturating_sub(offset) as usize);
                        bytes
                    })
                };
                match read {
                    Ok(data) => Ok(PeerReply::Data(data)),
                    Err(err @ StoreError::ChecksumMismatch { .. }) => {
                        self.metrics.damaged_objects.add(1);
                        Ok(PeerReply::Damaged(err.to_string()))
                    }
                    Err(err) => Err(err.to_string()),
                }
            }
            PeerOp::PushStart { object, size, preallocated, attrs, omap } => {
                // A backfill target takes writes while it is filled: those
                // its log holds for this object are older than the copy, and
                // must land before it, not after.
                self.flush_pg(key)?;
                let key = Key::in_group(key, &object).map_err(|e| e.to_string())?;
                let mut batch = Batch::new();
                batch.delete(key.clone());
                if preallocated {
                    batch.create_preallocated(key.clone(), size);
                } else {
                    batch.truncate(key.clone(), size);
                }
                for (name, value) in attrs {
                    batch.set_attr(key.clone(), name, value);
                }
                if !omap.is_empty() {
                    batch.omap_set(key.clone(), omap);
                }
                self.apply_recovery(&batch)
            }
            PeerOp::PushData { object, offset, data } => {
                self.flush_pg(key)?;
                let key = Key::in_group(key, &object).map_err(|e| e.to_string())?;
                let mut batch = Batch::new();
                batch.write(key, offset, data);
                self.apply_recovery(&batch)
            }
            PeerOp::Remove { object } => {
                self.flush_pg(key)?;
                let key = Key::in_group(key, &object).map_err(|e| e.to_string())?;
                let mut batch = Batch::new();
                batch.delete(key);
                self.apply_recovery(&batch)
            }
            PeerOp::Stage { object, offset, data } => stage(pg, interval, object, offset, data),
            PeerOp::ObjectRequests { object } => {
                Ok(PeerReply::Requests(pg.lock().expect("PG lock").requests_touching(&object)))
            }
            PeerOp::Install { object, meta, staged_bytes, requests, authority_seq } => {
                self.install(pg, key, interval, object, meta, staged_bytes, requests, authority_seq)
            }
            PeerOp::Scrub { .. } => Err("a scrub is asked of the PG's primary, not of a member's store".into()),
            PeerOp::Activate { last_seq, last_epoch, members, rebuilt, requests, backfill } => {
                // Members may be among them (filled in the background, see
                // `Peering::fill_in_background`), but never the primary.
                // (An erasure-coded PG's are positional: its primary is the
                // first position with an OSD.)
                if duplex_map::primary_of(&members).is_none_or(|primary| backfill.contains(&primary)) {
                    return Err(format!("backfill targets {backfill:?} include the primary of {members:?}"));
                }
                let target = backfill.contains(&self.id);
                // Also when its walk's join activates it again (pg/elide.rs),
                // though this interval marked it already: a late join's
                // activation then never leaves a copy marked complete.
                if target {
                    self.begin_backfill(key)?;
                }
                {
                    // Level members hold every entry through `last_seq`:
                    // an erasure-coded tail held back until now is applied.
                    let mut guard = pg.lock().expect("PG lock");
                    if guard.last_seq() == last_seq && guard.apply_limit < last_seq {
                        guard.apply_limit = last_seq;
                        drop(guard);
                        self.flush_pg(key)?;
                    }
                }
                let replaced = {
                    let mut guard = pg.lock().expect("PG lock");
                    if last_seq == u64::MAX {
                        return Err("no log continues after seq 2^64 - 1".to_string());
                    } else if !guard.log.is_empty() {
                        return Err("the log took entries while peering".to_string());
                    }
                    let activation = Activation { interval, members, backfill };
                    // Writes ahead of the backfill's walk go without data (pg/elide.rs).
                    let elided_to = activation.elided_targets(self.id);
                    let replaced = guard
                        .activate(last_seq, last_epoch, activation, rebuilt || target, &requests)
                        .map_err(|e| e.to_string())?;
                    guard.elide = crate::pg::elide::Elide::new(elided_to);
                    replaced
                };
                if !target {
                    // The store too, which outlives an `shm` log (stored_interval.rs).
                    // A member activated by peering holds the whole PG, even
                    // if it was an unfinished backfill target before.
                    let index = self.partition.index();
                    let mut batch = Batch::new();
                    batch.push(stored_interval::record(index, key, interval));
                    batch.push(stored_interval::mark_backfilling(index, key, false));
                    // Its position and ids are the authority's now.
                    batch.push(stored_interval::mark_recovered(index, key, false));
                    if replaced {
                        // Its own history's ids are not the PG's any more.
                        batch.push(stored_requests::rewrite(index, key, &requests));
                    }
                    self.apply(&batch).map_err(|e| e.to_string())?;
                }
                Ok(PeerReply::Done)
            }
            PeerOp::Settle { to, replaced } => {
                if replaced {
                    // Its log's end is no longer what its store holds once
                    // it applies entries the others may roll back, and the
                    // rebuild may stop before it compared every object:
                    // marked first, so that no crash comes between.
                    let mut batch = Batch::new();
                    batch.push(stored_interval::mark_recovered(self.partition.index(), key, true));
                    self.apply(&batch).map_err(|e| e.to_string())?;
                }
                let dropped = pg.lock().expect("PG lock").settle(to)?;
                if dropped > 0 {
                    tracing::warn!(
                        pg = key,
                        to,
                        dropped,
                        "rolled back erasure-coded entries fewer than k shards logged"
                    );
                }
                self.flush_pg(key)?;
                Ok(PeerReply::Done)
            }
            PeerOp::BackfillJoin { targets } => self.backfill_join(pg, key, interval, &targets),
            PeerOp::BackfillJoined => {
                let mut guard = pg.lock().expect("PG lock");
                if guard.active.as_ref().is_none_or(|a| a.interval != interval) {
                    return Err(format!("the PG is not active in interval {interval} here"));
                }
                if !guard.elide.as_mut().is_some_and(|elide| elide.finish_join()) {
                    return Err("no join of backfill targets is under way (its hold expired)".into());
                }
                debug_assert!(
                    guard.elide.as_ref().is_some_and(|elide| !elide.joined().is_empty()),
                    "a join ended with no target joined"
                );
                Ok(PeerReply::Done)
            }
            PeerOp::List { cursor } => self.list_names(key, &cursor),
            PeerOp::BackfillLock { object, start, end } => self.backfill_lock(pg, key, interval, object, start, end),
            PeerOp::BackfillDone => {
                let is_target = |guard: &crate::pg::Pg| {
                    guard.active.as_ref().is_some_and(|a| a.interval == interval && a.backfill.contains(&self.id))
                };
                if !is_target(&pg.lock().expect("PG lock")) {
                    return Err(format!("this OSD is no backfill target of the PG in interval {interval}"));
                }
                // Complete now: it records the interval like any member, and
                // the ids it was given at activation or logged since.
                let requests = pg.lock().expect("PG lock").flushed_ids();
                let index = self.partition.index();
                let mut batch = Batch::new();
                batch.push(stored_interval::record(index, key, interval));
                batch.push(stored_interval::mark_backfilling(index, key, false));
                batch.push(stored_interval::mark_recovered(index, key, false));
                batch.push(stored_requests::rewrite(index, key, &requests));
                self.apply(&batch).map_err(|e| e.to_string())?;
                tracing::info!(pg = key, interval, "backfill into this OSD complete");
                Ok(PeerReply::Done)
            }
        }
    }

    /// Applies the PG's log to the store now (nothing to do when empty).
    fn flush_pg(&mut self, key: u32) -> Result<(), String> {
        let pending = self.pgs.get(key).is_some_and(|pg| !pg.lock().expect("PG lock").log.is_empty());
        if pending {
            self.flush(BTreeSet::from([key])).map_err(|_| "flushing the log to the store failed".to_string())?;
        }
        Ok(())
    }

    /// A backfill into this OSD begins: its copy of the PG is marked
    /// incomplete, durably, before it takes any entry. What it held stays:
    /// the primary compares each object with it, copies what differs and
    /// removes what it lacks, so an OSD that held most of the PG (marked
    /// back in, or a backfill begun again in a new interval) reads it
    /// rather than receiving it all again. Until then it is never trusted.
    fn begin_backfill(&mut self, key: u32) -> Result<(), String> {
        let index = self.partition.index();
        let mut mark = Batch::new();
        mark.push(stored_interval::mark_backfilling(index, key, true));
        self.apply(&mark).map_err(|e| e.to_string())?;
        tracing::info!(pg = key, "backfill into this OSD begins; its copy of the PG is incomplete until it ends");
        Ok(())
    }

    /// The primary's side of a walk's join of its dormant targets
    /// (`PeerOp::BackfillJoin`, crate::pg::elide): holds the PG's client
    /// writes, and once none is in flight and the log is in the store (the
    /// walk lists the store: an object only the log created would be in no
    /// listing, and the targets never got its writes), answers with the
    /// seq and ids they are activated at again. The log goes to the store
    /// before the hold too, which then waits only for what came since.
    fn backfill_join(&mut self, pg: &SharedPg, key: u32, interval: u64, asked: &[u32]) -> Result<PeerReply, String> {
        let dormant = pg.lock().expect("PG lock").elide.as_ref().map_or_else(Vec::new, |e| e.dormant_among(asked));
        if !dormant.is_empty() {
            self.flush_pg(key)?;
        }
        let mut guard = pg.lock().expect("PG lock");
        let Some(active) = guard.active.as_ref().filter(|a| a.interval == interval) else {
            return Err(format!("the PG is not active in interval {interval} here"));
        };
        let (members, backfill) = (active.members.clone(), active.backfill.clone());
        let targets = guard.elide.as_mut().map_or_else(Vec::new, |elide| elide.begin_join(asked));
        if !targets.is_empty() {
            if !guard.uncommitted.is_empty() || guard.lag.unreplicated() > 0 {
                // Held from now on; those in flight end soon.
                return Ok(PeerReply::Busy);
            }
            if guard.has_applicable_entries() {
                // Held, the log only shrinks meanwhile. (Entries held back
                // are listed from the log: held.rs.)
                drop(guard);
                self.flush_pg(key)?;
                guard = pg.lock().expect("PG lock");
                let held = guard.elide.as_ref().is_some_and(|elide| elide.is_joining(&targets));
                if !held || guard.has_applicable_entries() {
                    // The hold ended meanwhile: start again.
                    return Ok(PeerReply::Busy);
                }
            }
        }
        debug_assert!(
            targets.iter().all(|t| backfill.contains(t) && !members.contains(t)),
            "dormant targets {targets:?} that are not outside targets of {members:?}"
        );
        debug_assert!(
            targets.is_empty() || guard.uncommitted.is_empty(),
            "a write in flight as the join's seq is taken"
        );
        Ok(PeerReply::Join {
            targets,
            last_seq: guard.last_seq(),
            last_epoch: guard.log.last_epoch(),
            members,
            backfill,
            requests: guard.requests.logged(),
        })
    }

    /// The primary's side of copying one object to the backfill targets.
    fn backfill_lock(
        &mut self,
        pg: &SharedPg,
        key: u32,
        interval: u64,
        object: Option<Vec<u8>>,
        start: u64,
        end: u64,
    ) -> Result<PeerReply, String> {
        let flush_first = {
            let mut guard = pg.lock().expect("PG lock");
            if guard.active.as_ref().is_none_or(|a| a.interval != interval) {
                return Err(format!("the PG is not active in interval {interval} here"));
            }
            // The walk steps onto an object, or ends: not before it visited
            // the objects it owes for elided writes (pg/elide.rs).
            if let Some(objects) = owed_before_lock(&mut guard.elide, object.as_deref(), start, end) {
                guard.backfill_lock = None;
                return Ok(PeerReply::Names { objects, more: false });
            }
            guard.backfill_lock = object.as_ref().map(|o| (bytes::Bytes::copy_from_slice(o), start, end));
            let Some(object) = &object else { return Ok(PeerReply::Done) };
            // (An eventual PG's writes acknowledged early are in flight too.)
            if guard.uncommitted.touches(object, start, end) || guard.lag.touches(object, start, end) {
                // New writes to it wait now; those in flight end soon.
                return Ok(PeerReply::Busy);
            }
            guard.index.contains(object)
        };
        let object = object.expect("None returned above");
        if flush_first {
            self.flush_pg(key)?;
        }
        self.stat(key, &object)
    }

    /// A page of the PG's store keys strictly after `cursor` (an object
    /// name), and whether more follow.
    fn page_after(&self, key: u32, cursor: &[u8]) -> (Vec<Key>, bool) {
        let group = key.to_be_bytes();
        let mut start = [&group[..], cursor].concat();
        if !cursor.is_empty() {
            start.push(0); // strictly after the cursor
        }
        let end = key.checked_add(1).map(u32::to_be_bytes);
        let mut keys = self.partition.list(&start, end.as_ref().map(|e| &e[..]), DIGEST_PAGE + 1);
        debug_assert!(keys.iter().all(|k| k.as_bytes().starts_with(&group)), "a page strayed out of its PG");
        let more = keys.len() > DIGEST_PAGE;
        keys.truncate(DIGEST_PAGE);
        (keys, more)
    }

    /// A page of the PG's object names after `cursor`: the store's, and
    /// those only entries its log holds back create (held.rs). A name whose
    /// held entries delete it stays listed: its stat says it is absent.
    fn list_names(&mut self, key: u32, cursor: &[u8]) -> Result<PeerReply, String> {
        let (keys, more) = self.page_after(key, cursor);
        let mut objects: Vec<Vec<u8>> = keys.iter().map(|k| k.as_bytes()[4..].to_vec()).collect();
        let held: Vec<Vec<u8>> = self.pgs.get(key).map_or_else(Vec::new, |pg| {
            let guard = pg.lock().expect("PG lock");
            if guard.holds_back {
                guard.index.objects().map(<[u8]>::to_vec).collect()
            } else {
                Vec::new()
            }
        });
        if !held.is_empty() {
            // Within this page's span: after the cursor, and up to its last
            // name unless it is the last page.
            let last = more.then(|| objects.last().cloned()).flatten();
            let within = |name: &Vec<u8>| {
                (cursor.is_empty() || name[..] > *cursor) && last.as_ref().is_none_or(|last| name <= last)
            };
            objects.extend(held.into_iter().filter(within));
            objects.sort_unstable();
            objects.dedup();
        }
        Ok(PeerReply::Names { objects, more })
    }

    /// Answers `Retry` to replicated entries a fence dropped.
    fn refuse_entries(&self, pg: u32, dropped: Vec<Ack>) {
        for ack in dropped {
            debug_assert!(ack.to.thread < self.mailboxes.len(), "an ack for thread {}", ack.to.thread);
            self.mailboxes[ack.to.thread].post_and_wake(Completion::ack(ack, pg, Status::Retry));
        }
    }

    /// Applies the log to the store (keeping nothing back), then reports.
    fn query(&mut self, key: u32) -> Result<PeerReply, String> {
        self.flush(BTreeSet::from([key])).map_err(|_| "flushing the log to the store failed".to_string())?;
        let pg = self.pgs.get(key).ok_or("the PG vanished")?;
        let stored = stored_interval::read(&mut self.partition, key).map_err(|e| e.to_string())?;
        let mut guard = pg.lock().expect("PG lock");
        // An erasure-coded tail past the apply limit stays (Pg::apply_limit).
        if guard.has_applicable_entries() {
            return Err("the log could not be flushed (a damaged entry?)".into());
        }
        if stored_interval::backfilling(&mut self.partition, key).map_err(|e| e.to_string())? {
            // Filled only in part: it lacks objects, so it is never level
            // with a member, nor the authority over one.
            tracing::info!(pg = key, "this OSD's copy of the PG is an unfinished backfill");
            let info = PeerInfo {
                last_seq: 0,
                last_epoch: 0,
                last_active: 0,
                history_from: 1,
                backfilling: true,
                position_lost: false,
                log_lost: false,
            };
            return Ok(PeerReply::Info { info, requests: Vec::new() });
        }
        let mut info = PeerInfo {
            last_seq: guard.last_seq(),
            last_epoch: guard.log.last_epoch(),
            last_active: guard.log.last_active(),
            history_from: guard.history_from(),
            backfilling: false,
            position_lost: false,
            log_lost: false,
        };
        debug_assert!(info.history_from <= info.last_seq + 1, "the history starts past the log's end");
        // Where this member's history ends, as far as it knows.
        let mut end = info.last_seq;
        // Its store holds writes its log cannot place: a lost log, or a
        // recovery no activation ended.
        let mut unknown = false;
        if stored > info.last_active {
            // The log was lost (a power loss took the `shm` log): this copy
            // is of the store's interval, at a position no one knows
            // (stored_interval.rs says why that is safe).
            tracing::info!(
                pg = key,
                interval = stored,
                "the PG log was lost; reporting the interval the store recorded"
            );
            info = PeerInfo { last_seq: 0, last_epoch: 0, last_active: stored, log_lost: true, ..info };
            end = u64::MAX;
            unknown = true;
        }
        if stored_interval::recovered(&mut self.partition, key).map_err(|e| e.to_string())? {
            // A recovery that no activation ended changed this copy: its
            // store holds its own history plus objects copied from the
            // authority of that peering, with the ids of what they show
            // (their seqs lie past the log's end).
            tracing::info!(pg = key, "a recovery that no activation ended changed this copy");
            end = u64::MAX;
            unknown = true;
        }
        // A PG this OSD had no log of at start (an `shm` log lost with the
        // power) learns here what its store's record kept.
        guard.load_stored_ids(&mut self.partition, end).map_err(|e| e.to_string())?;
        let requests = guard.requests.logged();
        if unknown {
            // Its position is unknown (epoch 0: never level with anyone, so
            // it is compared when it is not the authority, and a member of
            // its interval that kept its log wins over it), but it is past
            // every seq it holds an id of: as the authority, its interval
            // continues after them and never reuses one. A reused seq would
            // displace the id of a write its store shows, and the client's
            // resend of that write would run again (simulator seeds 20420
            // and 20869). No history can be recovered from it.
            let last_seq = requests.iter().map(|r| r.seq).max().unwrap_or(0).max(info.last_seq);
            let history_from = last_seq.saturating_add(1);
            info = PeerInfo { last_seq, last_epoch: 0, history_from, position_lost: true, ..info };
        }
        tracing::debug!(pg = key, ?info, ids = requests.len(), newest_ids = ?&requests[requests.len().saturating_sub(3)..], "queried");
        Ok(PeerReply::Info { info, requests })
    }

    fn digests(&mut self, key: u32, cursor: &[u8]) -> Result<PeerReply, String> {
        let (keys, more) = self.page_after(key, cursor);
        let mut objects = Vec::with_capacity(keys.len());
        for store_key in &keys {
            let digest = match self.digest(store_key.as_bytes()) {
                Ok(digest) => Some(digest),
                Err(err @ StoreError::ChecksumMismatch { .. }) => {
                    tracing::error!(pg = key, %err, "an object's copy here is damaged");
                    self.metrics.damaged_objects.add(1);
                    None
                }
                Err(err) => return Err(err.to_string()),
            };
            objects.push(ObjectDigest { object: store_key.as_bytes()[4..].to_vec(), digest });
        }
        Ok(PeerReply::Digests { objects, more })
    }

    /// crc32c over the size, the data (holes read as zeros), the attributes
    /// and the omap (when it has entries: so that the digests of objects
    /// without one are those from before omaps).
    fn digest(&mut self, key: &[u8]) -> Result<u32, StoreError> {
        let info = self.partition.stat(key)?;
        // What the next page pays for in the scrub class (device.rs).
        self.scrub_read_bytes += info.size;
        let mut crc = crc32c::crc32c(&info.size.to_le_bytes());
        let mut offset = 0;
        while offset < info.size {
            let len = (info.size - offset).min(CHUNK_BYTES as u64);
            let data = self.partition.read(key, offset, len)?;
            crc = crc32c::crc32c_append(crc, &data);
            offset += len;
        }
        let (attrs, omap) = self.partition.attrs_and_omap(key)?;
        for (name, value) in attrs {
            crc = crc32c::crc32c_append(crc, &(name.len() as u32).to_le_bytes());
            crc = crc32c::crc32c_append(crc, &name);
            crc = crc32c::crc32c_append(crc, &(value.len() as u32).to_le_bytes());
            crc = crc32c::crc32c_append(crc, &value);
        }
        if !omap.is_empty() {
            crc = crc32c::crc32c_append(crc, b"\0omap");
            crc = crc32c::crc32c_append(crc, &duplex_proto::omap::encode_entries(&omap));
        }
        Ok(crc)
    }

    fn stat(&mut self, key: u32, object: &[u8]) -> Result<PeerReply, String> {
        let held = self.held_entries(key, object);
        Ok(PeerReply::Meta(self.held_meta(key, object, &held)?))
    }

    /// An object's metadata in the store, with `held` (its entries the log
    /// holds back) on top (held.rs).
    fn held_meta(
        &mut self,
        key: u32,
        object: &[u8],
        held: &[duplex_oplog::Entry],
    ) -> Result<Option<ObjectMeta>, String> {
        let key = Key::in_group(key, object).map_err(|e| e.to_string())?;
        let stored = match self.partition.stat(key.as_bytes()) {
            Ok(info) => {
                let (attrs, omap) = self.partition.attrs_and_omap(key.as_bytes()).map_err(|e| e.to_string())?;
                Some(ObjectMeta { size: info.size, preallocated: info.preallocated, attrs, omap })
            }
            Err(StoreError::NotFound) => None,
            Err(err) => return Err(err.to_string()),
        };
        Ok(crate::flusher::held::meta_after(stored, held))
    }

    /// Peering's recovery: replaces `object` whole, in one store batch,
    /// with what was staged for it (`meta` None: removes it), takes the ids
    /// of the mutations the copy carries, and marks the copy as changed by
    /// a recovery no activation ended (stored_interval.rs, `recovered`). A
    /// peering cut short between two objects so leaves each object either
    /// as it was or as the authority's, with the ids of what it shows.
    #[allow(clippy::too_many_arguments)]
    fn install(
        &mut self,
        pg: &SharedPg,
        key: u32,
        interval: u64,
        object: Vec<u8>,
        meta: Option<ObjectMeta>,
        staged_bytes: u64,
        requests: Vec<LoggedRequest>,
        authority_seq: u64,
    ) -> Result<PeerReply, String> {
        if requests.len() > crate::pg::requests::TRACKED_REQUESTS {
            return Err(format!("{} request ids for one object", requests.len()));
        }
        let mut requests = requests;
        if requests.iter().any(|r| r.seq > authority_seq) {
            // (A scrub's repair may copy from a member past the authority:
            // its ids past the history are not the history's.)
            tracing::warn!(pg = key, authority_seq, "ids past the authority's history came with a copy; not taken");
            requests.retain(|r| r.seq <= authority_seq);
        }
        self.flush_pg(key)?;
        let index = self.partition.index();
        // This member's own ids past the authority's history name writes
        // that history does not hold: a copy installed here may overwrite
        // their effects, so none of them may be answered as applied, here
        // or by this copy as a later authority (were this recovery cut
        // short). Forgotten in the store's record, in the install's batch,
        // and in the table (simulator seed 500221: an authority whose
        // copy a cut-short recovery had rolled back answered a resend of
        // a write it no longer held as done).
        // (Once per interval and history: the record is read whole.)
        let purged = pg.lock().expect("PG lock").ids_purged_past;
        let (forget, kept) = if purged == Some((interval, authority_seq)) {
            (false, Vec::new())
        } else {
            let stored = stored_requests::read(&mut self.partition, key).map_err(|e| e.to_string())?;
            let forget = stored.iter().any(|r| r.seq > authority_seq);
            (forget, stored.into_iter().filter(|r| r.seq <= authority_seq).collect::<Vec<LoggedRequest>>())
        };
        let (staged, id_ops) = {
            let mut guard = pg.lock().expect("PG lock");
            let staged = guard.staged.take_if(|s| s.interval == interval && s.object == object).unwrap_or_default();
            (staged, guard.installed_ids_ops(index, &requests))
        };
        debug_assert_eq!(
            staged.chunks.iter().map(|(_, data)| data.len() as u64).sum::<u64>(),
            staged.bytes,
            "the staged byte count is not what the chunks hold"
        );
        if staged.bytes != staged_bytes {
            return Err(format!(
                "{} bytes of the object were staged here, {staged_bytes} sent: a chunk was lost",
                staged.bytes
            ));
        }
        let store_key = Key::in_group(key, &object).map_err(|e| e.to_string())?;
        let mut batch = Batch::new();
        batch.delete(store_key.clone());
        match &meta {
            Some(meta) => {
                if meta.preallocated {
                    batch.create_preallocated(store_key.clone(), meta.size);
                } else {
                    batch.truncate(store_key.clone(), meta.size);
                }
                for (name, value) in &meta.attrs {
                    batch.set_attr(store_key.clone(), name.clone(), value.clone());
                }
                if !meta.omap.is_empty() {
                    batch.omap_set(store_key.clone(), meta.omap.clone());
                }
                for (offset, data) in staged.chunks {
                    if offset.saturating_add(data.len() as u64) > meta.size {
                        return Err(format!("a staged chunk at {offset} lies past the object's end ({})", meta.size));
                    }
                    batch.write(store_key.clone(), offset, data);
                }
            }
            None if staged.bytes > 0 => return Err("bytes were staged for an object to remove".into()),
            None => {}
        }
        if forget {
            batch.push(stored_requests::rewrite(index, key, &kept));
        }
        for op in id_ops {
            batch.push(op);
        }
        batch.push(stored_interval::mark_recovered(index, key, true));
        let reply = self.apply_recovery(&batch)?;
        tracing::debug!(
            pg = key,
            object = %String::from_utf8_lossy(&object),
            removed = meta.is_none(),
            ids = requests.len(),
            "installed an object peering's recovery copied"
        );
        let mut guard = pg.lock().expect("PG lock");
        guard.requests.forget_after(authority_seq);
        guard.ids_purged_past = Some((interval, authority_seq));
        guard.take_installed_ids(&requests);
        debug_assert!(
            guard.requests.logged().iter().all(|r| r.seq <= authority_seq),
            "an id past the authority's kept"
        );
        Ok(reply)
    }

    fn apply_recovery(&mut self, batch: &Batch) -> Result<PeerReply, String> {
        self.apply(batch).map_err(|e| e.to_string())?;
        self.metrics.recovery_ops.add(1);
        Ok(PeerReply::Done)
    }
}

/// Peering's recovery: keeps one chunk of the object being copied to this
/// member in memory, for [`PeerOp::Install`]. A chunk of another object
/// (or interval) starts the staging over: one copy at a time per PG.
fn stage(pg: &SharedPg, interval: u64, object: Vec<u8>, offset: u64, data: Vec<u8>) -> Result<PeerReply, String> {
    if data.len() > CHUNK_BYTES as usize || offset.saturating_add(data.len() as u64) > duplex_store::MAX_OBJECT_SIZE {
        return Err(format!("a {}-byte chunk at {offset} is larger than a chunk or past any object's end", data.len()));
    }
    let mut guard = pg.lock().expect("PG lock");
    let staged = guard.staged.get_or_insert_with(StagedCopy::default);
    if staged.interval != interval || staged.object != object {
        *staged = StagedCopy { interval, object, chunks: Vec::new(), bytes: 0 };
    }
    staged.bytes += data.len() as u64;
    if staged.bytes > duplex_store::MAX_OBJECT_SIZE {
        guard.staged = None;
        return Err("more bytes staged than any object holds".into());
    }
    staged.chunks.push((offset, data));
    Ok(PeerReply::Done)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use duplex_proto::peering::{LoggedRequest, ObjectMeta, PeerOp, PeerReply, PeerRequest};

    use super::*;
    use crate::config::OplogMode;
    use crate::messages::Mailbox;
    use crate::metrics::Metrics;
    use crate::pg::{pg_key, PgTable};

    /// A flusher over a fresh one-partition store and a file-backed log
    /// directory (the poll keeps the mailbox's waker valid).
    fn flusher(store: &crate::TestStore, logs: &std::path::Path) -> (Flusher, mio::Poll) {
        let (flusher, poll, _inbox) = flusher_and_inbox(store, logs);
        (flusher, poll)
    }

    /// [`flusher`], and its one priority thread's mailbox.
    fn flusher_and_inbox(
        store: &crate::TestStore,
        logs: &std::path::Path,
    ) -> (Flusher, mio::Poll, crossbeam_channel::Receiver<crate::messages::Completion>) {
        let poll = mio::Poll::new().unwrap();
        let (mailbox, inbox) = Mailbox::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let (_sender, jobs) = crossbeam_channel::unbounded();
        let flusher = Flusher {
            id: 1,
            partition: store.open().into_partitions().pop().unwrap(),
            jobs,
            pgs: Arc::new(PgTable::open(OplogMode::File, logs, 1 << 20).unwrap()),
            mailboxes: vec![mailbox],
            metrics: Arc::new(Metrics::default()),
            timeout: std::time::Duration::from_millis(10),
            scrub_requests: Default::default(),
            repairs_asked: HashMap::new(),
            snap_heads: Default::default(),
            syncer: None,
            device: Default::default(),
            scrub_read_bytes: 0,
        };
        (flusher, poll, inbox)
    }

    fn ask(flusher: &mut Flusher, pg: u32, interval: u64, op: PeerOp) -> PeerReply {
        flusher.peer_request(PeerRequest { pg, interval, op })
    }

    fn info(reply: PeerReply) -> (PeerInfo, Vec<LoggedRequest>) {
        match reply {
            PeerReply::Info { info, requests } => (info, requests),
            other => panic!("a query answered {other:?}"),
        }
    }

    /// In one step, a peering request of a PG that is not active here is
    /// answered before the client reads taken with it (its PG's clients
    /// all wait on that peering); a backfill's request of an active PG,
    /// after them.
    #[test]
    fn an_inactive_pgs_peering_goes_ahead_of_client_reads_and_a_backfills_step_behind() {
        use crate::messages::{ClientSlot, Completion, Job, PeerReplyTo, ReadJob};
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut member, _poll, inbox) = flusher_and_inbox(&store, logs.path());
        let (served, peering) = (pg_key(2, 1).unwrap(), pg_key(2, 2).unwrap());
        let _active = active_pg(&member, served);
        let histograms = member.metrics.histograms();
        let mut pending = member.start();
        let read = |slot| {
            Job::Read(ReadJob {
                kind: duplex_proto::osd::OpKind::Read,
                pg: served,
                object: bytes::Bytes::from_static(b"o"),
                arg: bytes::Bytes::new(),
                offset: 0,
                len: 4096,
                flush_first: false,
                reply: ClientSlot { thread: 0, token: 5, slot },
                map_epoch: 1,
                snap: 0,
            })
        };
        let peer = |pg, op, txid| Job::Peer {
            request: PeerRequest { pg, interval: 0, op },
            reply: PeerReplyTo::Remote(crate::pg::ReplyTo { thread: 0, token: 7, txid }),
        };
        let now = std::time::Instant::now();
        member.take(read(1), &mut pending, now);
        member.take(peer(peering, PeerOp::Stat { object: b"o".to_vec() }, 1), &mut pending, now);
        member.take(peer(served, PeerOp::Stat { object: b"o".to_vec() }, 2), &mut pending, now);
        member.take(read(2), &mut pending, now);
        member.step(&mut pending, &histograms, now);
        let order: Vec<String> = inbox
            .try_iter()
            .filter_map(|completion| match completion {
                Completion::Reply { slot, .. } => Some(format!("read {slot}")),
                Completion::Send { frame, .. } => Some(format!("peer {}", frame.header.transaction_id)),
                _ => None,
            })
            .collect();
        assert_eq!(order, ["peer 1", "read 1", "read 2", "peer 2"]);
        assert_eq!(member.metrics.urgent_peer_requests.get(), 1);
    }

    /// A backfill's lock waits in the device queue's backfill class
    /// (flusher::device) and pays for the bytes pulled before it; the
    /// steps under a lock do not wait; and a lock that waited past
    /// `STALE_AFTER` (its requester may have given up) is refused, not
    /// taken.
    #[test]
    fn a_backfill_lock_pays_for_the_pulls_before_it_and_one_that_waited_too_long_is_refused() {
        use crate::messages::{Completion, Job, PeerReplyTo};
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut member, _poll, inbox) = flusher_and_inbox(&store, logs.path());
        let key = pg_key(2, 1).unwrap();
        let active = active_pg(&member, key);
        let histograms = member.metrics.histograms();
        let mut pending = member.start();
        let peer = |op, txid| Job::Peer {
            request: PeerRequest { pg: key, interval: 1, op },
            reply: PeerReplyTo::Remote(crate::pg::ReplyTo { thread: 0, token: 7, txid }),
        };
        let lock = || PeerOp::BackfillLock { object: Some(b"o".to_vec()), start: 0, end: 256 << 10 };
        let replies = |inbox: &crossbeam_channel::Receiver<Completion>| -> Vec<(u64, PeerReply)> {
            inbox
                .try_iter()
                .filter_map(|completion| match completion {
                    Completion::Send { frame, .. } => {
                        Some((frame.header.transaction_id, PeerReply::decode(&frame.payload).unwrap()))
                    }
                    _ => None,
                })
                .collect()
        };
        let now = std::time::Instant::now();
        // The walk holds the object's lock; asking for its first chunk lets
        // go of it at once, not after the wait; asking for the same range
        // again (after Busy) keeps it.
        let held = |range: (u64, u64)| Some((bytes::Bytes::from_static(b"o"), range.0, range.1));
        active.lock().unwrap().backfill_lock = held((0, u64::MAX));
        member.take(peer(PeerOp::Pull { object: b"o".to_vec(), offset: 0, len: 256 << 10 }, 1), &mut pending, now);
        member.take(peer(lock(), 2), &mut pending, now);
        assert_eq!(active.lock().unwrap().backfill_lock, None, "let go before the wait");
        assert_eq!(
            pending.background_queued(crate::flusher::device::DeviceClass::Backfill),
            1,
            "the lock waits its turn"
        );
        member.step(&mut pending, &histograms, now);
        let answered: Vec<u64> = replies(&inbox).into_iter().map(|(txid, _)| txid).collect();
        assert_eq!(answered, [1, 2], "the pull at once, the lock after it (nothing else waits)");
        let backfill = crate::flusher::device::DeviceClass::Backfill as usize;
        assert_eq!(member.metrics.background_cost[backfill].get(), 64, "the lock paid for the 256 KiB pulled");
        // A lock taken now and served past STALE_AFTER is refused.
        active.lock().unwrap().backfill_lock = held((0, 256 << 10));
        member.take(peer(lock(), 3), &mut pending, now);
        assert_eq!(active.lock().unwrap().backfill_lock, held((0, 256 << 10)), "the same range is kept");
        let late = now + crate::flusher::device::STALE_AFTER + std::time::Duration::from_millis(1);
        member.step(&mut pending, &histograms, late);
        let answers = replies(&inbox);
        assert!(matches!(&answers[..], [(3, PeerReply::Refused(why))] if why.contains("for its turn")), "{answers:?}");
        assert_eq!(member.metrics.background_cost[backfill].get(), 65, "nothing pulled since: 1 unit");
        // A peer past the queue's bound is refused at once, not kept.
        let max = crate::flusher::device::QUEUE_MAX;
        for txid in 0..max as u64 {
            member.take(peer(lock(), 10 + txid), &mut pending, late);
        }
        assert!(replies(&inbox).is_empty());
        member.take(peer(lock(), 9), &mut pending, late);
        assert_eq!(pending.background_queued(crate::flusher::device::DeviceClass::Backfill), max);
        let answers = replies(&inbox);
        assert!(
            matches!(&answers[..], [(9, PeerReply::Refused(why))] if why.contains("wait here already")),
            "{answers:?}"
        );
    }

    fn id(seq: u64) -> LoggedRequest {
        LoggedRequest { client: 9, tid: 100 + seq, seq }
    }

    /// A write of `data` to `object` at `seq` of PG `key`, in interval 1.
    fn write_entry(key: u32, seq: u64, object: Vec<u8>, data: Vec<u8>) -> duplex_oplog::Entry {
        let op = duplex_oplog::OpKind::Write;
        duplex_oplog::Entry {
            pg: key,
            epoch: 1,
            version: seq,
            seq,
            op,
            object,
            offset: 0,
            data,
            request: Default::default(),
            snap: 0,
        }
    }

    /// PG `key` opened here and active in interval 1 with this OSD alone.
    fn active_pg(flusher: &Flusher, key: u32) -> crate::pg::SharedPg {
        let pg = flusher.pgs.get_or_open(key).unwrap();
        pg.lock().unwrap().active = Some(crate::pg::Activation { interval: 1, members: vec![1], backfill: Vec::new() });
        pg
    }

    /// The primary's side of a walk's join (pg/elide.rs): while a write is
    /// in flight it is asked again; then the log goes to the store first,
    /// so that the walk's listings name every object written before the
    /// join; the answer names the dormant targets and the seq and ids they
    /// are activated at; a join whose hold expired is not ended.
    #[test]
    fn a_join_flushes_the_log_first_and_names_only_dormant_targets() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut member, _poll) = flusher(&store, logs.path());
        let key = pg_key(2, 1).unwrap();
        let pg = active_pg(&member, key);
        {
            let mut guard = pg.lock().unwrap();
            // osd.1 (this one) primary, osd.2 a member, osd.3 outside.
            guard.active = Some(crate::pg::Activation { interval: 1, members: vec![1, 2], backfill: vec![3] });
            guard.asked_interval = 1;
            guard.elide = crate::pg::elide::Elide::new(vec![3]);
        }
        let mut entry = write_entry(key, 1, b"new".to_vec(), vec![7; 512]);
        entry.request = duplex_oplog::entry::RequestId { client: 9, tid: 101 };
        log(&pg, &entry).unwrap();
        pg.lock().unwrap().uncommitted.begin(77, bytes::Bytes::from_static(b"new"), 0, 512);
        let join = PeerOp::BackfillJoin { targets: vec![3, 2] };
        assert_eq!(ask(&mut member, key, 1, join.clone()), PeerReply::Busy, "a write is in flight");
        let now = std::time::Instant::now();
        assert!(pg.lock().unwrap().elide.as_mut().unwrap().holds(now), "new writes are held meanwhile");
        pg.lock().unwrap().uncommitted.end(77);
        let listed = |member: &mut Flusher| match ask(member, key, 1, PeerOp::List { cursor: Vec::new() }) {
            PeerReply::Names { objects, .. } => objects,
            other => panic!("a listing answered {other:?}"),
        };
        assert_eq!(
            ask(&mut member, key, 1, join.clone()),
            PeerReply::Join {
                targets: vec![3],
                last_seq: 1,
                last_epoch: 1,
                members: vec![1, 2],
                backfill: vec![3],
                requests: vec![LoggedRequest { client: 9, tid: 101, seq: 1 }],
            }
        );
        assert!(pg.lock().unwrap().log.is_empty(), "the log went to the store before the answer");
        assert_eq!(listed(&mut member), vec![b"new".to_vec()]);
        assert_eq!(ask(&mut member, key, 1, PeerOp::BackfillJoined), PeerReply::Done);
        {
            let mut guard = pg.lock().unwrap();
            let elide = guard.elide.as_mut().unwrap();
            assert!(!elide.is_dormant(3) && !elide.holds(now), "joined: writes go to it, none held");
        }
        // Nothing dormant is left: the next join holds nothing.
        match ask(&mut member, key, 1, join) {
            PeerReply::Join { targets, .. } => assert!(targets.is_empty()),
            other => panic!("{other:?}"),
        }
        // An expired hold's join is not ended.
        pg.lock().unwrap().elide = crate::pg::elide::Elide::new(vec![3]);
        assert!(matches!(ask(&mut member, key, 1, PeerOp::BackfillJoin { targets: vec![3] }), PeerReply::Join { .. }));
        assert!(pg.lock().unwrap().elide.as_mut().unwrap().holds(now));
        assert!(!pg.lock().unwrap().elide.as_mut().unwrap().holds(now + crate::pg::elide::JOIN_HOLD));
        assert!(matches!(ask(&mut member, key, 1, PeerOp::BackfillJoined), PeerReply::Refused(_)));
        assert!(pg.lock().unwrap().elide.as_ref().unwrap().is_dormant(3));
    }

    /// Logs `entry` in `pg` as a committed replica entry.
    fn log(pg: &crate::pg::SharedPg, entry: &duplex_oplog::Entry) -> Result<(), duplex_oplog::LogError> {
        let encoded = entry.encode();
        let decoded = duplex_oplog::EntryRef::decode(&encoded).unwrap();
        pg.lock().unwrap().append_encoded(&decoded, &encoded, crate::pg::requests::RequestState::Committed)
    }

    /// An erasure-coded shard's tail (entries whose version, the primary's
    /// watermark, is behind them) stays in the log through a flush, a
    /// query and a restart's replay, where peering could still roll it
    /// back; a later entry's watermark, or an activation at its seq,
    /// applies it.
    #[test]
    fn an_erasure_coded_tail_waits_in_the_log_until_every_shard_holds_it() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut member, _poll) = flusher(&store, logs.path());
        let key = pg_key(2, 1).unwrap();
        let pg = active_pg(&member, key);
        let stored = |member: &mut Flusher, object: &[u8]| {
            let key = Key::in_group(key, object).unwrap();
            member.partition.read(key.as_bytes(), 0, 4).is_ok()
        };
        // Seqs 1 and 2 sent while nothing was on every shard yet; 3 says 1 is.
        for (seq, version) in [(1, 0), (2, 0), (3, 1)] {
            let entry = duplex_oplog::Entry {
                version,
                ..write_entry(key, seq, format!("o{seq}").into_bytes(), vec![seq as u8; 4])
            };
            log(&pg, &entry).unwrap();
        }
        assert_eq!(pg.lock().unwrap().apply_limit, 1);
        member.flush(BTreeSet::from([key])).unwrap();
        assert!(stored(&mut member, b"o1"), "seq 1 is on every shard: applied");
        assert!(!stored(&mut member, b"o2") && !stored(&mut member, b"o3"), "the tail was applied");
        assert_eq!(pg.lock().unwrap().log.len(), 2, "the tail left the log");
        let (queried, _) = info(ask(&mut member, key, 2, PeerOp::Query));
        assert_eq!(queried.last_seq, 3, "a query reports the tail it keeps");
        assert!(!stored(&mut member, b"o2"), "the query applied the tail");

        // A restart: the tail comes back into the log, not into the store.
        drop(pg);
        drop(member);
        let (mut member, _poll) = flusher(&store, logs.path());
        for (pg, entries) in member.pgs.recover().unwrap() {
            crate::pg::replay::replay_recovered_pg(&pg, &entries, &mut member.partition).unwrap();
        }
        let pg = member.pgs.get(key).unwrap();
        let held = pg.lock().unwrap().log.len();
        assert_eq!((held, pg.lock().unwrap().apply_limit), (2, 1));
        assert!(!stored(&mut member, b"o2"), "the restart's replay applied the tail");

        // Activation at seq 3 (every member level there) applies it.
        let activate = PeerOp::Activate {
            last_seq: 3,
            last_epoch: 1,
            members: vec![1],
            rebuilt: false,
            requests: Vec::new(),
            backfill: Vec::new(),
        };
        let (level, _) = info(ask(&mut member, key, 3, PeerOp::Query));
        assert_eq!(level.last_seq, 3);
        assert_eq!(ask(&mut member, key, 3, activate), PeerReply::Done);
        assert!(stored(&mut member, b"o2") && stored(&mut member, b"o3"), "activation left the tail unapplied");
        assert!(pg.lock().unwrap().log.is_empty());
    }

    /// Simulator `--ec 2+1` seed 350: a member settled at `S` holds its
    /// entries through `S` back, so that the next peering may still roll
    /// them back, and peering's reads of it (names, sizes, bytes) see them
    /// on top of its store; settling at `u64::MAX` (a member rebuilt next)
    /// applies its log at once.
    #[test]
    fn a_settled_shard_holds_its_entries_back_and_peering_reads_them_on_top() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut member, _poll) = flusher(&store, logs.path());
        let key = pg_key(2, 1).unwrap();
        let pg = active_pg(&member, key);
        // Seq 1 on every shard (applied); seq 2 extends "a", seq 3 creates
        // "b", seq 4 deletes "a": none of them known to be on every shard.
        let mut a2 = write_entry(key, 2, b"a".to_vec(), vec![2; 10]);
        a2.offset = 4;
        let entries = [
            write_entry(key, 1, b"a".to_vec(), vec![1; 8]),
            duplex_oplog::Entry { version: 1, ..a2 },
            duplex_oplog::Entry { version: 1, ..write_entry(key, 3, b"b".to_vec(), vec![3; 5]) },
            duplex_oplog::Entry {
                version: 1,
                op: duplex_oplog::OpKind::Delete,
                ..write_entry(key, 4, b"a".to_vec(), Vec::new())
            },
        ];
        for entry in &entries {
            log(&pg, entry).unwrap();
        }
        let (queried, _) = info(ask(&mut member, key, 2, PeerOp::Query));
        assert_eq!(queried.last_seq, 4);
        // Settled at 3: seq 4 is dropped, 2 and 3 stay in the log.
        assert_eq!(ask(&mut member, key, 2, PeerOp::Settle { to: 3, replaced: false }), PeerReply::Done);
        assert_eq!(pg.lock().unwrap().log.len(), 2, "the entries through S wait for the activation");
        let in_store = |member: &mut Flusher, object: &[u8]| {
            member.partition.stat(Key::in_group(key, object).unwrap().as_bytes()).map(|info| info.size).ok()
        };
        assert_eq!((in_store(&mut member, b"a"), in_store(&mut member, b"b")), (Some(8), None));
        let names = ask(&mut member, key, 2, PeerOp::List { cursor: Vec::new() });
        assert_eq!(names, PeerReply::Names { objects: vec![b"a".to_vec(), b"b".to_vec()], more: false });
        let after_a = ask(&mut member, key, 2, PeerOp::List { cursor: b"a".to_vec() });
        assert_eq!(after_a, PeerReply::Names { objects: vec![b"b".to_vec()], more: false });
        let size = |reply: PeerReply| match reply {
            PeerReply::Meta(meta) => meta.map(|m| m.size),
            other => panic!("a stat answered {other:?}"),
        };
        assert_eq!(size(ask(&mut member, key, 2, PeerOp::Stat { object: b"a".to_vec() })), Some(14));
        assert_eq!(size(ask(&mut member, key, 2, PeerOp::Stat { object: b"b".to_vec() })), Some(5));
        let pull = |member: &mut Flusher, object: &[u8], len| {
            ask(member, key, 2, PeerOp::Pull { object: object.to_vec(), offset: 0, len })
        };
        let mut a = vec![1u8; 4];
        a.extend([2u8; 10]);
        assert_eq!(pull(&mut member, b"a", 4096), PeerReply::Data(a), "the store's bytes, the held write on top");
        assert_eq!(pull(&mut member, b"b", 5), PeerReply::Data(vec![3; 5]));

        // The next peering settles lower: the held entries roll back.
        let (again, _) = info(ask(&mut member, key, 3, PeerOp::Query));
        assert_eq!(again.last_seq, 3, "a query keeps the held entries too");
        assert_eq!(ask(&mut member, key, 3, PeerOp::Settle { to: 1, replaced: false }), PeerReply::Done);
        assert!(pg.lock().unwrap().log.is_empty());
        assert_eq!(size(ask(&mut member, key, 3, PeerOp::Stat { object: b"a".to_vec() })), Some(8));
        assert_eq!(size(ask(&mut member, key, 3, PeerOp::Stat { object: b"b".to_vec() })), None);

        // A member rebuilt next applies what it logged at once.
        log(&pg, &duplex_oplog::Entry { version: 1, ..write_entry(key, 2, b"c".to_vec(), vec![4; 3]) }).unwrap();
        info(ask(&mut member, key, 4, PeerOp::Query));
        assert_eq!(ask(&mut member, key, 4, PeerOp::Settle { to: u64::MAX, replaced: false }), PeerReply::Done);
        assert!(pg.lock().unwrap().log.is_empty());
        assert_eq!(in_store(&mut member, b"c"), Some(3));
        let (behind, _) = info(ask(&mut member, key, 4, PeerOp::Query));
        assert!(!behind.position_lost, "a member only behind keeps its position");

        // One rebuilt whole applies its log too, and its position is
        // unknown until an activation ends: entries it applied may be
        // rolled back elsewhere, and the compare may stop half-way.
        log(&pg, &duplex_oplog::Entry { version: 1, ..write_entry(key, 3, b"c".to_vec(), vec![5; 6]) }).unwrap();
        info(ask(&mut member, key, 5, PeerOp::Query));
        assert_eq!(ask(&mut member, key, 5, PeerOp::Settle { to: u64::MAX, replaced: true }), PeerReply::Done);
        assert_eq!(in_store(&mut member, b"c"), Some(6));
        let (replaced, _) = info(ask(&mut member, key, 6, PeerOp::Query));
        assert!(replaced.position_lost, "a member rebuilt whole reports a known position: {replaced:?}");
        assert_eq!(replaced.last_epoch, 0);
    }

    #[test]
    fn an_install_lands_whole_with_its_ids_and_the_changed_copy_reports_past_them() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut member, _poll) = flusher(&store, logs.path());
        let pg = pg_key(1, 3).unwrap();
        let (fresh, _) = info(ask(&mut member, pg, 5, PeerOp::Query));
        assert_eq!((fresh.last_seq, fresh.last_epoch), (0, 0));

        // Two chunks staged, then one install: the object and its ids.
        let object = b"obj".to_vec();
        let size = CHUNK_BYTES as u64 + 4096;
        let first = vec![7u8; CHUNK_BYTES as usize];
        let second = vec![8u8; 4096];
        let stage = |offset, data| PeerOp::Stage { object: object.clone(), offset, data };
        assert_eq!(ask(&mut member, pg, 5, stage(0, first.clone())), PeerReply::Done);
        assert_eq!(ask(&mut member, pg, 5, stage(CHUNK_BYTES as u64, second.clone())), PeerReply::Done);
        let meta = ObjectMeta {
            size,
            preallocated: false,
            attrs: vec![(b"a".to_vec(), b"1".to_vec())],
            omap: vec![(b"chunk.0".to_vec(), b"id".to_vec())],
        };
        let install = |staged_bytes, requests| PeerOp::Install {
            object: object.clone(),
            meta: Some(meta.clone()),
            staged_bytes,
            requests,
            authority_seq: 12,
        };
        // This member's store vouches for writes 3 and 20 of its own, and
        // its table holds them (loaded at its next query, as after a
        // restart); the authority's history ends at 12, so 20 must go
        // with the first install (its copies may overwrite what 20 wrote).
        let index = member.partition.index();
        // (A copy an earlier recovery changed, as in seed 500221: its
        // position is unknown, so its query takes every stored id.)
        let own = Batch {
            ops: vec![
                stored_requests::create(index, pg),
                stored_requests::rewrite(index, pg, &[id(3), id(20)]),
                stored_interval::mark_recovered(index, pg, true),
            ],
        };
        member.partition.apply(&own).unwrap();
        drop(member);
        let (mut member, _poll) = flusher(&store, logs.path());
        let (ahead, before) = info(ask(&mut member, pg, 5, PeerOp::Query));
        assert!(before.contains(&id(3)) && before.contains(&id(20)), "{before:?}");
        assert_eq!(ahead.last_seq, 20, "past every id it holds");
        assert!(
            matches!(ask(&mut member, pg, 5, install(4096, vec![id(7)])), PeerReply::Refused(_)),
            "a byte count that does not match what was staged is refused"
        );
        // The refused install dropped what was staged: stage it again.
        assert_eq!(ask(&mut member, pg, 5, stage(0, first.clone())), PeerReply::Done);
        assert_eq!(ask(&mut member, pg, 5, stage(CHUNK_BYTES as u64, second.clone())), PeerReply::Done);
        let staged = first.len() as u64 + second.len() as u64;
        assert_eq!(ask(&mut member, pg, 5, install(staged, vec![id(7), id(9)])), PeerReply::Done);
        let key = Key::in_group(pg, &object).unwrap();
        let data = member.partition.read(key.as_bytes(), 0, size).unwrap();
        assert_eq!(&data[..first.len()], &first[..]);
        assert_eq!(&data[first.len()..], &second[..]);

        // The changed copy: an unknown position past every id it holds,
        // none of them past the authority's.
        let (changed, requests) = info(ask(&mut member, pg, 6, PeerOp::Query));
        assert_eq!((changed.last_seq, changed.last_epoch, changed.history_from), (9, 0, 10));
        assert!(requests.contains(&id(7)) && requests.contains(&id(9)), "{requests:?}");
        assert!(!requests.contains(&id(20)), "an id past the authority's history survived the install: {requests:?}");
        assert!(requests.contains(&id(3)), "an id of its own within the history stays: {requests:?}");
        // A copy that comes with ids past the history (a scrub's repair
        // from another member, say): those are not taken.
        let past = PeerOp::Install {
            object: b"other".to_vec(),
            meta: None,
            staged_bytes: 0,
            requests: vec![id(8), id(13)],
            authority_seq: 12,
        };
        assert_eq!(ask(&mut member, pg, 6, past), PeerReply::Done);
        let (_, requests) = info(ask(&mut member, pg, 6, PeerOp::Query));
        assert!(requests.contains(&id(8)) && !requests.contains(&id(13)), "{requests:?}");

        // A restart: the mark and the ids are in the store.
        drop(member);
        let (mut member, _poll) = flusher(&store, logs.path());
        let (restarted, requests) = info(ask(&mut member, pg, 7, PeerOp::Query));
        assert_eq!((restarted.last_seq, restarted.last_epoch), (9, 0));
        assert!(requests.contains(&id(7)) && requests.contains(&id(9)), "{requests:?}");
        // Its own id within the authority's history stays; the one past it went from the store too.
        assert!(requests.contains(&id(3)) && !requests.contains(&id(20)), "{requests:?}");

        // Activation at the authority's position ends it.
        let activate = PeerOp::Activate {
            last_seq: 12,
            last_epoch: 4,
            members: vec![0, 1],
            rebuilt: true,
            requests: vec![id(7), id(9), id(12)],
            backfill: Vec::new(),
        };
        assert_eq!(ask(&mut member, pg, 7, activate), PeerReply::Done);
        let (activated, _) = info(ask(&mut member, pg, 8, PeerOp::Query));
        assert_eq!((activated.last_seq, activated.last_epoch, activated.last_active), (12, 4, 7));
    }

    #[test]
    fn an_entry_the_store_cannot_take_fences_its_pg_instead_of_killing_the_flusher() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut flusher, _poll) = flusher(&store, logs.path());
        let key = pg_key(1, 0).unwrap();
        let pg = active_pg(&flusher, key);
        // A name the log takes but the store cannot make a key of: no path
        // the OSD runs logs one, so only a bug would.
        for (seq, object) in [(1, b"fine".to_vec()), (2, vec![b'x'; duplex_store::MAX_KEY_LEN]), (3, b"after".to_vec())]
        {
            log(&pg, &write_entry(key, seq, object, vec![seq as u8; 512])).unwrap();
        }
        flusher.flush(BTreeSet::from([key])).expect("the flush itself goes on");
        let guard = pg.lock().unwrap();
        assert!(guard.active.is_none(), "the PG is fenced: it serves nothing more");
        assert_eq!(guard.flushed_through(), 1, "what precedes the bad entry is flushed");
        assert_eq!(guard.log.entries().count(), 2, "the bad entry and what follows stay in the log");
        assert_eq!(flusher.metrics.unflushable_entries.get(), 1);
        drop(guard);
        // Its peering query then fails, so the PG shows inactive, loudly.
        assert!(matches!(ask(&mut flusher, key, 2, PeerOp::Query), PeerReply::Refused(_)));
    }

    /// A PG clean on its own OSDs without this one: its copy here goes,
    /// in paced batches, the first of which marks the copy incomplete; a
    /// PG a primary has asked about since the map the removal was judged by
    /// stays whole.
    #[test]
    fn a_stray_copy_is_marked_incomplete_then_removed_and_a_member_again_is_kept() {
        use duplex_map::ActiveSet;
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut flusher, _poll) = flusher(&store, logs.path());
        let mut map = crate::test_map(4, 16);
        let view = crate::cluster::MapView::new(map.clone());
        let pool = map.pools[&1].clone();
        // Two PGs osd.1 (this flusher's OSD) is no OSD of, clean elsewhere.
        let elsewhere: Vec<u32> =
            (0..16).filter(|pg| !view.map.pg_osds(&view.hierarchy, &pool, *pg).contains(&1)).take(2).collect();
        for pg in &elsewhere {
            let acting = view.map.acting(&view.hierarchy, &pool, *pg);
            map.active_sets.insert((1, *pg), ActiveSet { since: map.epoch, osds: acting });
        }
        let view = Arc::new(crate::cluster::MapView::new(map));
        let (gone, asked) = (pg_key(1, elsewhere[0]).unwrap(), pg_key(1, elsewhere[1]).unwrap());
        for key in [gone, asked] {
            let pg = active_pg(&flusher, key);
            for seq in 1..=40u64 {
                log(&pg, &write_entry(key, seq, format!("o{seq}").into_bytes(), vec![seq as u8; 4096])).unwrap();
            }
            flusher.flush(BTreeSet::from([key])).unwrap();
        }
        // A primary asked osd.1 about `asked` in an interval after the map.
        flusher.pgs.get(asked).unwrap().lock().unwrap().asked_interval = view.epoch() + 1;
        let mut pending = flusher.start();
        let histograms = flusher.metrics.histograms();
        let mut now = std::time::Instant::now();
        flusher.take(crate::messages::Job::Strays(view), &mut pending, now);
        flusher.step(&mut pending, &histograms, now);
        assert_eq!(flusher.partition.list_group(gone, 100).len(), 40 - 32, "one batch of 32 at a time");
        assert!(crate::pg::stored_interval::backfilling(&mut flusher.partition, gone).unwrap(), "marked first");
        flusher.step(&mut pending, &histograms, now);
        assert_eq!(flusher.partition.list_group(gone, 100).len(), 8, "paced: no second batch at once");
        while let Some(at) = pending.deadline() {
            now = now.max(at);
            flusher.step(&mut pending, &histograms, now);
        }
        assert!(flusher.partition.list_group(gone, 100).is_empty(), "the stray copy is gone");
        assert_eq!(flusher.partition.list_group(asked, 100).len(), 40, "a member again: kept whole");
        assert!(!crate::pg::stored_interval::backfilling(&mut flusher.partition, asked).unwrap());
        assert_eq!((flusher.metrics.stray_pgs_removed.get(), flusher.metrics.stray_objects_removed.get()), (1, 40));
    }

    /// Issue 24: `df` walks a partition's index (O(objects), on the
    /// flusher's thread): a client asking in a loop gets the last walk's
    /// figures for a second instead of keeping the flusher walking.
    #[test]
    fn df_walks_a_partition_at_most_once_a_second() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut flusher, _poll) = flusher(&store, logs.path());
        let key = pg_key(1, 3).unwrap();
        let pg = active_pg(&flusher, key);
        let mut pending = flusher.start();
        let objects_of = |reply: &duplex_proto::osd::UsageReply| reply.pgs.iter().map(|p| p.objects).sum::<u64>();
        let start = std::time::Instant::now();
        let before = flusher.usage(&mut pending, start);
        assert_eq!(objects_of(&before), 0);
        log(&pg, &write_entry(key, 1, b"one".to_vec(), vec![1; 4096])).unwrap();
        flusher.flush(BTreeSet::from([key])).unwrap();
        let soon = start + super::super::USAGE_REUSE / 2;
        let reply = flusher.usage(&mut pending, soon);
        assert_eq!(objects_of(&reply), 0, "within the second: the last walk's figures");
        assert!(reply.used_bytes > before.used_bytes, "the store's totals are current");
        assert_eq!(flusher.metrics.usage_walks.get(), 1);
        let later = start + super::super::USAGE_REUSE;
        assert!(objects_of(&flusher.usage(&mut pending, later)) > 0, "a second on: walked again");
        assert_eq!(flusher.metrics.usage_walks.get(), 2);
    }

    /// Issue 24: a flush the store refuses for want of space (devices lie;
    /// the ratios should have stopped writes before) makes the OSD report
    /// itself full, loudly, until a flush goes through again: not a retry
    /// loop nobody sees.
    #[test]
    fn a_flush_out_of_space_reports_the_store_full_until_one_goes_through() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut flusher, _poll) = flusher(&store, logs.path());
        let key = pg_key(1, 3).unwrap();
        let pg = active_pg(&flusher, key);
        let mut refused = false;
        for seq in 1..=2000 {
            let entry = write_entry(key, seq, format!("object-{seq}").into_bytes(), vec![seq as u8; 128 << 10]);
            if log(&pg, &entry).is_ok() {
                continue;
            }
            // The log is full: flush it, as the flusher would.
            if flusher.flush(BTreeSet::from([key])).is_err() {
                refused = true;
                break;
            }
            log(&pg, &entry).unwrap();
        }
        assert!(refused, "a 64 MiB store took 250 MiB of distinct objects");
        let metrics = flusher.metrics.clone();
        assert!(metrics.partition_out_of_space[0].load(std::sync::atomic::Ordering::Relaxed));
        assert_eq!(metrics.fullest_partition_permille(), 1000, "reported wholly used: the OSD turns full");
        assert_eq!(metrics.flush_no_space.get(), 1);
        assert!(flusher.flush(BTreeSet::from([key])).is_err(), "still no room");
        assert_eq!(metrics.fullest_partition_permille(), 1000);

        // Room again (an operator's deletes elsewhere): the next flush goes through.
        let doomed: Vec<_> = flusher.partition.list_group(key, 100).into_iter().take(100).collect();
        let mut batch = duplex_store::Batch::new();
        for key in doomed {
            batch.push(duplex_store::Op::Delete { key });
        }
        flusher.partition.apply(&batch).unwrap();
        flusher.flush(BTreeSet::from([key])).expect("room for the log again");
        assert!(!metrics.partition_out_of_space[0].load(std::sync::atomic::Ordering::Relaxed));
        assert!(metrics.fullest_partition_permille() < 1000, "its real use again");
        assert_eq!(pg.lock().unwrap().log.entries().count(), 0, "the log is flushed whole");
    }
    /// The snapshot trimmer's scans (crate::trimmer): a batch of `limit`
    /// dead clones at most, the next after the last one's name, so that
    /// the batches together name every dead clone once, and a live one
    /// never.
    #[test]
    fn dead_clones_come_in_batches_after_a_cursor_each_once() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut flusher, _poll) = flusher(&store, logs.path());
        let key = pg_key(1, 2).unwrap();
        // Clones `name@seq` of heads last changed under 0 (no snapseq
        // attribute): snapshot 4 reads each clone with seq >= 4.
        let mut batch = duplex_store::Batch::new();
        let mut all = Vec::new();
        for (name, seqs) in
            [(&b"img.a"[..], &[2u64, 5, 9][..]), (b"img.b", &[1, 3]), (b"img.c", &[7, 8, 11]), (b"other", &[1])]
        {
            for &seq in seqs {
                batch.push(duplex_store::Op::Write {
                    key: crate::snaps::clone_key(key, name, seq).unwrap(),
                    offset: 0,
                    data: vec![1; 16],
                });
                all.push((name.to_vec(), seq));
            }
        }
        flusher.partition.apply(&batch).unwrap();
        let live = [4u64];
        let expected: Vec<(Vec<u8>, u64)> =
            all.into_iter().filter(|(name, seq)| name.starts_with(b"img.") && *seq < 4).collect();
        assert_eq!(expected.len(), 3, "img.a@2, img.b@1 and img.b@3 are dead");
        let mut found = Vec::new();
        let mut after = None;
        loop {
            let dead = flusher.dead_clones(key, b"img.", &live, after.as_ref(), 2).unwrap();
            assert!(dead.len() <= 2, "{dead:?}");
            found.extend(dead.iter().cloned());
            after = dead.last().cloned();
            if dead.len() < 2 {
                break;
            }
        }
        assert_eq!(found, expected, "every dead clone once, in name order");
        let whole = flusher.dead_clones(key, b"img.", &live, None, 0).unwrap();
        assert_eq!(whole, expected, "limit 0: no limit");
    }

    /// Issue 24: a flush refused for want of room holds back only the PGs
    /// whose entries need it. Another PG's deletes in the same partition
    /// go through and free the room, instead of waiting behind the first
    /// PG's new data for ever (a mixed batch wedged both).
    #[test]
    fn a_pg_without_room_holds_back_only_itself_and_another_pgs_deletes_free_room() {
        let store = crate::TestStore::new(1);
        let logs = tempfile::tempdir().unwrap();
        let (mut flusher, _poll) = flusher(&store, logs.path());
        // B's objects, sorted after A's PG in the flush's order.
        let (a, b) = (pg_key(1, 3).unwrap(), pg_key(1, 5).unwrap());
        let (pg_a, pg_b) = (active_pg(&flusher, a), active_pg(&flusher, b));
        for seq in 1..=64 {
            let entry = write_entry(b, seq, format!("b-{seq}").into_bytes(), vec![7; 128 << 10]);
            if log(&pg_b, &entry).is_err() {
                flusher.flush(BTreeSet::from([b])).unwrap();
                log(&pg_b, &entry).unwrap();
            }
        }
        flusher.flush(BTreeSet::from([b])).unwrap();
        // A fills the store until its flush is refused; its last entries stay logged.
        let mut seq = 0;
        loop {
            seq += 1;
            let entry = write_entry(a, seq, format!("a-{seq}").into_bytes(), vec![seq as u8; 128 << 10]);
            if log(&pg_a, &entry).is_ok() {
                continue;
            }
            if flusher.flush(BTreeSet::from([a])).is_err() {
                break;
            }
            log(&pg_a, &entry).unwrap();
            assert!(seq < 4000, "a 64 MiB store took 500 MiB");
        }
        assert!(pg_a.lock().unwrap().log.entries().count() > 0, "A's entries wait in its log");
        // B deletes its objects, logged while the store is full.
        for n in 1..=64u64 {
            let mut delete = write_entry(b, 64 + n, format!("b-{n}").into_bytes(), Vec::new());
            delete.op = duplex_oplog::OpKind::Delete;
            log(&pg_b, &delete).unwrap();
        }
        let refused = flusher.flush_each(BTreeSet::from([a, b])).unwrap_err();
        assert_eq!(refused, vec![a], "only A is held back");
        assert_eq!(pg_b.lock().unwrap().log.entries().count(), 0, "B's deletes flushed");
        assert!(flusher.partition.list_group(b, 100).is_empty(), "B's objects are gone");
        assert!(flusher.metrics.partition_out_of_space[0].load(std::sync::atomic::Ordering::Relaxed));
        // The room B freed takes A's entries at its next retry.
        flusher.flush_each(BTreeSet::from([a])).expect("room again");
        assert_eq!(pg_a.lock().unwrap().log.entries().count(), 0);
        assert!(!flusher.metrics.partition_out_of_space[0].load(std::sync::atomic::Ordering::Relaxed));
    }
}
