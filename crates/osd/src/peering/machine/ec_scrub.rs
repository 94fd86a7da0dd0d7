//! A deep scrub of an erasure-coded PG, after its recovery: every object's
//! shards, read chunk by chunk from every member, must be one code word
//! per stripe (the parity the code of the data).
//!
//! - A block that fails its checksum where a member reads it
//!   ([`PeerReply::Damaged`]), or an object a member lacks that others
//!   hold, makes that shard bad.
//! - A stripe whose shards disagree with no block damaged: with more than
//!   `k` other good shards, the one shard whose exclusion makes the rest
//!   agree is bad; otherwise (a 2+1 code cannot tell which of three shards
//!   lies) the object is reported inconsistent and not repaired.
//! - With `repair`, each bad shard is rebuilt from `k` others, avoiding
//!   the bad ones (as recovery rebuilds one).

use duplex_ec::codec::COLUMN;
use duplex_ec::Codec;
use duplex_map::NO_OSD;
use duplex_proto::peering::{Inconsistency, ScrubReport};

use super::erasure::{EcRecovery, EcStage, RebuildJob};
use super::*;

pub(super) struct EcScrub {
    repair: bool,
    /// The objects still to scrub (`None`: not listed yet).
    objects: Option<VecDeque<Vec<u8>>>,
    report: ScrubReport,
    finished: bool,
}

impl EcScrub {
    pub(super) fn new(repair: bool) -> EcScrub {
        EcScrub { repair, objects: None, report: ScrubReport::default(), finished: false }
    }
}

enum Phase {
    /// Asked position `next` for its shard's size.
    Stat { next: usize },
    /// Pulling the chunk at `offset` from position `next`.
    Pull { offset: u64, next: usize },
}

/// One object being scrubbed.
pub(super) struct ObjectScrub {
    object: Vec<u8>,
    /// By position: `None`, no member there; `Some(None)`, the object is
    /// absent there; else its shard's size.
    held: Vec<Option<Option<u64>>>,
    phase: Phase,
    /// The chunk being checked, by position (`None`: not read there).
    chunks: Vec<Option<Vec<u8>>>,
    bad: BTreeSet<usize>,
    unrepairable: bool,
}

impl Peering {
    /// The scrub's next request once recovery's own work is done (`None`:
    /// no scrub, or it is finished, its repairs queued and its report kept).
    pub(super) fn ec_scrub_next(&mut self, ec: &mut EcRecovery) -> Result<Option<(OsdId, PeerOp)>, String> {
        loop {
            let Some(scrub) = ec.scrub.as_mut() else { return Ok(None) };
            if scrub.finished {
                return Ok(None);
            }
            let Some(objects) = scrub.objects.as_mut() else {
                // Recovery's rebuilds are done: every member holds the PG
                // at its seq, and may be a repair's source.
                ec.whole = ec.shards.iter().copied().filter(|osd| *osd != NO_OSD).collect();
                // Every member's names: an object only some hold (fewer
                // than `k`: it cannot be decoded) is found and reported too.
                let at = ec.shards.iter().position(|osd| *osd != NO_OSD).expect("a PG with a member");
                ec.stage = Some(EcStage::ScrubList { names: BTreeSet::new(), at });
                return Ok(Some((ec.shards[at], PeerOp::List { cursor: Vec::new() })));
            };
            let Some(object) = objects.pop_front() else {
                scrub.finished = true;
                self.scrub_report = Some(scrub.report.clone());
                return Ok(None);
            };
            let n = ec.shards.len();
            let scrub = Box::new(ObjectScrub {
                object,
                held: vec![None; n],
                phase: Phase::Stat { next: 0 },
                chunks: vec![None; n],
                bad: BTreeSet::new(),
                unrepairable: false,
            });
            if let Some(next) = self.scrub_object(ec, scrub, None)? {
                return Ok(Some(next));
            }
        }
    }

    /// The answer to a scrub request: its next request, or `None` when the
    /// step it answered is done.
    pub(super) fn ec_scrub_answer(
        &mut self,
        ec: &mut EcRecovery,
        stage: EcStage,
        answer: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        match (stage, answer) {
            (EcStage::ScrubList { mut names, at }, Some(PeerReply::Names { objects, more })) => {
                let cursor = objects.last().cloned();
                names.extend(objects);
                if let (Some(cursor), true) = (cursor, more) {
                    ec.stage = Some(EcStage::ScrubList { names, at });
                    return Ok(Some((ec.shards[at], PeerOp::List { cursor })));
                }
                if let Some(next) = (at + 1..ec.shards.len()).find(|p| ec.shards[*p] != NO_OSD) {
                    ec.stage = Some(EcStage::ScrubList { names, at: next });
                    return Ok(Some((ec.shards[next], PeerOp::List { cursor: Vec::new() })));
                }
                let scrub = ec.scrub.as_mut().expect("a scrub lists");
                scrub.objects = Some(names.into_iter().collect());
                Ok(None)
            }
            (EcStage::ScrubObject(scrub), answer) => self.scrub_object(ec, scrub, answer),
            (_, answer) => Err(format!("unexpected answer {answer:?} while listing objects to scrub")),
        }
    }

    fn scrub_object(
        &mut self,
        ec: &mut EcRecovery,
        mut scrub: Box<ObjectScrub>,
        answer: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let n = ec.shards.len();
        match (&mut scrub.phase, answer) {
            (_, None) => {}
            (Phase::Stat { next }, Some(PeerReply::Meta(meta))) => {
                scrub.held[*next] = Some(meta.map(|m| m.size));
                *next += 1;
            }
            (Phase::Pull { next, .. }, Some(PeerReply::Data(data))) => {
                scrub.chunks[*next] = Some(data);
                *next += 1;
            }
            (Phase::Pull { next, .. }, Some(PeerReply::Damaged(why))) => {
                tracing::warn!(pg = self.pg, osd = ec.shards[*next], %why, "a scrub found a damaged shard block");
                scrub.bad.insert(*next);
                *next += 1;
            }
            (_, other) => return Err(format!("unexpected answer {other:?} while scrubbing an erasure-coded object")),
        }
        loop {
            match scrub.phase {
                Phase::Stat { mut next } => {
                    while next < n && ec.shards[next] == NO_OSD {
                        next += 1;
                    }
                    if next < n {
                        scrub.phase = Phase::Stat { next };
                        let op = PeerOp::Stat { object: scrub.object.clone() };
                        ec.stage = Some(EcStage::ScrubObject(scrub));
                        return Ok(Some((ec.shards[next], op)));
                    }
                    if scrub.held.iter().flatten().all(Option::is_none) {
                        return Ok(None); // gone from every member meanwhile
                    }
                    for (position, held) in scrub.held.iter().enumerate() {
                        if *held == Some(None) {
                            scrub.bad.insert(position); // others hold it
                        }
                    }
                    scrub.phase = Phase::Pull { offset: 0, next: 0 };
                }
                Phase::Pull { offset, mut next } => {
                    let size = scrub.held.iter().flatten().flatten().copied().max().unwrap_or(0);
                    if offset >= size || scrub.unrepairable {
                        self.finish_object_scrub(ec, *scrub);
                        return Ok(None);
                    }
                    let len = (size - offset).min(u64::from(CHUNK_BYTES));
                    while next < n {
                        let held = match scrub.held[next] {
                            Some(Some(shard_size)) if !scrub.bad.contains(&next) => {
                                shard_size.saturating_sub(offset).min(len)
                            }
                            _ => {
                                scrub.chunks[next] = None;
                                next += 1;
                                continue;
                            }
                        };
                        if held == 0 {
                            scrub.chunks[next] = Some(Vec::new()); // past its end: zeros
                            next += 1;
                            continue;
                        }
                        scrub.phase = Phase::Pull { offset, next };
                        let op = PeerOp::Pull { object: scrub.object.clone(), offset, len: held as u32 };
                        ec.stage = Some(EcStage::ScrubObject(scrub));
                        return Ok(Some((ec.shards[next], op)));
                    }
                    judge_chunk(ec, &mut scrub, len);
                    scrub.chunks = vec![None; n];
                    scrub.phase = Phase::Pull { offset: offset + len, next: 0 };
                }
            }
        }
    }

    /// Reports the object if a shard of it is bad, and queues the repairs.
    fn finish_object_scrub(&mut self, ec: &mut EcRecovery, scrub: ObjectScrub) {
        let report_bad = |positions: &mut dyn Iterator<Item = usize>| -> Vec<OsdId> {
            positions.map(|p| ec.shards[p]).filter(|osd| *osd != NO_OSD).collect()
        };
        let bad = if scrub.unrepairable && scrub.bad.is_empty() {
            // Which shard lies is unknown: every member is named.
            report_bad(&mut (0..ec.shards.len()))
        } else {
            report_bad(&mut scrub.bad.iter().copied())
        };
        // A repair decodes from `k` members it does not blame.
        let sources = ec.whole.iter().filter(|osd| !bad.contains(osd)).count();
        let unrepairable = scrub.unrepairable || sources < ec.profile.k();
        let scrub = ObjectScrub { unrepairable, ..scrub };
        let state = ec.scrub.as_mut().expect("a scrub runs");
        state.report.objects += 1;
        if bad.is_empty() {
            return;
        }
        tracing::warn!(pg = self.pg, object = ?String::from_utf8_lossy(&scrub.object), ?bad, unrepairable = scrub.unrepairable, "an erasure-coded object's shards disagree");
        if state.repair && !scrub.unrepairable {
            for to in &bad {
                ec.rebuilds.push_back(RebuildJob {
                    object: scrub.object.clone(),
                    to: *to,
                    compare: false,
                    avoid: bad.clone(),
                });
            }
            state.report.repaired += bad.len() as u64;
        }
        state.report.inconsistent.push(Inconsistency { object: scrub.object, bad, unrepairable: scrub.unrepairable });
    }
}

/// Checks one chunk of every readable shard (whole 64-byte columns, zeros
/// past each shard's end): a shard that disagrees with a code word the
/// others agree on is bad; a disagreement no single shard explains makes
/// the object unrepairable.
fn judge_chunk(ec: &EcRecovery, scrub: &mut ObjectScrub, len: u64) {
    let k = ec.profile.k();
    let columns = (len.div_ceil(COLUMN) * COLUMN) as usize;
    for chunk in scrub.chunks.iter_mut().flatten() {
        chunk.resize(columns, 0);
    }
    let readable: Vec<usize> = (0..scrub.chunks.len()).filter(|p| scrub.chunks[*p].is_some()).collect();
    if readable.len() < k {
        scrub.unrepairable = true;
        return;
    }
    let mut codec = Codec::new(ec.profile);
    // The positions of `subset` past its first `k` that disagree with the
    // code word those `k` decode to.
    let mut disagreeing = |subset: &[usize]| -> Option<Vec<usize>> {
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; scrub.chunks.len()];
        for p in &subset[..k] {
            shards[*p] = scrub.chunks[*p].clone();
        }
        codec.reconstruct(&mut shards).ok()?;
        Some(subset[k..].iter().copied().filter(|p| shards[*p] != scrub.chunks[*p]).collect())
    };
    match disagreeing(&readable) {
        Some(wrong) if wrong.is_empty() => return,
        None => {
            scrub.unrepairable = true;
            return;
        }
        Some(_) => {}
    }
    let liars: Vec<usize> = readable
        .iter()
        .copied()
        .filter(|liar| {
            let rest: Vec<usize> = readable.iter().copied().filter(|p| p != liar).collect();
            rest.len() > k && disagreeing(&rest).is_some_and(|wrong| wrong.is_empty())
        })
        .collect();
    match liars.as_slice() {
        [liar] => {
            scrub.bad.insert(*liar);
        }
        _ => scrub.unrepairable = true,
    }
}
