//! An erasure-coded PG's recovery: its members hold different shards, so
//! none is recovered from another's copy. Each shard applied only what
//! every shard of its interval had logged (`Pg::apply_limit`).
//!
//! 1. **Who holds the newest state**: a member is *current* when its copy
//!    is whole (not a lost log nor an unfinished copy), the map's last
//!    active set names it at its position, and it was active in the
//!    newest interval any such member was (or its log ends where such a
//!    member's does: that interval's activation stopped before it, and
//!    took no write). Current members logged
//!    prefixes of one primary's sequence, and every write that PG
//!    acknowledged is on each of them (an acknowledgement needs every
//!    shard of the interval). Fewer than `k` current members: the PG
//!    cannot decode its newest state and waits.
//! 2. **Where the PG resumes**: `S`, the k-th highest `last_seq` of the
//!    current members. An entry past it is held by fewer than `k` of them:
//!    it was never acknowledged, and is rolled back. Every entry through
//!    `S` is held by `k` or more: it stays.
//! 3. **Settle** (`PeerOp::Settle`): each member holding `S` drops its
//!    entries after `S` (never applied: they were past every watermark)
//!    and holds the rest back until activation, so that a peering cut
//!    short can still roll them back (`flusher/held.rs`; the rebuild reads
//!    its log on top of its store); any other member applies its whole
//!    log, since its objects are compared and rebuilt next.
//! 4. **Rebuild**: a current member behind `S` whose last entry the
//!    authority's history reaches gets the objects its missing entries
//!    touched; any other (older interval, moved position, new OSD, lost
//!    log) is rebuilt whole: every object either holds (both object lists)
//!    is decoded, chunk by chunk, from `k` members that hold `S`,
//!    compared with its copy, and installed whole if it differs (as a
//!    replicated copy is). The PG waits meanwhile (not yet in the
//!    background).
//! 5. Record the positional set, and activate every member at `S`.

use duplex_ec::codec::COLUMN;
use duplex_ec::{Codec, Profile};
use duplex_map::NO_OSD;

use super::ec_scrub::{EcScrub, ObjectScrub};
use super::*;

/// The erasure-coded part of a [`Recovery`].
pub(super) struct EcRecovery {
    pub(super) profile: Profile,
    /// The members by shard position (a missing one is `NO_OSD`).
    pub(super) shards: Vec<OsdId>,
    /// The seq every member settles at.
    settle_to: u64,
    /// Current members with `last_seq >= settle_to`: the rebuilds' sources
    /// (every member, once the rebuilds are done: the scrub's).
    pub(super) whole: Vec<OsdId>,
    /// Members to settle: the seq each settles at, and whether it is
    /// rebuilt whole (`PeerOp::Settle::replaced`).
    to_settle: VecDeque<(OsdId, u64, bool)>,
    /// Current members behind `settle_to`: (member, its last seq, that entry's epoch).
    behind: VecDeque<(OsdId, u64, u32)>,
    /// Members to rebuild whole.
    to_rebuild_whole: VecDeque<OsdId>,
    /// Objects whose shard a member needs rebuilt.
    pub(super) rebuilds: VecDeque<RebuildJob>,
    /// The step with a request out.
    pub(super) stage: Option<EcStage>,
    /// A deep scrub of every stripe, after the rest (`ec_scrub.rs`).
    pub(super) scrub: Option<EcScrub>,
}

/// One object's shard to rebuild on `to`.
pub(super) struct RebuildJob {
    pub(super) object: Vec<u8>,
    pub(super) to: OsdId,
    /// Compare with its copy first, and install only if it differs.
    pub(super) compare: bool,
    /// Members not to decode from (their shard of it is bad).
    pub(super) avoid: Vec<OsdId>,
}

pub(super) enum EcStage {
    Settle,
    Touched(OsdId),
    /// Listing `on` for the whole rebuild of `target`: the names so far.
    List {
        target: OsdId,
        on: OsdId,
        names: BTreeSet<Vec<u8>>,
    },
    Rebuild(Box<Rebuild>),
    /// Listing every member's objects for a scrub, position by position:
    /// the names so far, and the position being listed.
    ScrubList {
        names: BTreeSet<Vec<u8>>,
        at: usize,
    },
    ScrubObject(Box<ObjectScrub>),
}

pub(super) struct Rebuild {
    object: Vec<u8>,
    to: OsdId,
    /// `k` members holding `settle_to`, by shard position.
    sources: Vec<OsdId>,
    /// Each source's shard size (`None`: it has no such object).
    sizes: Vec<Option<u64>>,
    /// Compare with the target's copy before installing it (a whole
    /// rebuild), while its size and every chunk so far matched.
    compare: bool,
    /// As the job asked (`compare` may turn off on a difference), and the
    /// members it avoids: a damaged source restarts it without that one.
    compare_asked: bool,
    avoid: Vec<OsdId>,
    stage: RebuildStage,
}

enum RebuildStage {
    /// Asked source `sizes.len()` for its shard's size.
    Stat,
    /// Asked the target for its copy's size.
    StatTarget,
    /// Pulling the chunk at `offset`: the answers so far, by source.
    Pull {
        offset: u64,
        chunks: Vec<Vec<u8>>,
        staged: u64,
    },
    /// Asked the target for its chunk's digest; the next chunk starts at
    /// `next`, and the decoded one's digest is `crc`.
    Compare {
        next: u64,
        crc: u32,
    },
    /// Staged a chunk; the next one starts at `next`.
    Stage {
        next: u64,
        staged: u64,
    },
    Ids {
        meta: Option<ObjectMeta>,
        staged: u64,
    },
    Install,
}

/// What the next step of one object's rebuild is.
// (One lives at a time, between two steps: its size costs nothing.)
#[allow(clippy::large_enum_variant)]
enum ChunkStep {
    Send(RebuildStage, OsdId, PeerOp),
    /// The target's copy is the decoded one already.
    Same,
}

impl EcRecovery {
    /// Whether a request of this recovery is out.
    pub(super) fn waits(&self) -> bool {
        self.stage.is_some()
    }

    /// The rebuilt shard's size: its sources' largest, in whole 64-byte
    /// columns (a shard the last writes left short reads as zeros past its
    /// end either way). A data shard may end mid-column while the parity
    /// over it always spans whole columns: a parity shard rebuilt from data
    /// shards alone is then as long as the one it replaces, and a compare
    /// with a good one finds them equal. (Its bytes past the data's end are
    /// zeros with this code, but the size must not depend on that.)
    fn size(rebuild: &Rebuild) -> u64 {
        let largest = rebuild.sizes.iter().flatten().copied().max().unwrap_or(0);
        largest.div_ceil(COLUMN).saturating_mul(COLUMN)
    }
}

impl Peering {
    /// Recovery of an erasure-coded PG whose members all answered (see the
    /// module's steps).
    pub(super) fn recover_erasure(
        &mut self,
        profile: Profile,
        infos: BTreeMap<OsdId, PeerInfo>,
        mut logged: BTreeMap<OsdId, Vec<LoggedRequest>>,
    ) -> Vec<Action> {
        let pg = self.pg;
        let k = profile.k();
        self.unrecord.clear();
        debug_assert_eq!(self.shards.len(), profile.shards(), "an erasure-coded machine knows its positions");
        tracing::debug!(pg, shards = ?self.shards, active_set = ?self.active_set, ?infos, "erasure-coded members answered");
        let position = |osd: OsdId| self.shards.iter().position(|s| *s == osd);
        // Named at its position by the last active set (none recorded: a
        // new PG, whose every member starts empty).
        let recorded = |osd: OsdId| {
            self.active_set.as_ref().is_none_or(|set| position(osd).is_some_and(|p| set.get(p) == Some(&osd)))
        };
        let fresh = self.active_set.is_none() && infos.values().all(|i| i.last_seq == 0);
        let candidates: Vec<OsdId> = self
            .members
            .iter()
            .copied()
            .filter(|m| !infos[m].backfilling && !infos[m].position_lost && recorded(*m))
            .collect();
        let newest = candidates.iter().map(|m| infos[m].last_active).max().unwrap_or(0);
        // A member the last active set names at its position but that was
        // not activated in the newest interval (that interval's activation
        // stopped before it) is current too if its log ends where a newest
        // member's does: the interval took no write (its primary activates
        // last), so they hold one history (simulator, `--ec 2+1` seed 6).
        // One that ends elsewhere may lack acknowledged writes: it must not
        // count towards `S`, and is rebuilt.
        let end = |m: &OsdId| (infos[m].last_seq, infos[m].last_epoch);
        let newest_ends: BTreeSet<(u64, u32)> =
            candidates.iter().filter(|m| infos[*m].last_active == newest).map(end).collect();
        let current: Vec<OsdId> = candidates
            .into_iter()
            .filter(|m| fresh || infos[m].last_active == newest || newest_ends.contains(&end(m)))
            .collect();
        if current.len() < k {
            // Why each other member is not current, for the operator.
            let others: Vec<String> = self
                .members
                .iter()
                .filter(|m| !current.contains(m))
                .map(|m| {
                    let i = &infos[m];
                    let why = if i.backfilling {
                        "an unfinished copy".to_string()
                    } else if i.position_lost {
                        "lost its log".to_string()
                    } else if !recorded(*m) {
                        format!("not at its position in the last active set {:?}", self.active_set)
                    } else {
                        format!("last active in interval {}, not {newest}", i.last_active)
                    };
                    format!("osd.{m}: {why}")
                })
                .collect();
            // Members the record names at their positions whose copies lost
            // their shards: the monitor takes them out of the record, and
            // the PG's pin then goes back to recorded holders that still
            // hold theirs, if any is up (simulator `--ec 2+1` with two
            // faults, seed 10610699: such a holder, outside the acting
            // set, was never asked, and the PG waited for good).
            self.unrecord = self
                .members
                .iter()
                .copied()
                .filter(|m| self.active_set.is_some() && recorded(*m))
                .filter(|m| infos[m].position_lost || infos[m].backfilling)
                .collect();
            return self.stuck(format!(
                "PG {pg:#x} is erasure-coded ({profile}) and only {} of its members ({current:?}) hold its newest \
                 state; {k} are needed to decode it: it waits for more of its last active OSDs ({})",
                current.len(),
                others.join("; ")
            ));
        }
        let mut seqs: Vec<u64> = current.iter().map(|m| infos[m].last_seq).collect();
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        let settle_to = seqs[k - 1];
        let primary = self.members[0];
        let authority = *current
            .iter()
            .filter(|m| infos[*m].last_seq == settle_to)
            .min_by_key(|m| **m != primary)
            .expect("the k-th seq is some member's");
        let info = infos[&authority];
        let whole: Vec<OsdId> = current.iter().copied().filter(|m| infos[m].last_seq >= settle_to).collect();
        let mut behind = VecDeque::new();
        let mut to_rebuild_whole = VecDeque::new();
        for member in self.members.iter().copied() {
            let member_info = &infos[&member];
            if current.contains(&member) {
                if member_info.last_seq >= settle_to {
                    continue;
                }
                // Its last entry is in the authority's history: only behind.
                if member_info.last_epoch > 0 && info.history_from <= member_info.last_seq {
                    behind.push_back((member, member_info.last_seq, member_info.last_epoch));
                    continue;
                }
            }
            to_rebuild_whole.push_back(member);
        }
        let rolled_back: Vec<OsdId> = whole.iter().copied().filter(|m| infos[m].last_seq > settle_to).collect();
        if !rolled_back.is_empty() || !behind.is_empty() || !to_rebuild_whole.is_empty() {
            tracing::info!(
                pg,
                settle_to,
                rolled_back = ?rolled_back,
                behind = ?behind.iter().map(|(m, ..)| *m).collect::<Vec<_>>(),
                rebuilt_whole = ?to_rebuild_whole,
                "an erasure-coded PG settles its members"
            );
        }
        // Ids of rolled-back entries are not the PG's: a resend runs again.
        for ids in logged.values_mut() {
            ids.retain(|id| id.seq <= settle_to);
        }
        // A member rebuilt, whole or in part, applies its own log first
        // (what it holds is compared or replaced next); the sources settle
        // at `S`, holding their entries through it back until activation
        // (flusher/held.rs). A member rebuilt whole may so apply entries
        // past `S` that the others roll back, and its store is the
        // authority's only once every object is compared: until an
        // activation ends, it reports its position as unknown. (Else a
        // peering cut short after the map recorded it at its position took
        // it for current, with entries past the next `S` applied, and it
        // refused to settle for good: `--ec 2+2` seed 230675.)
        let to_settle = self
            .members
            .iter()
            .map(|m| {
                let to = if whole.contains(m) { settle_to } else { u64::MAX };
                (*m, to, to_rebuild_whole.contains(m))
            })
            .collect();
        let ec = EcRecovery {
            profile,
            shards: self.shards.clone(),
            settle_to,
            whole: whole.clone(),
            to_settle,
            behind,
            to_rebuild_whole,
            rebuilds: VecDeque::new(),
            stage: None,
            scrub: self.scrub.map(EcScrub::new),
        };
        let recovery = Box::new(Recovery {
            authority,
            info,
            targets: VecDeque::new(),
            listing: None,
            work: VecDeque::new(),
            copy: None,
            changed: BTreeSet::new(),
            logged,
            on_history: whole.into_iter().collect(),
            waiting: None,
            scrub: None,
            history_in_background: BTreeSet::new(),
            ec: Some(Box::new(ec)),
        });
        self.step(recovery, None)
    }

    /// The next request of an erasure-coded recovery (`None`: it is done).
    pub(super) fn ec_step(
        &mut self,
        recovery: &mut Recovery,
        mut reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let authority = recovery.authority;
        let ec = recovery.ec.as_mut().expect("an erasure-coded recovery");
        loop {
            match (ec.stage.take(), reply.take()) {
                (Some(EcStage::Settle), Some(PeerReply::Done)) => {}
                (Some(EcStage::Touched(target)), Some(PeerReply::Touched(Some(objects)))) => {
                    recovery.changed.insert(target);
                    let jobs = objects.into_iter().map(|object| RebuildJob {
                        object,
                        to: target,
                        compare: false,
                        avoid: vec![],
                    });
                    ec.rebuilds.extend(jobs);
                }
                (Some(EcStage::Touched(target)), Some(PeerReply::Touched(None))) => {
                    // Its last entry is not the authority's after all: whole.
                    ec.to_rebuild_whole.push_back(target);
                }
                (Some(EcStage::List { target, on, mut names, .. }), Some(PeerReply::Names { objects, more })) => {
                    let cursor = objects.last().cloned();
                    names.extend(objects);
                    match cursor {
                        Some(cursor) if more => {
                            let op = PeerOp::List { cursor };
                            ec.stage = Some(EcStage::List { target, on, names });
                            return Ok(Some((on, op)));
                        }
                        _ if on != target => {
                            // The authority's list is in; the target's next.
                            let op = PeerOp::List { cursor: Vec::new() };
                            ec.stage = Some(EcStage::List { target, on: target, names });
                            return Ok(Some((target, op)));
                        }
                        _ => {
                            recovery.changed.insert(target);
                            let jobs = names.into_iter().map(|object| RebuildJob {
                                object,
                                to: target,
                                compare: true,
                                avoid: vec![],
                            });
                            ec.rebuilds.extend(jobs);
                        }
                    }
                }
                (Some(stage @ (EcStage::ScrubList { .. } | EcStage::ScrubObject(_))), answer) => {
                    if let Some(next) = self.ec_scrub_answer(ec, stage, answer)? {
                        return Ok(Some(next));
                    }
                }
                (Some(EcStage::Rebuild(rebuild)), answer) => {
                    if let Some(next) = self.rebuild_step(ec, authority, *rebuild, answer)? {
                        return Ok(Some(next));
                    }
                }
                (None, None) => {
                    if let Some((osd, to, replaced)) = ec.to_settle.pop_front() {
                        ec.stage = Some(EcStage::Settle);
                        return Ok(Some((osd, PeerOp::Settle { to, replaced })));
                    }
                    let to = ec.settle_to;
                    if let Some((target, after, after_epoch)) = ec.behind.pop_front() {
                        ec.stage = Some(EcStage::Touched(target));
                        return Ok(Some((authority, PeerOp::Touched { after, after_epoch, through: to })));
                    }
                    if let Some(RebuildJob { object, to, compare, avoid }) = ec.rebuilds.pop_front() {
                        let k = ec.profile.k();
                        let sources: Vec<OsdId> = ec
                            .shards
                            .iter()
                            .copied()
                            .filter(|m| *m != to && ec.whole.contains(m) && !avoid.contains(m))
                            .take(k)
                            .collect();
                        if sources.len() < k {
                            return Err(format!("PG {:#x}: fewer than {k} whole shards to rebuild from", self.pg));
                        }
                        let first = sources[0];
                        let op = PeerOp::Stat { object: object.clone() };
                        let rebuild = Rebuild {
                            object,
                            to,
                            sources,
                            sizes: Vec::new(),
                            compare,
                            compare_asked: compare,
                            avoid,
                            stage: RebuildStage::Stat,
                        };
                        ec.stage = Some(EcStage::Rebuild(Box::new(rebuild)));
                        return Ok(Some((first, op)));
                    }
                    if let Some(target) = ec.to_rebuild_whole.pop_front() {
                        // Every object the authority or the target holds.
                        let names = BTreeSet::new();
                        ec.stage = Some(EcStage::List { target, on: authority, names });
                        return Ok(Some((authority, PeerOp::List { cursor: Vec::new() })));
                    }
                    if let Some(next) = self.ec_scrub_next(ec)? {
                        return Ok(Some(next));
                    }
                    if !ec.rebuilds.is_empty() {
                        continue; // the scrub's repairs
                    }
                    return Ok(None);
                }
                (stage, answer) => {
                    let stage = match stage {
                        Some(EcStage::Settle) => "settling",
                        Some(EcStage::Touched(_)) => "naming objects",
                        Some(EcStage::List { .. }) => "listing objects",
                        Some(EcStage::Rebuild(_)) => "rebuilding",
                        Some(EcStage::ScrubList { .. } | EcStage::ScrubObject(_)) => "scrubbing",
                        None => "no step",
                    };
                    return Err(format!("unexpected answer {answer:?} while {stage}"));
                }
            }
        }
    }

    /// The next request of one object's rebuild (`None`: installed, or the
    /// target's copy was right).
    fn rebuild_step(
        &mut self,
        ec: &mut EcRecovery,
        authority: OsdId,
        mut rebuild: Rebuild,
        answer: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let k = rebuild.sources.len();
        let object = rebuild.object.clone();
        let step = match (std::mem::replace(&mut rebuild.stage, RebuildStage::Install), answer) {
            (RebuildStage::Stat, Some(PeerReply::Meta(meta))) => {
                rebuild.sizes.push(meta.map(|m| m.size));
                if rebuild.sizes.len() < k {
                    let to = rebuild.sources[rebuild.sizes.len()];
                    ChunkStep::Send(RebuildStage::Stat, to, PeerOp::Stat { object })
                } else if rebuild.compare {
                    ChunkStep::Send(RebuildStage::StatTarget, rebuild.to, PeerOp::Stat { object })
                } else {
                    self.first_step(ec, &mut rebuild, authority)?
                }
            }
            (RebuildStage::StatTarget, Some(PeerReply::Meta(meta))) => {
                let theirs = meta.map(|m| m.size);
                let absent = rebuild.sizes.iter().all(Option::is_none);
                let ours = (!absent).then(|| EcRecovery::size(&rebuild));
                if theirs == ours && absent {
                    ChunkStep::Same
                } else {
                    // A copy of another size differs: no need to compare.
                    rebuild.compare = theirs == ours;
                    self.first_step(ec, &mut rebuild, authority)?
                }
            }
            (RebuildStage::Pull { offset, mut chunks, staged }, Some(PeerReply::Data(data))) => {
                chunks.push(data);
                self.chunk_step(ec, &mut rebuild, authority, offset, chunks, staged)?
            }
            (RebuildStage::Compare { next, crc }, Some(PeerReply::ChunkDigest(theirs))) => {
                if theirs != Some(crc) {
                    // It differs: the object is installed whole, from its start.
                    rebuild.compare = false;
                    self.chunk_step(ec, &mut rebuild, authority, 0, Vec::new(), 0)?
                } else {
                    self.chunk_step(ec, &mut rebuild, authority, next, Vec::new(), 0)?
                }
            }
            (RebuildStage::Stage { next, staged }, Some(PeerReply::Done)) => {
                self.chunk_step(ec, &mut rebuild, authority, next, Vec::new(), staged)?
            }
            (RebuildStage::Ids { meta, staged }, Some(PeerReply::Requests(mut requests))) => {
                requests.retain(|id| id.seq <= ec.settle_to);
                let op = PeerOp::Install { object, meta, staged_bytes: staged, requests, authority_seq: ec.settle_to };
                ChunkStep::Send(RebuildStage::Install, rebuild.to, op)
            }
            (RebuildStage::Install, Some(PeerReply::Done)) => {
                self.progress.objects_copied += 1;
                return Ok(None);
            }
            (RebuildStage::Pull { offset, chunks, .. }, Some(PeerReply::Damaged(why))) => {
                // That source's block is damaged: the object starts over
                // from others (peering stops if fewer than k are left).
                let source = rebuild.sources[chunks.len()];
                tracing::warn!(pg = self.pg, osd = source, offset, %why, "a rebuild's source is damaged; decoding from others");
                let mut avoid = rebuild.avoid.clone();
                avoid.push(source);
                let job = RebuildJob { object, to: rebuild.to, compare: rebuild.compare_asked, avoid };
                ec.rebuilds.push_front(job);
                return Ok(None);
            }
            (_, other) => return Err(format!("unexpected answer {other:?} while rebuilding a shard")),
        };
        match step {
            ChunkStep::Same => Ok(None),
            ChunkStep::Send(next, to, op) => {
                rebuild.stage = next;
                ec.stage = Some(EcStage::Rebuild(Box::new(rebuild)));
                Ok(Some((to, op)))
            }
        }
    }

    /// Once the sizes are in: an object gone at the settled seq is removed
    /// on the target too; any other is decoded from its first chunk.
    fn first_step(&mut self, ec: &EcRecovery, rebuild: &mut Rebuild, authority: OsdId) -> Result<ChunkStep, String> {
        if rebuild.sizes.iter().all(Option::is_none) {
            let object = rebuild.object.clone();
            return Ok(ChunkStep::Send(
                RebuildStage::Ids { meta: None, staged: 0 },
                authority,
                PeerOp::ObjectRequests { object },
            ));
        }
        self.chunk_step(ec, rebuild, authority, 0, Vec::new(), 0)
    }

    /// The chunk at `offset`, with `chunks` pulled of it so far: the next
    /// source's pull (a source whose shard ends before it gives zeros, with
    /// no request), or with all `k` in, the member's chunk decoded, and
    /// compared with the target's (a whole rebuild) or staged (a chunk of
    /// zeros is skipped: holes stay holes). Past the shard's end: the
    /// object's request ids, for its install, or nothing if every chunk
    /// compared equal.
    fn chunk_step(
        &mut self,
        ec: &EcRecovery,
        rebuild: &mut Rebuild,
        authority: OsdId,
        mut offset: u64,
        mut chunks: Vec<Vec<u8>>,
        staged: u64,
    ) -> Result<ChunkStep, String> {
        let k = rebuild.sources.len();
        let size = EcRecovery::size(rebuild);
        let mut staged = staged;
        loop {
            if offset >= size {
                if rebuild.compare {
                    return Ok(ChunkStep::Same);
                }
                let meta = Some(ObjectMeta { size, preallocated: false, attrs: Vec::new(), omap: Vec::new() });
                let object = rebuild.object.clone();
                return Ok(ChunkStep::Send(
                    RebuildStage::Ids { meta, staged },
                    authority,
                    PeerOp::ObjectRequests { object },
                ));
            }
            let len = (size - offset).min(u64::from(CHUNK_BYTES));
            while chunks.len() < k {
                let index = chunks.len();
                let held = rebuild.sizes[index].unwrap_or(0).saturating_sub(offset).min(len);
                if held == 0 {
                    chunks.push(Vec::new());
                    continue;
                }
                let op = PeerOp::Pull { object: rebuild.object.clone(), offset, len: held as u32 };
                return Ok(ChunkStep::Send(RebuildStage::Pull { offset, chunks, staged }, rebuild.sources[index], op));
            }
            // Whole 64-byte columns, zeros past each source's end.
            let columns = len.div_ceil(COLUMN) * COLUMN;
            let mut shards: Vec<Option<Vec<u8>>> = vec![None; ec.shards.len()];
            for (source, chunk) in rebuild.sources.iter().zip(std::mem::take(&mut chunks)) {
                let position = ec.shards.iter().position(|m| m == source).expect("sources are members");
                let mut bytes = chunk;
                bytes.resize(columns as usize, 0);
                shards[position] = Some(bytes);
            }
            let target = ec.shards.iter().position(|m| *m == rebuild.to).expect("the target is a member");
            debug_assert_ne!(rebuild.to, NO_OSD);
            Codec::new(ec.profile).reconstruct(&mut shards).map_err(|e| format!("decoding a shard: {e}"))?;
            let mut data = shards[target].take().expect("reconstructed");
            data.truncate(len as usize);
            let at = offset;
            offset += len;
            if rebuild.compare {
                let crc = crc32c::crc32c(&data);
                let op = PeerOp::ChunkDigest { object: rebuild.object.clone(), offset: at, len: len as u32 };
                return Ok(ChunkStep::Send(RebuildStage::Compare { next: offset, crc }, rebuild.to, op));
            }
            if data.iter().all(|b| *b == 0) {
                continue;
            }
            self.progress.bytes_copied += data.len() as u64;
            staged += data.len() as u64;
            let op = PeerOp::Stage { object: rebuild.object.clone(), offset: at, data };
            return Ok(ChunkStep::Send(RebuildStage::Stage { next: offset, staged }, rebuild.to, op));
        }
    }
}

#[cfg(test)]
mod tests {
    use duplex_ec::{Codec, Profile};
    use duplex_proto::peering::ScrubReport;

    use super::*;

    fn info(last_seq: u64) -> PeerInfo {
        PeerInfo {
            last_seq,
            last_epoch: 5,
            last_active: 3,
            history_from: 1,
            backfilling: false,
            position_lost: false,
            log_lost: false,
        }
    }

    fn id(seq: u64) -> LoggedRequest {
        LoggedRequest { client: 1, tid: seq, seq }
    }

    /// Starts a 2+1 PG on [0, 1, 2] last active on them, answers the
    /// queries with these last seqs, and returns the machine and its next actions.
    fn queried(seqs: [u64; 3]) -> (Peering, Vec<Action>) {
        let profile = Profile::new(2, 1, 4096).unwrap();
        let (mut machine, actions) = Peering::start_erasure(7, 9, vec![0, 1, 2], Some(vec![0, 1, 2]), profile, None);
        let mut next = Vec::new();
        for action in actions {
            let Action::Send { to, tag, op: PeerOp::Query } = action else { panic!("{action:?}") };
            let requests = (1..=seqs[to as usize]).map(id).collect();
            next = machine.on_reply(tag, PeerReply::Info { info: info(seqs[to as usize]), requests });
        }
        (machine, next)
    }

    fn send(actions: &[Action]) -> (OsdId, u64, PeerOp) {
        match actions {
            [Action::Send { to, tag, op }] => (*to, *tag, op.clone()),
            other => panic!("expected one request, got {other:?}"),
        }
    }

    /// Answers `Done` to the settles (each member's seq in `to`) and
    /// returns what follows them.
    fn settle_all(machine: &mut Peering, mut actions: Vec<Action>, to: [u64; 3]) -> Vec<Action> {
        for osd in [0, 1, 2] {
            let (at, tag, op) = send(&actions);
            let to = to[osd as usize];
            assert_eq!(
                (at, op),
                (osd, PeerOp::Settle { to, replaced: false }),
                "every member settles, in position order"
            );
            actions = machine.on_reply(tag, PeerReply::Done);
        }
        actions
    }

    #[test]
    fn an_entry_fewer_than_k_shards_logged_is_rolled_back_and_forgotten() {
        // The primary logged seq 11; the others never got it.
        let (mut machine, actions) = queried([11, 10, 10]);
        let actions = settle_all(&mut machine, actions, [10; 3]);
        // No one behind: the members activate at 10, without 11's id.
        let activations: Vec<&PeerOp> = actions
            .iter()
            .map(|a| match a {
                Action::Send { op, .. } => op,
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(!activations.is_empty());
        for op in activations {
            let PeerOp::Activate { last_seq, requests, .. } = op else { panic!("{op:?}") };
            assert_eq!(*last_seq, 10);
            assert!(requests.iter().all(|r| r.seq <= 10), "a rolled-back id survives: {requests:?}");
        }
    }

    #[test]
    fn a_shard_that_missed_an_entry_k_logged_is_rebuilt_from_the_others() {
        let (mut machine, actions) = queried([10, 10, 9]);
        // The sources hold seq 10 back until activation; osd.2, rebuilt
        // next, applies its log first.
        let actions = settle_all(&mut machine, actions, [10, 10, u64::MAX]);
        // The authority (the primary) names what osd.2 missed.
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (0, PeerOp::Touched { after: 9, after_epoch: 5, through: 10 }));
        let actions = machine.on_reply(tag, PeerReply::Touched(Some(vec![b"o".to_vec()])));
        // Sizes from the two data shards, then their bytes.
        let data: [Vec<u8>; 2] = [(0..4096).map(|i| i as u8).collect(), vec![7; 3000]];
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (0, PeerOp::Stat { object: b"o".to_vec() }));
        let meta =
            |size: usize| Some(ObjectMeta { size: size as u64, preallocated: false, attrs: vec![], omap: vec![] });
        let actions = machine.on_reply(tag, PeerReply::Meta(meta(data[0].len())));
        let (to, tag, _) = send(&actions);
        assert_eq!(to, 1);
        let actions = machine.on_reply(tag, PeerReply::Meta(meta(data[1].len())));
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (0, PeerOp::Pull { object: b"o".to_vec(), offset: 0, len: 4096 }));
        let actions = machine.on_reply(tag, PeerReply::Data(data[0].clone()));
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (1, PeerOp::Pull { object: b"o".to_vec(), offset: 0, len: 3000 }));
        let actions = machine.on_reply(tag, PeerReply::Data(data[1].clone()));
        // The parity shard, decoded, is staged on osd.2.
        let (to, tag, op) = send(&actions);
        let PeerOp::Stage { object, offset, data: staged } = op else { panic!("{op:?}") };
        assert_eq!((to, object.as_slice(), offset), (2, &b"o"[..], 0));
        let mut second = data[1].clone();
        second.resize(4096, 0);
        let parity = Codec::new(Profile::new(2, 1, 4096).unwrap()).encode(&[&data[0], &second]).unwrap();
        assert!(staged == parity[0], "the rebuilt shard is not the parity of the others");
        let actions = machine.on_reply(tag, PeerReply::Done);
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (0, PeerOp::ObjectRequests { object: b"o".to_vec() }));
        let actions = machine.on_reply(tag, PeerReply::Requests(vec![id(10)]));
        let (to, tag, op) = send(&actions);
        let PeerOp::Install { meta, staged_bytes, requests, .. } = op else { panic!("{op:?}") };
        assert_eq!((to, meta.map(|m| m.size), staged_bytes, requests), (2, Some(4096), 4096, vec![id(10)]));
        let actions = machine.on_reply(tag, PeerReply::Done);
        assert!(actions.iter().all(|a| matches!(a, Action::Send { op: PeerOp::Activate { last_seq: 10, .. }, .. })));
    }

    /// The shards a test cluster holds: per OSD, per object, its shard
    /// bytes; and what each member is asked, answered as its store would.
    #[derive(Default)]
    struct Shards {
        held: BTreeMap<OsdId, BTreeMap<Vec<u8>, Vec<u8>>>,
        staged: BTreeMap<OsdId, Vec<(u64, Vec<u8>)>>,
        installs: Vec<(OsdId, Vec<u8>)>,
        /// Shards whose blocks fail their checksum where they are read.
        damaged: BTreeSet<(OsdId, Vec<u8>)>,
        settled: Vec<(OsdId, u64, bool)>,
        activated: Vec<(OsdId, Vec<OsdId>, u64)>,
    }

    impl Shards {
        fn answer(&mut self, to: OsdId, op: PeerOp) -> PeerReply {
            let held = self.held.entry(to).or_default();
            match op {
                PeerOp::Settle { to: seq, replaced } => {
                    self.settled.push((to, seq, replaced));
                    PeerReply::Done
                }
                PeerOp::List { cursor } => {
                    // Pages of one name, to walk the paging too.
                    let next = held.keys().find(|name| cursor.is_empty() || **name > cursor).cloned();
                    let more = next.as_ref().is_some_and(|n| held.keys().any(|o| o > n));
                    PeerReply::Names { objects: next.into_iter().collect(), more }
                }
                PeerOp::Stat { object } => PeerReply::Meta(held.get(&object).map(|b| ObjectMeta {
                    size: b.len() as u64,
                    preallocated: false,
                    attrs: vec![],
                    omap: vec![],
                })),
                PeerOp::Pull { object, offset, len } => {
                    if self.damaged.contains(&(to, object.clone())) {
                        return PeerReply::Damaged("checksum mismatch".into());
                    }
                    let bytes = &held[&object];
                    let from = (offset as usize).min(bytes.len());
                    let to = (from + len as usize).min(bytes.len());
                    PeerReply::Data(bytes[from..to].to_vec())
                }
                PeerOp::ChunkDigest { object, offset, len } => PeerReply::ChunkDigest(held.get(&object).map(|b| {
                    let from = (offset as usize).min(b.len());
                    crc32c::crc32c(&b[from..(from + len as usize).min(b.len())])
                })),
                PeerOp::Stage { offset, data, .. } => {
                    self.staged.entry(to).or_default().push((offset, data));
                    PeerReply::Done
                }
                PeerOp::ObjectRequests { .. } => PeerReply::Requests(vec![id(10)]),
                PeerOp::Install { object, meta, .. } => {
                    let staged = self.staged.remove(&to).unwrap_or_default();
                    match meta {
                        None => {
                            held.remove(&object);
                        }
                        Some(meta) => {
                            let mut bytes = vec![0; meta.size as usize];
                            for (offset, data) in staged {
                                bytes[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                            }
                            held.insert(object.clone(), bytes);
                        }
                    }
                    self.damaged.remove(&(to, object.clone()));
                    self.installs.push((to, object));
                    PeerReply::Done
                }
                PeerOp::Activate { members, last_seq, .. } => {
                    self.activated.push((to, members, last_seq));
                    PeerReply::Done
                }
                other => panic!("osd.{to} asked {other:?}"),
            }
        }

        /// Runs the machine to its end from `actions`, answering every
        /// request; returns its last actions.
        fn run(&mut self, machine: &mut Peering, mut actions: Vec<Action>) -> Vec<Action> {
            loop {
                let mut next = Vec::new();
                for action in &actions {
                    match action {
                        Action::Send { to, tag, op } => {
                            next.extend(machine.on_reply(*tag, self.answer(*to, op.clone())))
                        }
                        Action::Record { members } => next.extend(machine.on_recorded(Some(members))),
                        _ => {}
                    }
                }
                if next.is_empty() {
                    return actions;
                }
                actions = next;
            }
        }
    }

    /// Objects of a 2+1 code (4 KiB unit), one stripe each, encoded: each
    /// shard's bytes.
    fn encoded(objects: &[(&[u8], [u8; 2])]) -> [BTreeMap<Vec<u8>, Vec<u8>>; 3] {
        encoded_as(Profile::new(2, 1, 4096).unwrap(), objects).try_into().unwrap()
    }

    fn encoded_as(profile: Profile, objects: &[(&[u8], [u8; 2])]) -> Vec<BTreeMap<Vec<u8>, Vec<u8>>> {
        let mut shards: Vec<BTreeMap<Vec<u8>, Vec<u8>>> = vec![BTreeMap::new(); profile.shards()];
        for (name, fill) in objects {
            let data = [vec![fill[0]; 4096], vec![fill[1]; 4096]];
            let parity = Codec::new(profile).encode(&[&data[0], &data[1]]).unwrap();
            for (shard, bytes) in data.into_iter().chain(parity).enumerate() {
                shards[shard].insert(name.to_vec(), bytes);
            }
        }
        shards
    }

    /// Scrubs (with repair) a level PG of `profile` on OSDs 0.. holding
    /// `cluster`'s shards; returns its report.
    fn scrub(profile: Profile, cluster: &mut Shards) -> ScrubReport {
        let shards: Vec<OsdId> = (0..profile.shards() as u32).collect();
        let (mut machine, next) = started(profile, shards.clone(), shards, Some(true), |_| info(10));
        let last = cluster.run(&mut machine, next);
        assert!(matches!(last.as_slice(), [Action::Active { last_seq: 10, .. }]), "{last:?}");
        machine.scrub_report().expect("a scrub ran").clone()
    }

    #[test]
    fn a_scrub_rebuilds_a_damaged_shard_block_and_locates_a_silent_liar_when_the_code_can() {
        let objects: &[(&[u8], [u8; 2])] = &[(b"a", [1, 2]), (b"b", [3, 4])];
        // 2+1: osd.1's block of "a" fails its checksum.
        let profile = Profile::new(2, 1, 4096).unwrap();
        let truth = encoded_as(profile, objects);
        let mut cluster = Shards::default();
        for (osd, held) in truth.iter().enumerate() {
            cluster.held.insert(osd as OsdId, held.clone());
        }
        cluster.held.get_mut(&1).unwrap().insert(b"a".to_vec(), vec![0xee; 4096]);
        cluster.damaged.insert((1, b"a".to_vec()));
        let report = scrub(profile, &mut cluster);
        assert_eq!((report.objects, report.repaired), (2, 1), "{report:?}");
        assert_eq!(report.inconsistent.len(), 1);
        assert_eq!((report.inconsistent[0].bad.clone(), report.inconsistent[0].unrepairable), (vec![1], false));
        assert_eq!(cluster.held[&1], truth[1], "the damaged shard was not rebuilt");
        // 2+2: osd.3's parity of "b" silently wrong: the other three agree.
        let profile = Profile::new(2, 2, 4096).unwrap();
        let truth = encoded_as(profile, objects);
        let mut cluster = Shards::default();
        for (osd, held) in truth.iter().enumerate() {
            cluster.held.insert(osd as OsdId, held.clone());
        }
        cluster.held.get_mut(&3).unwrap().get_mut(&b"b"[..]).unwrap()[100] ^= 1;
        let report = scrub(profile, &mut cluster);
        assert_eq!(report.repaired, 1, "{report:?}");
        assert_eq!(report.inconsistent[0].bad, vec![3]);
        assert_eq!(cluster.held[&3], truth[3]);
        // 2+1: a silent disagreement no single shard explains: reported, not repaired.
        let profile = Profile::new(2, 1, 4096).unwrap();
        let truth = encoded_as(profile, objects);
        let mut cluster = Shards::default();
        for (osd, held) in truth.iter().enumerate() {
            cluster.held.insert(osd as OsdId, held.clone());
        }
        cluster.held.get_mut(&0).unwrap().get_mut(&b"a"[..]).unwrap()[7] ^= 1;
        let report = scrub(profile, &mut cluster);
        assert_eq!(report.repaired, 0);
        assert!(report.inconsistent[0].unrepairable, "{report:?}");
        assert!(cluster.installs.is_empty());
    }

    /// The scrub lists every member, not the authority alone: an object
    /// only one member holds (fewer than `k`, so no stripe of it decodes)
    /// is found and reported, and left alone.
    #[test]
    fn a_scrub_finds_an_object_only_another_member_holds() {
        let profile = Profile::new(2, 1, 4096).unwrap();
        let truth = encoded_as(profile, &[(b"a", [1, 2])]);
        let mut cluster = Shards::default();
        for (osd, held) in truth.iter().enumerate() {
            cluster.held.insert(osd as OsdId, held.clone());
        }
        cluster.held.get_mut(&2).unwrap().insert(b"z".to_vec(), vec![5; 4096]);
        let report = scrub(profile, &mut cluster);
        assert_eq!(report.objects, 2, "{report:?}");
        assert_eq!(report.inconsistent.len(), 1, "{report:?}");
        assert_eq!(report.inconsistent[0].object, b"z".to_vec());
        assert!(report.inconsistent[0].unrepairable, "one shard of two needed: {report:?}");
        assert!(cluster.installs.is_empty());
    }

    /// Starts a 2+1 PG on `shards` (positional), last active on [0, 1, 2],
    /// with these infos.
    fn start(shards: Vec<OsdId>, infos: &BTreeMap<OsdId, PeerInfo>) -> (Peering, Vec<Action>) {
        let profile = Profile::new(2, 1, 4096).unwrap();
        started(profile, shards, vec![0, 1, 2], None, |osd| infos[&osd])
    }

    /// Starts a PG of `profile` on `shards` (positional), last active on
    /// `active_set`, answers its queries with `info_of` each member, and
    /// returns the machine and what follows.
    fn started(
        profile: Profile,
        shards: Vec<OsdId>,
        active_set: Vec<OsdId>,
        scrub: Option<bool>,
        info_of: impl Fn(OsdId) -> PeerInfo,
    ) -> (Peering, Vec<Action>) {
        let (mut machine, actions) = Peering::start_erasure(7, 9, shards, Some(active_set), profile, scrub);
        let mut next = Vec::new();
        for action in actions {
            let Action::Send { to, tag, op: PeerOp::Query } = action else { panic!("{action:?}") };
            next.extend(machine.on_reply(tag, PeerReply::Info { info: info_of(to), requests: vec![id(10)] }));
        }
        (machine, next)
    }

    #[test]
    fn a_member_of_an_older_interval_is_rebuilt_whole_and_only_what_differs_is_installed() {
        let truth = encoded(&[(b"a", [1, 2]), (b"b", [3, 4])]);
        let mut cluster = Shards::default();
        for osd in [0, 1] {
            cluster.held.insert(osd, truth[osd as usize].clone());
        }
        // osd.2 missed an interval: "a" changed meanwhile, "c" was removed.
        let stale = encoded(&[(b"a", [9, 9]), (b"b", [3, 4]), (b"c", [5, 5])]);
        cluster.held.insert(2, stale[2].clone());
        let infos = BTreeMap::from([(0, info(10)), (1, info(10)), (2, PeerInfo { last_active: 2, ..info(4) })]);
        let (mut machine, actions) = start(vec![0, 1, 2], &infos);
        let last = cluster.run(&mut machine, actions);
        assert!(matches!(last.as_slice(), [Action::Active { last_seq: 10, .. }]), "{last:?}");
        assert_eq!(cluster.held[&2], truth[2], "the rebuilt shard is not the code of the others");
        assert_eq!(
            cluster.installs,
            vec![(2, b"a".to_vec()), (2, b"c".to_vec())],
            "only the objects that differ are written"
        );
        // The stale member applies its own log and reports its position
        // unknown until activation; the current ones settle at 10.
        assert_eq!(cluster.settled, vec![(0, 10, false), (1, 10, false), (2, u64::MAX, true)]);
    }

    #[test]
    fn a_degraded_pg_activates_with_a_hole_and_a_lost_log_is_rebuilt_when_back() {
        let truth = encoded(&[(b"a", [1, 2])]);
        // osd.1 down: the others serve, positionally, with a hole.
        let mut cluster = Shards::default();
        cluster.held.insert(0, truth[0].clone());
        cluster.held.insert(2, truth[2].clone());
        let infos = BTreeMap::from([(0, info(10)), (2, info(10))]);
        let (mut machine, actions) = start(vec![0, NO_OSD, 2], &infos);
        assert_eq!(machine.record_members(), vec![0, NO_OSD, 2]);
        let last = cluster.run(&mut machine, actions);
        assert!(matches!(last.as_slice(), [Action::Active { last_seq: 10, .. }]), "{last:?}");
        assert!(cluster.activated.iter().all(|(_, members, _)| *members == vec![0, NO_OSD, 2]));
        // Back, with its log lost (and a damaged shard): rebuilt whole.
        let mut cluster = Shards::default();
        cluster.held.insert(0, truth[0].clone());
        cluster.held.insert(1, encoded(&[(b"a", [0, 7])])[1].clone());
        cluster.held.insert(2, truth[2].clone());
        let infos = BTreeMap::from([(0, info(10)), (1, PeerInfo { position_lost: true, ..info(10) }), (2, info(10))]);
        let (mut machine, actions) = start(vec![0, 1, 2], &infos);
        let last = cluster.run(&mut machine, actions);
        assert!(matches!(last.as_slice(), [Action::Active { last_seq: 10, .. }]), "{last:?}");
        assert_eq!(cluster.held[&1], truth[1]);
    }

    #[test]
    fn a_parity_shard_rebuilt_from_data_shards_that_end_mid_column_keeps_its_whole_columns() {
        // A 101-byte write to a 2+2 object: data shard 0 holds 101 bytes,
        // shard 1 none, and each parity whole 64-byte columns (128 bytes).
        // The rebuilt parity is as long as the one it replaces, so a later
        // compare finds them equal instead of rewriting it every time.
        let profile = Profile::new(2, 2, 4096).unwrap();
        let data: Vec<u8> = (1..=101).collect();
        let mut padded = data.clone();
        padded.resize(128, 0);
        let parity = Codec::new(profile).encode(&[&padded, &[0u8; 128]]).unwrap();
        let mut cluster = Shards::default();
        cluster.held.insert(0, BTreeMap::from([(b"t".to_vec(), data)]));
        cluster.held.insert(1, BTreeMap::from([(b"t".to_vec(), Vec::new())]));
        cluster.held.insert(2, BTreeMap::from([(b"t".to_vec(), parity[0].clone())]));
        cluster.held.insert(3, BTreeMap::new()); // a new OSD at the second parity's position
                                                 // osd.3 missed an interval: rebuilt whole.
        let older = |osd: OsdId| if osd == 3 { PeerInfo { last_active: 2, ..info(4) } } else { info(10) };
        let (mut machine, next) = started(profile, vec![0, 1, 2, 3], vec![0, 1, 2, 3], None, older);
        let last = cluster.run(&mut machine, next);
        assert!(matches!(last.as_slice(), [Action::Active { .. }]), "{last:?}");
        assert_eq!(cluster.held[&3][&b"t"[..]], parity[1], "the rebuilt parity lost bytes past the data's end");
    }

    #[test]
    fn a_damaged_source_is_avoided_and_the_shard_decoded_from_others() {
        let profile = Profile::new(2, 2, 4096).unwrap();
        let truth = encoded_as(profile, &[(b"a", [1, 2]), (b"b", [3, 4])]);
        let mut cluster = Shards::default();
        for osd in 0..3u32 {
            cluster.held.insert(osd, truth[osd as usize].clone());
        }
        cluster.held.insert(3, BTreeMap::new());
        cluster.damaged.insert((0, b"a".to_vec()));
        // osd.3 missed an interval: rebuilt whole.
        let older = |osd: OsdId| if osd == 3 { PeerInfo { last_active: 2, ..info(4) } } else { info(10) };
        let (mut machine, next) = started(profile, vec![0, 1, 2, 3], vec![0, 1, 2, 3], None, older);
        let last = cluster.run(&mut machine, next);
        assert!(matches!(last.as_slice(), [Action::Active { .. }]), "{last:?}");
        assert_eq!(cluster.held[&3], truth[3], "the shard was not rebuilt around the damaged source");
    }

    #[test]
    fn members_an_activation_missed_are_current_if_their_logs_end_where_the_newest_ones_do() {
        // Interval 3's activation reached osd.2 only (then a member failed):
        // it took no write, so osd.0 and osd.1 (last active in 2) hold the
        // same history. Simulator `--ec 2+1` seed 6 waited for good.
        let truth = encoded(&[(b"a", [1, 2])]);
        let mut cluster = Shards::default();
        for osd in 0..3 {
            cluster.held.insert(osd, truth[osd as usize].clone());
        }
        let older = PeerInfo { last_active: 2, ..info(10) };
        let infos = BTreeMap::from([(0, older), (1, older), (2, PeerInfo { last_active: 3, ..info(10) })]);
        let (mut machine, actions) = start(vec![0, 1, 2], &infos);
        let last = cluster.run(&mut machine, actions);
        assert!(matches!(last.as_slice(), [Action::Active { last_seq: 10, .. }]), "{last:?}");
        assert!(cluster.installs.is_empty(), "a member was rebuilt: {:?}", cluster.installs);
        assert_eq!(cluster.settled, vec![(0, 10, false), (1, 10, false), (2, 10, false)]);
    }

    #[test]
    fn fewer_than_k_current_members_leave_the_pg_waiting() {
        let profile = Profile::new(2, 1, 4096).unwrap();
        // (A member of an older interval whose log ends elsewhere than the
        // newest members' may lack acknowledged writes.)
        for (osd, changed) in
            [(2u32, PeerInfo { last_active: 2, ..info(7) }), (1, PeerInfo { position_lost: true, ..info(10) })]
        {
            // The other current member is down.
            let shards = if osd == 2 { vec![NO_OSD, 1, 2] } else { vec![0, 1, NO_OSD] };
            let (mut machine, actions) = Peering::start_erasure(7, 9, shards, Some(vec![0, 1, 2]), profile, None);
            let mut last = Vec::new();
            for action in actions {
                let Action::Send { to, tag, .. } = action else { panic!() };
                let answer = if to == osd { changed } else { info(10) };
                last = machine.on_reply(tag, PeerReply::Info { info: answer, requests: vec![] });
            }
            assert!(matches!(last.as_slice(), [Action::Stuck(why)] if why.contains("needed to decode")), "{last:?}");
        }
        // A member the last active set names at another position is not current.
        let (mut machine, actions) = Peering::start_erasure(7, 9, vec![0, 2, 1], Some(vec![0, 1, 2]), profile, None);
        let mut last = Vec::new();
        for action in actions {
            let Action::Send { tag, .. } = action else { panic!() };
            last = machine.on_reply(tag, PeerReply::Info { info: info(10), requests: vec![] });
        }
        assert!(matches!(last.as_slice(), [Action::Stuck(_)]), "{last:?}");
    }
}
