//! An erasure-coded PG's recovery: its members hold different shards, so
//! none is recovered from another's copy. Every member was active in the
//! PG's last interval at its shard position (peering refuses otherwise),
//! so their logs are prefixes of one primary's sequence, and each shard
//! applied only what every shard had logged (`Pg::apply_limit`).
//!
//! 1. **Where the PG resumes**: `S`, the newest seq at least `k` members
//!    logged (the k-th highest `last_seq`). An entry past it is held by
//!    fewer than `k` shards: its stripe cannot be decoded, and its write
//!    was never acknowledged (that needs every shard), so it is rolled
//!    back. Every entry through `S` is held by `k` or more: it stays.
//! 2. **Settle** every member at `S` (`PeerOp::Settle`): drop its entries
//!    after `S` (never applied: they were past every watermark), apply the
//!    rest.
//! 3. **Rebuild** each member behind `S`: the authority (a member whose
//!    log ends at `S`) names the objects its missing entries touched; each
//!    one's shard is decoded, chunk by chunk, from `k` members that hold
//!    `S`, and installed whole on the member (as a replicated copy is).
//! 4. Activate every member at `S`.

use duplex_ec::codec::COLUMN;
use duplex_ec::{Codec, Profile};

use super::*;

/// The erasure-coded part of a [`Recovery`].
pub(super) struct EcRecovery {
    profile: Profile,
    /// The members by shard position.
    shards: Vec<OsdId>,
    /// The seq every member settles at.
    settle_to: u64,
    /// Members with `last_seq >= settle_to`: the rebuilds' sources.
    whole: Vec<OsdId>,
    to_settle: VecDeque<OsdId>,
    /// Members behind `settle_to`: (member, its last seq, that entry's epoch).
    behind: VecDeque<(OsdId, u64, u32)>,
    /// Objects whose shard a member needs rebuilt.
    rebuilds: VecDeque<(Vec<u8>, OsdId)>,
    /// The step with a request out.
    stage: Option<EcStage>,
}

pub(super) enum EcStage {
    Settle,
    Touched(OsdId),
    Rebuild(Box<Rebuild>),
}

pub(super) struct Rebuild {
    object: Vec<u8>,
    to: OsdId,
    /// `k` members holding `settle_to`, by shard position.
    sources: Vec<OsdId>,
    /// Each source's shard size (`None`: it has no such object).
    sizes: Vec<Option<u64>>,
    stage: RebuildStage,
}

enum RebuildStage {
    /// Asked source `sizes.len()` for its shard's size.
    Stat,
    /// Pulling the chunk at `offset`: the answers so far, by source.
    Pull {
        offset: u64,
        chunks: Vec<Vec<u8>>,
        staged: u64,
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

impl EcRecovery {
    /// Whether a request of this recovery is out.
    pub(super) fn waits(&self) -> bool {
        self.stage.is_some()
    }

    /// The rebuilt shard's size: its sources' largest (a shard the last
    /// writes left short reads as zeros past its end either way).
    fn size(rebuild: &Rebuild) -> u64 {
        rebuild.sizes.iter().flatten().copied().max().unwrap_or(0)
    }
}

impl Peering {
    /// Recovery of an erasure-coded PG whose members all answered (see the
    /// module's steps). Stuck when the members cannot be placed on one
    /// history yet (a lost log, an unfinished backfill, a member of an
    /// older interval).
    pub(super) fn recover_erasure(
        &mut self,
        profile: Profile,
        infos: BTreeMap<OsdId, PeerInfo>,
        mut logged: BTreeMap<OsdId, Vec<LoggedRequest>>,
    ) -> Vec<Action> {
        let pg = self.pg;
        if let Some((osd, _)) = infos.iter().find(|(_, i)| i.backfilling || i.position_lost) {
            return self.stuck(format!(
                "PG {pg:#x} is erasure-coded and osd.{osd} lost its log or holds an unfinished copy; rebuilding a \
                 whole shard is not built yet"
            ));
        }
        let newest = infos.values().map(|i| i.last_active).max().unwrap_or(0);
        let fresh = infos.values().all(|i| i.last_seq == 0);
        if !fresh {
            if let Some((osd, _)) = infos.iter().find(|(_, i)| i.last_active != newest) {
                return self.stuck(format!(
                    "PG {pg:#x} is erasure-coded and osd.{osd} missed its last interval; rebuilding a whole shard \
                     is not built yet"
                ));
            }
            let moved = self.active_set.as_ref().is_some_and(|set| *set != self.members);
            if moved {
                return self.stuck(format!(
                    "PG {pg:#x} is erasure-coded and its shards moved (last active on {:?}, now {:?}); rebuilding \
                     shards is not built yet",
                    self.active_set, self.members
                ));
            }
        }
        let k = profile.k();
        if self.members.len() < k {
            return self.stuck(format!("PG {pg:#x}: {} members of a {profile} code", self.members.len()));
        }
        let mut seqs: Vec<u64> = self.members.iter().map(|m| infos[m].last_seq).collect();
        seqs.sort_unstable_by(|a, b| b.cmp(a));
        let settle_to = seqs[k - 1];
        let primary = self.members[0];
        let authority = *self
            .members
            .iter()
            .filter(|m| infos[*m].last_seq == settle_to)
            .min_by_key(|m| **m != primary)
            .expect("the k-th seq is some member's");
        let info = infos[&authority];
        let whole: Vec<OsdId> = self.members.iter().copied().filter(|m| infos[m].last_seq >= settle_to).collect();
        let behind: VecDeque<(OsdId, u64, u32)> = self
            .members
            .iter()
            .filter(|m| infos[*m].last_seq < settle_to)
            .map(|m| (*m, infos[m].last_seq, infos[m].last_epoch))
            .collect();
        let rolled_back: Vec<OsdId> = whole.iter().copied().filter(|m| infos[m].last_seq > settle_to).collect();
        if !rolled_back.is_empty() || !behind.is_empty() {
            tracing::info!(
                pg,
                settle_to,
                rolled_back = ?rolled_back,
                behind = ?behind.iter().map(|(m, ..)| *m).collect::<Vec<_>>(),
                "an erasure-coded PG settles its members"
            );
        }
        // Ids of rolled-back entries are not the PG's: a resend runs again.
        for ids in logged.values_mut() {
            ids.retain(|id| id.seq <= settle_to);
        }
        let ec = EcRecovery {
            profile,
            shards: self.members.clone(),
            settle_to,
            whole: whole.clone(),
            // Every member: the behind ones apply their own (final) tails too.
            to_settle: self.members.iter().copied().collect(),
            behind,
            rebuilds: VecDeque::new(),
            stage: None,
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
                    ec.rebuilds.extend(objects.into_iter().map(|object| (object, target)));
                }
                (Some(EcStage::Touched(target)), Some(PeerReply::Touched(None))) => {
                    return Err(format!(
                        "PG {:#x}: osd.{target}'s shard is further behind than the history reaches; rebuilding a \
                         whole shard is not built yet",
                        self.pg
                    ));
                }
                (Some(EcStage::Rebuild(rebuild)), answer) => {
                    if let Some(next) = self.rebuild_step(ec, authority, *rebuild, answer)? {
                        return Ok(Some(next));
                    }
                }
                (None, None) => {
                    let to = ec.settle_to;
                    if let Some(osd) = ec.to_settle.pop_front() {
                        ec.stage = Some(EcStage::Settle);
                        return Ok(Some((osd, PeerOp::Settle { to })));
                    }
                    if let Some((target, after, after_epoch)) = ec.behind.pop_front() {
                        ec.stage = Some(EcStage::Touched(target));
                        return Ok(Some((authority, PeerOp::Touched { after, after_epoch, through: to })));
                    }
                    if let Some((object, to)) = ec.rebuilds.pop_front() {
                        let k = ec.profile.k();
                        let sources: Vec<OsdId> =
                            ec.shards.iter().copied().filter(|m| *m != to && ec.whole.contains(m)).take(k).collect();
                        if sources.len() < k {
                            return Err(format!("PG {:#x}: fewer than {k} whole shards to rebuild from", self.pg));
                        }
                        let first = sources[0];
                        let op = PeerOp::Stat { object: object.clone() };
                        let rebuild = Rebuild { object, to, sources, sizes: Vec::new(), stage: RebuildStage::Stat };
                        ec.stage = Some(EcStage::Rebuild(Box::new(rebuild)));
                        return Ok(Some((first, op)));
                    }
                    return Ok(None);
                }
                (stage, answer) => {
                    let stage = match stage {
                        Some(EcStage::Settle) => "settling",
                        Some(EcStage::Touched(_)) => "naming objects",
                        Some(EcStage::Rebuild(_)) => "rebuilding",
                        None => "no step",
                    };
                    return Err(format!("unexpected answer {answer:?} while {stage}"));
                }
            }
        }
    }

    /// The next request of one object's rebuild (`None`: installed).
    fn rebuild_step(
        &mut self,
        ec: &mut EcRecovery,
        authority: OsdId,
        mut rebuild: Rebuild,
        answer: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let k = rebuild.sources.len();
        let object = rebuild.object.clone();
        let (next, to, op) = match (std::mem::replace(&mut rebuild.stage, RebuildStage::Install), answer) {
            (RebuildStage::Stat, Some(PeerReply::Meta(meta))) => {
                rebuild.sizes.push(meta.map(|m| m.size));
                if rebuild.sizes.len() < k {
                    let to = rebuild.sources[rebuild.sizes.len()];
                    (RebuildStage::Stat, to, PeerOp::Stat { object })
                } else if rebuild.sizes.iter().all(Option::is_none) {
                    // Gone at the settled seq: removed on the member too.
                    (RebuildStage::Ids { meta: None, staged: 0 }, authority, PeerOp::ObjectRequests { object })
                } else {
                    self.chunk_step(ec, &mut rebuild, authority, 0, Vec::new(), 0)?
                }
            }
            (RebuildStage::Pull { offset, mut chunks, staged }, Some(PeerReply::Data(data))) => {
                chunks.push(data);
                self.chunk_step(ec, &mut rebuild, authority, offset, chunks, staged)?
            }
            (RebuildStage::Stage { next, staged }, Some(PeerReply::Done)) => {
                self.chunk_step(ec, &mut rebuild, authority, next, Vec::new(), staged)?
            }
            (RebuildStage::Ids { meta, staged }, Some(PeerReply::Requests(mut requests))) => {
                requests.retain(|id| id.seq <= ec.settle_to);
                (RebuildStage::Install, rebuild.to, PeerOp::Install { object, meta, staged_bytes: staged, requests })
            }
            (RebuildStage::Install, Some(PeerReply::Done)) => {
                self.progress.objects_copied += 1;
                return Ok(None);
            }
            (_, other) => return Err(format!("unexpected answer {other:?} while rebuilding a shard")),
        };
        rebuild.stage = next;
        ec.stage = Some(EcStage::Rebuild(Box::new(rebuild)));
        Ok(Some((to, op)))
    }

    /// The chunk at `offset`, with `chunks` pulled of it so far: the next
    /// source's pull (a source whose shard ends before it gives zeros, with
    /// no request), or with all `k` in, the member's chunk decoded and
    /// staged (a chunk of zeros is skipped: holes stay holes). Past the
    /// shard's end: the object's request ids, for its install.
    fn chunk_step(
        &mut self,
        ec: &EcRecovery,
        rebuild: &mut Rebuild,
        authority: OsdId,
        mut offset: u64,
        mut chunks: Vec<Vec<u8>>,
        staged: u64,
    ) -> Result<(RebuildStage, OsdId, PeerOp), String> {
        let k = rebuild.sources.len();
        let size = EcRecovery::size(rebuild);
        let mut staged = staged;
        loop {
            if offset >= size {
                let meta = Some(ObjectMeta { size, preallocated: false, attrs: Vec::new() });
                let object = rebuild.object.clone();
                return Ok((RebuildStage::Ids { meta, staged }, authority, PeerOp::ObjectRequests { object }));
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
                return Ok((RebuildStage::Pull { offset, chunks, staged }, rebuild.sources[index], op));
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
            Codec::new(ec.profile).reconstruct(&mut shards).map_err(|e| format!("decoding a shard: {e}"))?;
            let mut data = shards[target].take().expect("reconstructed");
            data.truncate(len as usize);
            let at = offset;
            offset += len;
            if data.iter().all(|b| *b == 0) {
                continue;
            }
            self.progress.bytes_copied += data.len() as u64;
            staged += data.len() as u64;
            let op = PeerOp::Stage { object: rebuild.object.clone(), offset: at, data };
            return Ok((RebuildStage::Stage { next: offset, staged }, rebuild.to, op));
        }
    }
}

#[cfg(test)]
mod tests {
    use duplex_ec::{Codec, Profile};

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
        let (mut machine, actions) = Peering::start_erasure(7, 9, vec![0, 1, 2], Some(vec![0, 1, 2]), profile);
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

    /// Answers `Done` to the settles and returns what follows them.
    fn settle_all(machine: &mut Peering, mut actions: Vec<Action>, to: u64) -> Vec<Action> {
        for osd in [0, 1, 2] {
            let (at, tag, op) = send(&actions);
            assert_eq!((at, op), (osd, PeerOp::Settle { to }), "every member settles, in position order");
            actions = machine.on_reply(tag, PeerReply::Done);
        }
        actions
    }

    #[test]
    fn an_entry_fewer_than_k_shards_logged_is_rolled_back_and_forgotten() {
        // The primary logged seq 11; the others never got it.
        let (mut machine, actions) = queried([11, 10, 10]);
        let actions = settle_all(&mut machine, actions, 10);
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
        let actions = settle_all(&mut machine, actions, 10);
        // The authority (the primary) names what osd.2 missed.
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (0, PeerOp::Touched { after: 9, after_epoch: 5, through: 10 }));
        let actions = machine.on_reply(tag, PeerReply::Touched(Some(vec![b"o".to_vec()])));
        // Sizes from the two data shards, then their bytes.
        let data: [Vec<u8>; 2] = [(0..4096).map(|i| i as u8).collect(), vec![7; 3000]];
        let (to, tag, op) = send(&actions);
        assert_eq!((to, op), (0, PeerOp::Stat { object: b"o".to_vec() }));
        let meta = |size: usize| Some(ObjectMeta { size: size as u64, preallocated: false, attrs: vec![] });
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

    #[test]
    fn a_member_of_an_older_interval_or_a_lost_log_leaves_the_pg_waiting() {
        let profile = Profile::new(2, 1, 4096).unwrap();
        for (osd, changed) in
            [(2u32, PeerInfo { last_active: 2, ..info(10) }), (1, PeerInfo { position_lost: true, ..info(10) })]
        {
            let (mut machine, actions) = Peering::start_erasure(7, 9, vec![0, 1, 2], Some(vec![0, 1, 2]), profile);
            let mut last = Vec::new();
            for action in actions {
                let Action::Send { to, tag, .. } = action else { panic!() };
                let answer = if to == osd { changed } else { info(10) };
                last = machine.on_reply(tag, PeerReply::Info { info: answer, requests: vec![] });
            }
            assert!(matches!(last.as_slice(), [Action::Stuck(why)] if why.contains("not built yet")), "{last:?}");
        }
    }
}
