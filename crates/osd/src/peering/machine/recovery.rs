//! Recovery: members behind in the history get the objects their gap
//! touched; others are compared by digest and copied whole (an object at a
//! time, staged and installed in one batch).

use super::*;

/// A primary behind by history by more entries than this hands its PG
/// over to be filled in the background; fewer, it is brought level inside
/// peering.
pub(super) const HAND_OVER_AFTER_ENTRIES: u64 = 8;

impl Peering {
    pub(super) fn recover(&mut self, answers: BTreeMap<OsdId, (PeerInfo, Vec<LoggedRequest>)>) -> Vec<Action> {
        assert!(self.members.iter().all(|m| answers.contains_key(m)), "recovery began before every member answered");
        let primary = self.members[0];
        let mut infos = BTreeMap::new();
        let mut logged = BTreeMap::new();
        for (osd, (info, requests)) in answers {
            infos.insert(osd, info);
            logged.insert(osd, requests);
        }
        // Only the OSDs of the last active set are known to hold every
        // acknowledged write: without one of them, any authority could be
        // older than what clients were told is written.
        let lost = self.active_set.as_ref().is_some_and(Vec::is_empty);
        if let Some(set) = self.active_set.as_ref().filter(|set| !set.is_empty()) {
            if !active_set_answered(set, &infos) {
                let names: Vec<String> = set.iter().map(|osd| format!("osd.{osd}")).collect();
                return self.stuck(format!(
                    "PG {:#x} is down: it was last active on {}, and none of them answered with its copy; \
                     waiting for one to come back (or for an operator to mark them lost)",
                    self.pg,
                    names.join(", ")
                ));
            }
        }
        if let Some(profile) = self.erasure {
            return self.recover_erasure(profile, infos, logged);
        }
        let Some((authority, info)) = choose_authority(primary, &infos, lost) else {
            return self.stuck(format!(
                "PG {:#x}: every member's copy is an unfinished backfill; waiting for an OSD that holds the whole PG",
                self.pg
            ));
        };
        debug_assert!(self.members.contains(&authority), "the authority osd.{authority} is no member");
        // The authority's key is the greatest among the copies it was chosen from.
        debug_assert!(
            infos.values().filter(|i| i.backfilling == info.backfilling).all(|i| rank(i) <= rank(&info)),
            "an authority behind another member it was chosen over"
        );
        // A target whose backfill ended, newer than every member: the
        // members recover from it inside peering (a PG with targets fills
        // nothing in the background), and it is filled again from the
        // primary afterwards, which finds it level.
        // (Not before a scrub: it compares the members' copies with the
        // authority's, a member's; the next peering will choose it.)
        let over = if self.scrub.is_none() { whole_target_over(&info, &self.whole_targets) } else { None };
        let (authority, info) = match over {
            Some(target) => {
                let (target_info, requests) = self.whole_targets[&target].clone();
                tracing::info!(
                    pg = self.pg,
                    target,
                    member = authority,
                    "a backfill target's whole copy is newer than every member's: the members recover from it"
                );
                logged.insert(target, requests);
                (target, target_info)
            }
            None => (authority, info),
        };
        let mut on_history = BTreeSet::from([authority]);
        let mut targets = VecDeque::new();
        for (osd, member) in infos.iter().filter(|(osd, _)| **osd != authority) {
            match plan_for(member, &info, self.interval) {
                None => {
                    on_history.insert(*osd);
                }
                Some(plan) => targets.push_back((*osd, plan)),
            }
        }
        // A PG never written to (seq 0) has nothing to fill: comparing the
        // lists inside peering is quicker than a second peering.
        let history_in_background = match self.plan_background(authority, info.last_seq, infos.len(), &mut targets) {
            Ok(history) => history,
            Err(acting) => {
                self.phase = Phase::HandingOver { acting: acting.clone() };
                return vec![Action::HandOver { acting }];
            }
        };
        let scrub = self.scrub.map(|repair| {
            // The authority first: its copies are the good ones when readable.
            let mut to_list: VecDeque<OsdId> = self.members.iter().copied().filter(|m| *m != authority).collect();
            to_list.push_front(authority);
            Scrub { repair, to_list, listing: None, digests: BTreeMap::new(), report: None }
        });
        let recovery = Box::new(Recovery {
            authority,
            info,
            targets,
            listing: None,
            work: VecDeque::new(),
            copy: None,
            changed: BTreeSet::new(),
            logged,
            on_history,
            waiting: None,
            scrub,
            history_in_background,
            ec: None,
        });
        self.step(recovery, None)
    }

    /// Which recovery goes to the background ([`Peering::fill_in_background`]),
    /// given the authority's `last_seq`, the number of members that answered
    /// and the plan for each one not level (`targets`). Members to backfill
    /// leave `targets` for `filled_in_background`; the members behind by
    /// history to fill there once the authority names their objects are
    /// returned. `Err(acting)`: the primary itself needs a backfill, and
    /// hands the PG over to that acting set.
    pub(super) fn plan_background(
        &mut self,
        authority: OsdId,
        last_seq: u64,
        answered: usize,
        targets: &mut VecDeque<(OsdId, Plan)>,
    ) -> Result<BTreeSet<OsdId>, Vec<OsdId>> {
        // A PG never written to (seq 0) has nothing to fill: comparing the
        // lists inside peering is quicker than a second peering.
        let allowed = self.scrub.is_none() && self.targets.is_empty() && last_seq > 0;
        let Some(min_size) = self.background_min.filter(|_| allowed) else { return Ok(BTreeSet::new()) };
        let primary = self.members[0];
        let to_fill: Vec<OsdId> =
            targets.iter().filter(|(_, plan)| *plan == Plan::Backfill).map(|(osd, _)| *osd).collect();
        debug_assert!(to_fill.len() < answered, "every member to fill, the authority too");
        if !to_fill.is_empty() && answered - to_fill.len() >= min_size {
            if to_fill.contains(&primary) {
                // The primary serves reads: it hands the PG to the
                // authority, whose peering fills it in the background.
                let mut acting = vec![authority];
                acting.extend(self.members.iter().copied().filter(|osd| *osd != authority));
                debug_assert_eq!(acting.len(), self.members.len(), "a hand-over keeps every member");
                return Err(acting);
            }
            targets.retain(|(osd, _)| !to_fill.contains(osd));
            tracing::info!(pg = self.pg, members = ?to_fill, "members to backfill are filled in the background");
            self.filled_in_background = to_fill;
            self.fill_only = None;
        }
        // Members behind by history too, if the whole ones still keep
        // min_size: the authority names what they lack, and they get it in
        // the background rather than inside peering.
        let behind: BTreeSet<OsdId> = targets
            .iter()
            .filter(|(osd, plan)| matches!(plan, Plan::History { .. }) && *osd != primary)
            .map(|(osd, _)| *osd)
            .collect();
        debug_assert!(self.filled_in_background.len() + behind.len() < answered, "the authority is behind itself");
        // The primary itself far behind by history (it rejoins after a
        // hang or a restart): bringing it level inside peering would hold
        // the PG's I/O meanwhile, and an OSD brings its PGs level one after
        // another. It hands the PG to the authority instead, which fills
        // it in the background with the other members behind; when that
        // ends the pin goes and it leads again, level. A few entries behind
        // (writes in flight when an interval ended) it catches up here:
        // quicker than two interval changes.
        let primary_gap = targets.iter().find(|(osd, _)| *osd == primary).and_then(|(_, plan)| match plan {
            Plan::History { after, .. } => Some(last_seq.saturating_sub(*after)),
            Plan::Backfill => None,
        });
        if primary_gap.is_some_and(|gap| gap > HAND_OVER_AFTER_ENTRIES)
            && answered - self.filled_in_background.len() - behind.len() > min_size
        {
            let mut acting = vec![authority];
            acting.extend(self.members.iter().copied().filter(|osd| *osd != authority));
            debug_assert_eq!(acting.len(), self.members.len(), "a hand-over keeps every member");
            debug_assert_ne!(authority, primary, "a primary behind by history is not the authority");
            return Err(acting);
        }
        if behind.is_empty() || answered - self.filled_in_background.len() - behind.len() < min_size {
            return Ok(BTreeSet::new());
        }
        Ok(behind)
    }

    /// Advances recovery with `reply` (to the request it waited for) until
    /// it sends the next request, or everything is done and it activates.
    /// Only one stage has a request outstanding at a time, and the order
    /// below finds it first: a copy, a target's listing, a scrub listing.
    pub(super) fn step(&mut self, mut recovery: Box<Recovery>, mut reply: Option<PeerReply>) -> Vec<Action> {
        debug_assert!(recovery.waiting.is_none(), "recovery steps on while a request is out");
        if recovery.ec.is_some() {
            match self.ec_step(&mut recovery, reply.take()) {
                Ok(Some((to, op))) => return self.send(recovery, to, op),
                Ok(None) => {}
                Err(why) => return self.stuck(why),
            }
        }
        loop {
            if let Some(copy) = recovery.copy.take() {
                match self.copy_step(&mut recovery, copy, reply.take()) {
                    Ok(Some((to, op))) => return self.send(recovery, to, op),
                    Ok(None) => continue,
                    Err(why) => return self.stuck(why),
                }
            }
            if let Some(work) = recovery.work.pop_front() {
                let (copy, to, op) = match work {
                    Work::Copy { object, from, to } => {
                        recovery.changed.insert(to);
                        let op = PeerOp::Stat { object: object.clone() };
                        (Copy { object, from, to, stage: CopyStage::Stat }, from, op)
                    }
                    Work::Remove { object, on } => {
                        recovery.changed.insert(on);
                        // The authority's ids of the object's mutations (its
                        // delete, say) go with the removal.
                        let from = recovery.authority;
                        let op = PeerOp::ObjectRequests { object: object.clone() };
                        (Copy { object, from, to: on, stage: CopyStage::Ids { meta: None, staged: 0 } }, from, op)
                    }
                };
                recovery.copy = Some(copy);
                return self.send(recovery, to, op);
            }
            if let Some((target, step)) = recovery.listing.take() {
                match self.listing_step(&mut recovery, target, step, reply.take()) {
                    Ok(Some((to, op))) => return self.send(recovery, to, op),
                    Ok(None) => continue,
                    Err(why) => return self.stuck(why),
                }
            }
            if let Some((target, plan)) = recovery.targets.pop_front() {
                let authority = recovery.authority;
                let (step, op) = match plan {
                    Plan::History { after, after_epoch } => {
                        let through = recovery.info.last_seq;
                        (Step::AskTouched, PeerOp::Touched { after, after_epoch, through })
                    }
                    Plan::Backfill => (
                        Step::ListAuthority { cursor: Vec::new(), objects: Vec::new() },
                        PeerOp::Digests { cursor: Vec::new() },
                    ),
                };
                recovery.listing = Some((target, step));
                return self.send(recovery, authority, op);
            }
            if let Some(mut scrub) = recovery.scrub.take() {
                if scrub.report.is_none() {
                    match self.scrub_step(&mut recovery, &mut scrub, reply.take()) {
                        Ok(Some((to, op))) => {
                            recovery.scrub = Some(scrub);
                            return self.send(recovery, to, op);
                        }
                        Ok(None) => {
                            // Listed and compared: the repairs (if any) run next.
                            recovery.scrub = Some(scrub);
                            continue;
                        }
                        Err(why) => return self.stuck(why),
                    }
                }
                self.scrub_report = scrub.report.take();
            }
            debug_assert!(reply.is_none(), "an answer no recovery stage waited for");
            let record = self.record_members();
            if self.active_set.as_deref() != Some(&record[..]) {
                self.phase = Phase::Recording(recovery);
                return vec![Action::Record { members: record }];
            }
            return self.activate(&recovery);
        }
    }

    /// The next request of a target's object listing (`None`: its work is planned).
    pub(super) fn listing_step(
        &mut self,
        recovery: &mut Recovery,
        target: OsdId,
        step: Step,
        reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let authority = recovery.authority;
        debug_assert_ne!(target, authority, "the authority is recovered from itself");
        let unexpected = |reply: &Option<PeerReply>| format!("unexpected answer {reply:?} during recovery");
        match (step, reply) {
            (Step::AskTouched, Some(PeerReply::Touched(Some(objects)))) => {
                // The authority's history holds the target's last entry:
                // the target's log is a prefix of it.
                recovery.on_history.insert(target);
                if recovery.history_in_background.contains(&target) {
                    tracing::info!(
                        pg = self.pg,
                        member = target,
                        objects = objects.len(),
                        "a member behind by history is filled in the background"
                    );
                    self.filled_in_background.push(target);
                    if let Some(names) = self.fill_only.as_mut() {
                        names.extend(objects);
                    }
                    return Ok(None);
                }
                let copies = objects.into_iter().map(|object| Work::Copy { object, from: authority, to: target });
                recovery.work.extend(copies);
                Ok(None)
            }
            (Step::AskTouched, Some(PeerReply::Touched(None))) if recovery.history_in_background.contains(&target) => {
                // The history no longer reaches its end: a whole backfill, in the background.
                self.filled_in_background.push(target);
                self.fill_only = None;
                Ok(None)
            }
            (Step::AskTouched, Some(PeerReply::Touched(None))) => {
                // The history does not reach the target's end: backfill instead.
                recovery.listing = Some((target, Step::ListAuthority { cursor: Vec::new(), objects: Vec::new() }));
                Ok(Some((authority, PeerOp::Digests { cursor: Vec::new() })))
            }
            (Step::ListAuthority { cursor, mut objects }, Some(PeerReply::Digests { objects: page, more })) => {
                let cursor = next_cursor(&cursor, &page, more).ok_or("a digest listing did not advance")?;
                objects.extend(page);
                if more {
                    recovery.listing = Some((target, Step::ListAuthority { cursor: cursor.clone(), objects }));
                    return Ok(Some((authority, PeerOp::Digests { cursor })));
                }
                let step = Step::ListTarget { cursor: Vec::new(), authority: objects, objects: Vec::new() };
                recovery.listing = Some((target, step));
                Ok(Some((target, PeerOp::Digests { cursor: Vec::new() })))
            }
            (
                Step::ListTarget { cursor, authority: theirs, mut objects },
                Some(PeerReply::Digests { objects: page, more }),
            ) => {
                let cursor = next_cursor(&cursor, &page, more).ok_or("a digest listing did not advance")?;
                objects.extend(page);
                if more {
                    let step = Step::ListTarget { cursor: cursor.clone(), authority: theirs, objects };
                    recovery.listing = Some((target, step));
                    return Ok(Some((target, PeerOp::Digests { cursor })));
                }
                recovery.work.extend(diff(authority, &theirs, target, &objects));
                Ok(None)
            }
            (_, other) => Err(unexpected(&other)),
        }
    }

    /// The next request of an object copy or removal (`None`: it is done).
    pub(super) fn copy_step(
        &mut self,
        recovery: &mut Recovery,
        mut copy: Copy,
        reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        debug_assert_ne!(copy.from, copy.to, "an object copied onto its own source");
        let object = copy.object.clone();
        let (next, to, op) = match (std::mem::replace(&mut copy.stage, CopyStage::Install), reply) {
            (CopyStage::Stat, Some(PeerReply::Meta(None))) => {
                // Gone on the source since it was listed or logged.
                (CopyStage::Ids { meta: None, staged: 0 }, copy.from, PeerOp::ObjectRequests { object })
            }
            (CopyStage::Stat, Some(PeerReply::Meta(Some(meta)))) => next_chunk(copy.from, object, meta, 0, 0),
            (CopyStage::Pull { meta, offset, staged }, Some(PeerReply::Data(data))) => {
                let end = offset + data.len() as u64;
                if data.is_empty() || end > meta.size {
                    return Err(format!(
                        "a pull at {offset} of a {}-byte object returned {} bytes",
                        meta.size,
                        data.len()
                    ));
                }
                if data.iter().all(|b| *b == 0) {
                    // Holes stay holes: the installed object starts empty.
                    next_chunk(copy.from, object, meta, end, staged)
                } else {
                    self.progress.bytes_copied += data.len() as u64;
                    let staged = staged + data.len() as u64;
                    (CopyStage::Stage { meta, offset: end, staged }, copy.to, PeerOp::Stage { object, offset, data })
                }
            }
            (CopyStage::Stage { meta, offset, staged }, Some(PeerReply::Done)) => {
                next_chunk(copy.from, object, meta, offset, staged)
            }
            (CopyStage::Ids { meta, staged }, Some(PeerReply::Requests(requests))) => {
                if meta.is_some() {
                    self.progress.objects_copied += 1;
                } else {
                    self.progress.objects_removed += 1;
                }
                let authority_seq = recovery.info.last_seq;
                (
                    CopyStage::Install,
                    copy.to,
                    PeerOp::Install { object, meta, staged_bytes: staged, requests, authority_seq },
                )
            }
            (CopyStage::Install, Some(PeerReply::Done)) => return Ok(None),
            (_, other) => return Err(format!("unexpected answer {other:?} while copying an object")),
        };
        copy.stage = next;
        recovery.copy = Some(copy);
        Ok(Some((to, op)))
    }

    /// The next request of a deep scrub's listings (`None`: all listed and
    /// compared; repairs are queued as work when asked for).
    pub(super) fn send(&mut self, mut recovery: Box<Recovery>, to: OsdId, op: PeerOp) -> Vec<Action> {
        // `step` finds the stage a reply belongs to by which one is in
        // progress: there must be exactly one.
        let in_progress = usize::from(recovery.copy.is_some())
            + usize::from(recovery.listing.is_some())
            + usize::from(recovery.scrub.as_ref().is_some_and(|s| s.listing.is_some()))
            + usize::from(recovery.ec.as_ref().is_some_and(|ec| ec.waits()));
        debug_assert_eq!(in_progress, 1, "one recovery stage waits for each answer");
        debug_assert!(
            self.members.contains(&to) || self.whole_targets.contains_key(&to),
            "requests go to the PG's members only (and to a whole target, the authority)"
        );
        let tag = self.tag();
        recovery.waiting = Some(tag);
        self.phase = Phase::Recovering(recovery);
        vec![Action::Send { to, tag, op }]
    }

    pub(super) fn activate(&mut self, recovery: &Recovery) -> Vec<Action> {
        assert!(recovery.copy.is_none() && recovery.work.is_empty(), "activation before recovery's work is done");
        debug_assert!(recovery.on_history.contains(&recovery.authority), "the authority's own ids left out");
        debug_assert_eq!(
            self.active_set.as_deref(),
            Some(&self.record_members()[..]),
            "no member is activated before the map records the whole members"
        );
        let mut waiting = BTreeMap::new();
        let mut actions = Vec::new();
        let members: Vec<u32> = self.members.clone();
        let targets = self.backfill_targets();
        assert!(!targets.contains(&members[0]), "the primary serves: it is never filled in the background");
        debug_assert!(
            members.iter().all(|m| !targets.contains(m) || self.filled_in_background.contains(m)),
            "a member is a backfill target only when it is filled in the background"
        );
        let requests =
            merge_logged(recovery.on_history.iter().filter_map(|osd| recovery.logged.get(osd)).map(Vec::as_slice));
        // An erasure-coded PG's members are positional in its activation.
        let named = if self.erasure.is_some() { self.shards.clone() } else { members.clone() };
        let activate = |osd: OsdId| PeerOp::Activate {
            last_seq: recovery.info.last_seq,
            last_epoch: recovery.info.last_epoch,
            members: named.clone(),
            // A target's store is being refilled: its own history no longer holds.
            rebuilt: recovery.changed.contains(&osd) || targets.contains(&osd),
            requests: requests.clone(),
            backfill: targets.clone(),
        };
        // The replicas and targets first: a primary active before them
        // would send entries they refuse (not active yet), fail those
        // writes and peer all over again (seen in the isolated-host scenario).
        let filled_later = targets.iter().copied().filter(|t| !members.contains(t));
        for osd in members[1..].iter().copied().chain(filled_later) {
            let tag = self.tag();
            waiting.insert(tag, osd);
            actions.push(Action::Send { to: osd, tag, op: activate(osd) });
        }
        let (authority, last_seq) = (recovery.authority, recovery.info.last_seq);
        let primary = activate(members[0]);
        if waiting.is_empty() {
            let tag = self.tag();
            waiting.insert(tag, members[0]);
            actions.push(Action::Send { to: members[0], tag, op: primary });
            self.phase = Phase::Activating { waiting, authority, last_seq, primary: None };
        } else {
            self.phase = Phase::Activating { waiting, authority, last_seq, primary: Some(primary) };
        }
        actions
    }
}

/// The cursor after a page (`None`: a page that claims more but did not advance).
pub(super) fn next_cursor(cursor: &[u8], page: &[ObjectDigest], more: bool) -> Option<Vec<u8>> {
    match page.last() {
        Some(last) if last.object.as_slice() > cursor || cursor.is_empty() => Some(last.object.clone()),
        Some(_) => None,
        None if more => None,
        None => Some(cursor.to_vec()),
    }
}

/// After `offset` bytes of `meta`'s object: the next chunk to pull from
/// `from`, or, past the end, the source's ids of the object's mutations.
fn next_chunk(from: OsdId, object: Vec<u8>, meta: ObjectMeta, offset: u64, staged: u64) -> (CopyStage, OsdId, PeerOp) {
    debug_assert!(staged <= offset, "{staged} bytes staged of the first {offset} pulled");
    if offset < meta.size {
        let len = CHUNK_BYTES.min((meta.size - offset).min(u32::MAX as u64) as u32);
        (CopyStage::Pull { meta, offset, staged }, from, PeerOp::Pull { object, offset, len })
    } else {
        (CopyStage::Ids { meta: Some(meta), staged }, from, PeerOp::ObjectRequests { object })
    }
}

/// What makes `target`'s object set equal the authority's: copies of
/// objects it lacks or holds differently (or damaged), removal of extra ones.
fn diff(authority: OsdId, ours: &[ObjectDigest], target: OsdId, theirs: &[ObjectDigest]) -> Vec<Work> {
    let held: BTreeMap<&[u8], Option<u32>> = theirs.iter().map(|d| (d.object.as_slice(), d.digest)).collect();
    let names: BTreeSet<&[u8]> = ours.iter().map(|d| d.object.as_slice()).collect();
    let mut work: Vec<Work> = ours
        .iter()
        .filter(|d| d.digest.is_none() || held.get(d.object.as_slice()) != Some(&d.digest))
        .map(|d| Work::Copy { object: d.object.clone(), from: authority, to: target })
        .collect();
    work.extend(
        theirs
            .iter()
            .filter(|d| !names.contains(d.object.as_slice()))
            .map(|d| Work::Remove { object: d.object.clone(), on: target }),
    );
    work
}

/// Whether the answers include the PG's last active set `set`, as far as
/// it vouches for every acknowledged write: one of its OSDs with a whole
/// copy that kept its log, or else every one of its OSDs (one at least
/// with a whole copy): when all of them answered, none is left to wait
/// for, and the newest store among them is the newest copy there is.
/// (A copy an unfinished recovery changed kept its log: its store took all
/// of it, and the objects copied in are the authority's, newer still.)
///
/// A member that lost its log to a power cut ([`PeerInfo::log_lost`])
/// lost the writes its log held that its store had not taken yet: they
/// were acknowledged, and live on in the logs of the set's other OSDs.
/// Counting it alone as the set let it peer by itself while the others
/// were down (both crashed, their logs intact), activate, and so win the
/// next peering over them by `last_active`: an acknowledged write was
/// gone (simulator seed 53159, a stale read of block 45). Requiring every
/// OSD of the set to be *whole* instead of merely present waited for good
/// when one of them had become an unfinished backfill since (a later
/// interval's target) and the others had lost their logs one after the
/// other (seed 2058 with the balancer): no copy anywhere holds more.
pub(super) fn active_set_answered(set: &[OsdId], infos: &BTreeMap<OsdId, PeerInfo>) -> bool {
    let whole = |osd: &OsdId| infos.get(osd).filter(|info| !info.backfilling);
    set.iter().any(|osd| whole(osd).is_some_and(|info| !info.log_lost))
        || (set.iter().all(|osd| infos.contains_key(osd)) && set.iter().any(|osd| whole(osd).is_some()))
}
