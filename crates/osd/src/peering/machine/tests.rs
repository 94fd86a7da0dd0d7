//! The peering machine against modelled members.

use super::*;
use proptest::prelude::*;

type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

/// A member as the machine sees it: a store of whole objects, a log
/// position and a history of which seq touched which object.
/// Staged object bytes, by offset.
type Chunks = Vec<(u64, Vec<u8>)>;

#[derive(Clone, Default)]
struct Member {
    objects: BTreeMap<Vec<u8>, (Vec<u8>, Attrs)>,
    last_seq: u64,
    last_epoch: u32,
    last_active: u64,
    history: Vec<(u64, u32, Vec<u8>)>,
    /// Objects whose copy here fails its checksum.
    damaged: BTreeSet<Vec<u8>>,
    /// The request ids of the entries it logged.
    logged: Vec<LoggedRequest>,
    rebuilt: bool,
    answered: u32,
    /// An unfinished backfill target's copy.
    backfilling: bool,
    /// What peering's recovery staged here: the object and its chunks.
    staged: Option<(Vec<u8>, Chunks)>,
    /// Peering's recovery installed an object here and no activation
    /// followed (as `stored_interval::recovered`).
    recovered: bool,
    /// Its log was lost with the power (its store lacks what the log held).
    log_lost: bool,
}

/// The request id of the entry at `seq` of `epoch` (a divergent entry,
/// of another epoch, has another id).
fn request_of(seq: u64, epoch: u32) -> LoggedRequest {
    LoggedRequest { client: 1, tid: seq * 10 + epoch as u64, seq }
}

impl Member {
    fn write(&mut self, object: &str, data: &[u8]) {
        self.last_seq += 1;
        self.last_epoch = 5;
        self.objects.insert(object.as_bytes().to_vec(), (data.to_vec(), Vec::new()));
        self.history.push((self.last_seq, 5, object.as_bytes().to_vec()));
        self.logged.push(request_of(self.last_seq, 5));
    }

    fn answer(&mut self, op: PeerOp, interval: u64) -> PeerReply {
        self.answered += 1;
        match op {
            PeerOp::Query => {
                let mut info = PeerInfo {
                    last_seq: self.last_seq,
                    last_epoch: self.last_epoch,
                    last_active: self.last_active,
                    history_from: self.history.first().map_or(self.last_seq + 1, |(seq, ..)| *seq),
                    backfilling: self.backfilling,
                    position_lost: false,
                    log_lost: false,
                };
                if self.recovered || self.log_lost {
                    // As the real member: lost, past every id it holds.
                    let last_seq = self.logged.iter().map(|r| r.seq).max().unwrap_or(0).max(self.last_seq);
                    info = PeerInfo {
                        last_seq,
                        last_epoch: 0,
                        history_from: last_seq + 1,
                        position_lost: true,
                        log_lost: self.log_lost,
                        ..info
                    };
                }
                PeerReply::Info { info, requests: self.logged.clone() }
            }
            PeerOp::Touched { after, after_epoch, through } => {
                if !self.history.iter().any(|(seq, epoch, _)| (*seq, *epoch) == (after, after_epoch)) {
                    return PeerReply::Touched(None);
                }
                let names: BTreeSet<Vec<u8>> = self
                    .history
                    .iter()
                    .filter(|(seq, ..)| *seq > after && *seq <= through)
                    .map(|(_, _, o)| o.clone())
                    .collect();
                PeerReply::Touched(Some(names.into_iter().collect()))
            }
            PeerOp::Digests { cursor } => {
                let objects: Vec<ObjectDigest> = self
                    .objects
                    .iter()
                    .filter(|(name, _)| cursor.is_empty() || name.as_slice() > cursor.as_slice())
                    .take(2) // small pages, to exercise paging
                    .map(|(name, (data, _))| ObjectDigest {
                        object: name.clone(),
                        digest: (!self.damaged.contains(name)).then(|| crc32c::crc32c(data)),
                    })
                    .collect();
                let more =
                    objects.last().is_some_and(|last| self.objects.range(last.object.clone()..).nth(1).is_some());
                PeerReply::Digests { objects, more }
            }
            PeerOp::Stat { object } => PeerReply::Meta(self.objects.get(&object).map(|(data, attrs)| ObjectMeta {
                size: data.len() as u64,
                preallocated: false,
                attrs: attrs.clone(),
                omap: Vec::new(),
            })),
            PeerOp::Pull { object, offset, len } => {
                if self.damaged.contains(&object) {
                    return PeerReply::Refused("checksum mismatch".into());
                }
                let data = &self.objects[&object].0;
                let end = (offset + len as u64).min(data.len() as u64);
                PeerReply::Data(data[offset as usize..end as usize].to_vec())
            }
            PeerOp::Stage { object, offset, data } => {
                let staged = self.staged.get_or_insert_with(|| (object.clone(), Vec::new()));
                if staged.0 != object {
                    *staged = (object, Vec::new());
                }
                staged.1.push((offset, data));
                PeerReply::Done
            }
            PeerOp::ObjectRequests { object } => PeerReply::Requests(
                self.logged
                    .iter()
                    .filter(|r| self.history.iter().any(|(seq, _, touched)| *seq == r.seq && *touched == object))
                    .copied()
                    .collect(),
            ),
            PeerOp::Install { object, meta, staged_bytes, requests, .. } => {
                let chunks = self.staged.take().filter(|(o, _)| *o == object).map(|(_, c)| c).unwrap_or_default();
                if chunks.iter().map(|(_, d)| d.len() as u64).sum::<u64>() != staged_bytes {
                    return PeerReply::Refused("a staged chunk was lost".into());
                }
                self.damaged.remove(&object);
                match meta {
                    Some(meta) => {
                        let mut data = vec![0; meta.size as usize];
                        for (offset, chunk) in chunks {
                            data[offset as usize..offset as usize + chunk.len()].copy_from_slice(&chunk);
                        }
                        self.objects.insert(object, (data, meta.attrs));
                    }
                    None => {
                        self.objects.remove(&object);
                    }
                }
                for request in requests {
                    self.logged.retain(|r| r.seq != request.seq);
                    self.logged.push(request);
                }
                self.recovered = true;
                PeerReply::Done
            }
            PeerOp::Activate { last_seq, last_epoch, rebuilt, requests, .. } => {
                if (last_seq, last_epoch) != (self.last_seq, self.last_epoch) {
                    self.history.clear();
                }
                self.last_seq = last_seq;
                self.last_epoch = last_epoch;
                self.last_active = interval;
                self.rebuilt = rebuilt;
                self.logged = requests;
                self.recovered = false;
                PeerReply::Done
            }
            PeerOp::Scrub { .. } => PeerReply::Refused("not a member's request".into()),
            PeerOp::Settle { .. } => PeerReply::Refused("only an erasure-coded PG's members settle".into()),
            PeerOp::PushStart { .. } | PeerOp::PushData { .. } | PeerOp::Remove { .. } => {
                PeerReply::Refused("peering installs objects whole; pushes are background backfill's".into())
            }
            PeerOp::List { .. }
            | PeerOp::BackfillLock { .. }
            | PeerOp::BackfillDone
            | PeerOp::ChunkDigest { .. }
            | PeerOp::BackfillJoin { .. }
            | PeerOp::BackfillJoined => {
                PeerReply::Refused("background backfill is not peering's (backfill.rs tests it)".into())
            }
        }
    }
}

/// Runs peering to the end over `members` (ids 0..n, 0 the primary).
fn run(members: &mut [Member], interval: u64) -> Action {
    let ids: Vec<OsdId> = (0..members.len() as u32).collect();
    let (mut machine, actions) = Peering::start(7, interval, ids);
    drive(members, interval, &mut machine, actions)
}

fn scrub(members: &mut [Member], repair: bool) -> (Action, Option<ScrubReport>) {
    let ids: Vec<OsdId> = (0..members.len() as u32).collect();
    let (mut machine, actions) = Peering::start_scrub(7, 9, ids, repair);
    let outcome = drive(members, 9, &mut machine, actions);
    (outcome, machine.scrub_report().cloned())
}

/// Carries `machine` to its end over `members`, the monitor recording
/// members at once; the machine stays the caller's, to look at after.
fn drive(members: &mut [Member], interval: u64, machine: &mut Peering, actions: Vec<Action>) -> Action {
    let mut queue: VecDeque<Action> = actions.into();
    while let Some(action) = queue.pop_front() {
        match action {
            Action::Send { to, tag, op } => {
                let reply = members[to as usize].answer(op, interval);
                queue.extend(machine.on_reply(tag, reply));
            }
            Action::Record { members } => queue.extend(machine.on_recorded(Some(&members))),
            done => {
                assert!(queue.is_empty(), "nothing follows the end");
                return done;
            }
        }
    }
    panic!("peering neither finished nor got stuck");
}

fn active_member(writes: &[(&str, &[u8])]) -> Member {
    let mut member = Member { last_active: 5, ..Member::default() };
    for (object, data) in writes {
        member.write(object, data);
    }
    member
}

#[test]
fn members_in_step_go_active_without_moving_data() {
    let member = active_member(&[("a", b"1"), ("b", b"2")]);
    let mut members = vec![member.clone(), member.clone(), member];
    let outcome = run(&mut members, 9);
    assert_eq!(outcome, Action::Active { authority: 0, last_seq: 2, recovered_objects: 0, backfill: vec![] });
    for member in &members {
        assert_eq!((member.last_active, member.last_seq), (9, 2));
        assert!(!member.rebuilt);
        assert_eq!(member.answered, 2, "a query and an activation each");
        assert_eq!(member.logged, vec![request_of(1, 5), request_of(2, 5)]);
    }
}

/// A primary active before its replicas would send entries they refuse.
#[test]
fn the_primary_activates_only_after_every_replica_has() {
    let member = active_member(&[("a", b"1")]);
    let mut members = [member.clone(), member.clone(), member];
    let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
    let mut queue: VecDeque<Action> = actions.into();
    let mut activations = Vec::new();
    while let Some(action) = queue.pop_front() {
        let Action::Send { to, tag, op } = action else { break };
        if let PeerOp::Activate { .. } = op {
            // Answer each activation only once every one sent so far is out.
            activations.push(to);
            assert!(
                to != 0 || activations.len() == 3,
                "the primary's activation went out before the replicas answered: {activations:?}"
            );
        }
        let reply = members[to as usize].answer(op, 9);
        queue.extend(machine.on_reply(tag, reply));
    }
    assert!(machine.is_active());
    assert_eq!(activations, vec![1, 2, 0]);
    let (mut alone, actions) = Peering::start(7, 9, vec![0]);
    let mut queue: VecDeque<Action> = actions.into();
    let mut lone = Member::default();
    while let Some(Action::Send { to, tag, op }) = queue.pop_front() {
        assert_eq!(to, 0);
        queue.extend(alone.on_reply(tag, lone.answer(op, 9)));
    }
    assert!(alone.is_active(), "a PG of one member activates too");
}

#[test]
fn a_member_behind_in_the_same_interval_gets_the_objects_its_gap_touched() {
    let behind = active_member(&[("a", b"1"), ("b", b"2")]);
    let mut ahead = behind.clone();
    ahead.write("c", b"3");
    ahead.write("a", b"4");
    let mut members = vec![behind, ahead];
    let outcome = run(&mut members, 9);
    assert_eq!(outcome, Action::Active { authority: 1, last_seq: 4, recovered_objects: 2, backfill: vec![] });
    assert_eq!(members[0].objects, members[1].objects);
    assert!(members[0].rebuilt);
    assert!(!members[1].rebuilt);
    assert_eq!(members[0].last_seq, 4);
    let all: Vec<LoggedRequest> = (1..=4).map(|seq| request_of(seq, 5)).collect();
    assert_eq!(members[0].logged, all, "the member behind learns the ids it missed");
    assert_eq!(members[1].logged, all);
}

#[test]
fn a_member_behind_by_history_is_filled_in_the_background_with_just_the_objects_its_gap_touched() {
    let behind = active_member(&[("a", b"1"), ("b", b"2")]);
    let mut ahead = behind.clone();
    ahead.write("c", b"3");
    ahead.write("a", b"4");
    let mut members = [ahead.clone(), ahead, behind];
    let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
    machine.fill_in_background(2);
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert_eq!(outcome, Action::Active { authority: 0, last_seq: 4, recovered_objects: 0, backfill: vec![2] });
    assert_eq!(machine.fill_only(), Some(vec![b"a".to_vec(), b"c".to_vec()]), "what the gap touched");
    assert!(!members[2].objects.contains_key(b"c".as_slice()), "nothing copied inside peering");
    let all: Vec<LoggedRequest> = (1..=4).map(|seq| request_of(seq, 5)).collect();
    assert_eq!(members[2].logged, all, "its log is a prefix of the history: it knows every id");
    // With min_size 3 it is brought level inside peering, as before.
    let mut members = [members[0].clone(), members[1].clone(), active_member(&[("a", b"1"), ("b", b"2")])];
    let outcome = {
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
        machine.fill_in_background(3);
        drive(&mut members, 9, &mut machine, actions)
    };
    assert!(
        matches!(&outcome, Action::Active { backfill, recovered_objects: 2, .. } if backfill.is_empty()),
        "{outcome:?}"
    );
    assert_eq!(members[2].objects, members[0].objects);
}

/// A primary far behind by history (it rejoins after a hang or a restart)
/// hands its PG to the authority, which fills it in the background, rather
/// than holding the PG's I/O while it is brought level inside peering; a
/// few entries behind, or when min_size needs it whole, it is brought
/// level here as before.
#[test]
fn a_primary_far_behind_by_history_hands_over_and_a_little_behind_catches_up() {
    let behind = active_member(&[("a", b"1"), ("b", b"2")]);
    let far_ahead = |writes: u64| {
        let mut ahead = behind.clone();
        for n in 0..writes {
            ahead.write(if n % 2 == 0 { "a" } else { "c" }, &n.to_le_bytes());
        }
        ahead
    };
    let peer = |members: &mut [Member], min_size: usize| {
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
        machine.fill_in_background(min_size);
        drive(members, 9, &mut machine, actions)
    };
    let ahead = far_ahead(recovery::HAND_OVER_AFTER_ENTRIES + 1);
    let mut members = [behind.clone(), ahead.clone(), ahead.clone()];
    assert_eq!(peer(&mut members, 2), Action::HandOver { acting: vec![1, 0, 2] });
    assert_eq!(members[0].objects, behind.objects, "nothing done to it meanwhile");
    // min_size 3 needs it whole before the PG serves: inside peering.
    let outcome = peer(&mut members, 3);
    assert!(matches!(&outcome, Action::Active { authority: 1, backfill, .. } if backfill.is_empty()), "{outcome:?}");
    assert_eq!(members[0].objects, members[1].objects);
    // A few entries behind: brought level inside peering.
    let ahead = far_ahead(recovery::HAND_OVER_AFTER_ENTRIES);
    let mut members = [behind.clone(), ahead.clone(), ahead];
    let outcome = peer(&mut members, 2);
    assert!(matches!(&outcome, Action::Active { authority: 1, backfill, .. } if backfill.is_empty()), "{outcome:?}");
    assert_eq!(members[0].objects, members[1].objects);
}

#[test]
fn an_older_or_divergent_member_is_backfilled_by_digest_comparison() {
    let authority = active_member(&[("a", b"new"), ("b", b"same"), ("d", &[0u8; 10])]);
    let mut stale = Member { last_active: 3, last_seq: 40, logged: vec![request_of(40, 3)], ..Member::default() };
    stale.objects.insert(b"a".to_vec(), (b"old".to_vec(), vec![]));
    stale.objects.insert(b"b".to_vec(), (b"same".to_vec(), vec![]));
    stale.objects.insert(b"c".to_vec(), (b"extra".to_vec(), vec![]));
    let lost_log = Member::default();
    let mut members = vec![stale, authority, lost_log];
    let outcome = run(&mut members, 9);
    // Despite its higher seq, the member of an older interval is not the authority.
    assert!(matches!(outcome, Action::Active { authority: 1, last_seq: 3, .. }), "{outcome:?}");
    assert_eq!(members[0].objects, members[1].objects);
    assert_eq!(members[2].objects, members[1].objects);
    assert!(members.iter().all(|m| m.last_seq == 3 && m.last_active == 9));
    let history: Vec<LoggedRequest> = (1..=3).map(|seq| request_of(seq, 5)).collect();
    assert!(members.iter().all(|m| m.logged == history), "the divergent member's id is forgotten");
}

#[test]
fn members_to_backfill_are_filled_in_the_background_while_the_whole_ones_keep_min_size_and_a_primary_hands_over() {
    let writes: &[(&str, &[u8])] = &[("a", b"new"), ("b", b"same")];
    let peer_recording = |members: &mut [Member], min_size: usize| {
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
        machine.fill_in_background(min_size);
        (drive(members, 9, &mut machine, actions), machine.record_members())
    };
    let peer = |members: &mut [Member], min_size: usize| peer_recording(members, min_size).0;
    // osd.2 lost its log; osd.0 and osd.1 are whole, which min_size 2 allows.
    let mut members = [active_member(writes), active_member(writes), Member::default()];
    let (outcome, recorded) = peer_recording(&mut members, 2);
    assert!(
        matches!(&outcome, Action::Active { backfill, recovered_objects: 0, .. } if backfill == &[2]),
        "{outcome:?}"
    );
    // The map records the whole members only: osd.2 holds every write
    // only once its fill ends (seed 1280 lost writes when it led before).
    assert_eq!(recorded, vec![0, 1]);
    assert!(members[2].objects.is_empty(), "nothing copied inside peering");
    assert!(members[2].rebuilt && members[2].last_active == 9, "activated, as a target, with the others");
    // With min_size 3 the PG needs it whole before it serves: inside peering.
    let mut members = [active_member(writes), active_member(writes), Member::default()];
    let outcome = peer(&mut members, 3);
    assert!(matches!(&outcome, Action::Active { backfill, .. } if backfill.is_empty()), "{outcome:?}");
    assert_eq!(members[2].objects, members[0].objects);
    // The primary, which serves reads, hands the PG to the authority
    // (which will fill it in the background), unless min_size forbids.
    let mut members = [Member::default(), active_member(writes), active_member(writes)];
    let outcome = peer(&mut members, 2);
    assert_eq!(outcome, Action::HandOver { acting: vec![1, 0, 2] });
    assert!(members[0].objects.is_empty() && members[0].last_active == 0, "nothing done to it meanwhile");
    let outcome = peer(&mut members, 3);
    assert!(matches!(&outcome, Action::Active { backfill, .. } if backfill.is_empty()), "{outcome:?}");
    assert_eq!(members[0].objects, members[1].objects);
}

#[test]
fn large_objects_move_in_chunks() {
    let big: Vec<u8> = (0..CHUNK_BYTES as usize * 2 + 100).map(|i| (i % 251) as u8).collect();
    let authority = active_member(&[("big", &big)]);
    let mut members = [authority, Member::default()];
    let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
    let mut queue: VecDeque<Action> = actions.into();
    let mut pulls = 0;
    while let Some(Action::Send { to, tag, op }) = queue.pop_front() {
        if let PeerOp::Pull { len, .. } = &op {
            assert!(*len <= CHUNK_BYTES);
            pulls += 1;
        }
        let reply = members[to as usize].answer(op, 9);
        queue.extend(machine.on_reply(tag, reply));
    }
    assert!(machine.is_active());
    assert_eq!(pulls, 3);
    assert_eq!(members[1].objects, members[0].objects);
    assert_eq!(machine.progress.bytes_copied, big.len() as u64);
}

#[test]
fn a_refusal_or_a_lost_member_stops_it_and_late_answers_are_ignored() {
    let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
    let tags: Vec<u64> = actions
        .iter()
        .map(|a| match a {
            Action::Send { tag, .. } => *tag,
            other => panic!("{other:?}"),
        })
        .collect();
    let stuck = machine.on_reply(tags[0], PeerReply::Refused("older interval".into()));
    assert!(matches!(&stuck[..], [Action::Stuck(_)]));
    assert!(machine.is_stuck());
    let info = PeerInfo {
        last_seq: 0,
        last_epoch: 0,
        last_active: 0,
        history_from: 1,
        backfilling: false,
        position_lost: false,
        log_lost: false,
    };
    assert!(machine.on_reply(tags[1], PeerReply::Info { info, requests: vec![] }).is_empty(), "late answer");

    let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
    let Action::Send { tag, .. } = actions[1] else { panic!() };
    assert!(matches!(&machine.on_failure(tag, "osd.1 unreachable")[..], [Action::Stuck(_)]));
    assert!(machine.on_failure(tag + 100, "unknown").is_empty());
}

#[test]
fn the_authority_is_the_newest_interval_then_the_longest_log_then_the_primary() {
    let info = |last_active, last_seq| PeerInfo {
        last_seq,
        last_epoch: 5,
        last_active,
        history_from: 1,
        backfilling: false,
        position_lost: false,
        log_lost: false,
    };
    let infos: BTreeMap<OsdId, PeerInfo> = [(0, info(4, 100)), (1, info(5, 10)), (2, info(5, 12))].into();
    assert_eq!(choose_authority(0, &infos, false).map(|(osd, _)| osd), Some(2));
    let tie: BTreeMap<OsdId, PeerInfo> = [(3, info(5, 12)), (1, info(5, 12)), (2, info(5, 12))].into();
    assert_eq!(choose_authority(2, &tie, false).map(|(osd, _)| osd), Some(2));
    assert_eq!(choose_authority(9, &tie, false).map(|(osd, _)| osd), Some(1));
    // A member whose log was lost (or whose copy an unfinished recovery
    // changed) reports a seq past every id its store's record names, but
    // a member of its interval whose log knows its position wins, even
    // with no entry at all: the record may name a write whose data never
    // landed (simulator seed 8840). It still leads older intervals.
    let lost = PeerInfo { last_epoch: 0, position_lost: true, ..info(5, 1) };
    let empty = PeerInfo { last_epoch: 0, ..info(5, 0) };
    let infos: BTreeMap<OsdId, PeerInfo> = [(0, lost), (1, empty), (2, info(4, 50))].into();
    assert_eq!(choose_authority(0, &infos, false).map(|(osd, _)| osd), Some(1));
    let infos: BTreeMap<OsdId, PeerInfo> = [(0, lost), (2, info(4, 50))].into();
    assert_eq!(choose_authority(2, &infos, false).map(|(osd, _)| osd), Some(0));
    // A member whose history reaches back far enough recovers by it; else backfill.
    let history = Some(Plan::History { after: 10, after_epoch: 5 });
    assert_eq!(plan_for(&info(5, 10), &PeerInfo { history_from: 10, ..info(5, 12) }, 9), history);
    assert_eq!(
        plan_for(&info(3, 10), &PeerInfo { history_from: 10, ..info(5, 12) }, 9),
        history,
        "older interval, same history"
    );
    assert_eq!(plan_for(&info(5, 10), &PeerInfo { history_from: 11, ..info(5, 12) }, 9), Some(Plan::Backfill));
    let unknown = PeerInfo { last_epoch: 0, ..info(0, 0) };
    assert_eq!(plan_for(&unknown, &unknown, 9), Some(Plan::Backfill), "an unknown end proves nothing");
    let empty_here = PeerInfo { last_epoch: 0, ..info(9, 0) };
    assert_eq!(plan_for(&empty_here, &empty_here, 9), None, "level when made so in this interval");
    assert_eq!(plan_for(&empty_here, &empty_here, 10), Some(Plan::Backfill), "but not in the next one");
    assert_eq!(plan_for(&info(5, 12), &info(5, 12), 9), None);
    assert_eq!(
        plan_for(&PeerInfo { last_epoch: 4, ..info(5, 12) }, &info(5, 12), 9),
        Some(Plan::Backfill),
        "divergent"
    );
}

fn damaged_copies() -> Vec<Member> {
    let good = active_member(&[("a", b"alpha"), ("b", b"beta"), ("c", b"gamma")]);
    let mut members = vec![good.clone(), good.clone(), good];
    members[1].damaged.insert(b"b".to_vec()); // rotted on a replica
    members[0].damaged.insert(b"c".to_vec()); // rotted on the primary (the authority)
    members[2].objects.insert(b"b".to_vec(), (b"bets".to_vec(), vec![])); // silently different
    members
}

#[test]
fn a_deep_scrub_reports_bad_copies_and_changes_nothing_without_repair() {
    let mut members = damaged_copies();
    let (outcome, report) = scrub(&mut members, false);
    assert!(matches!(outcome, Action::Active { recovered_objects: 0, .. }), "{outcome:?}");
    let report = report.expect("a scrub report");
    assert_eq!(report.objects, 3);
    assert_eq!(report.repaired, 0);
    let bad: Vec<(Vec<u8>, Vec<u32>)> = report.inconsistent.iter().map(|i| (i.object.clone(), i.bad.clone())).collect();
    assert_eq!(bad, vec![(b"b".to_vec(), vec![1, 2]), (b"c".to_vec(), vec![0])]);
    assert_eq!(members[2].objects[&b"b".to_vec()].0, b"bets", "untouched");
}

#[test]
fn a_repair_replaces_bad_copies_from_a_good_one_even_on_the_authority() {
    let mut members = damaged_copies();
    let (outcome, report) = scrub(&mut members, true);
    assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");
    assert_eq!(report.expect("a scrub report").repaired, 3);
    for member in &members {
        assert!(member.damaged.is_empty());
        assert_eq!(member.objects, active_member(&[("a", b"alpha"), ("b", b"beta"), ("c", b"gamma")]).objects);
    }
    // A second scrub finds nothing.
    let (_, report) = scrub(&mut members, false);
    assert_eq!(report.expect("a scrub report").inconsistent, vec![]);
}

#[test]
fn an_object_damaged_everywhere_is_reported_unrepairable() {
    let good = active_member(&[("a", b"alpha")]);
    let mut members = vec![good.clone(), good];
    for member in &mut members {
        member.damaged.insert(b"a".to_vec());
    }
    let (outcome, report) = scrub(&mut members, true);
    assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");
    let report = report.expect("a scrub report");
    assert_eq!(report.inconsistent.len(), 1);
    assert!(report.inconsistent[0].unrepairable);
    assert_eq!(report.repaired, 0);
}

/// One randomly generated history of a PG and its members, as peering
/// finds them: a main line of writes (epoch 5, then epoch 6 from seq
/// `k` on, when interval 6 went active among the "current" members),
/// members that were current (a prefix of the main line past `k`),
/// stale (a prefix up to `k`, maybe plus a divergent tail of epoch-5
/// writes the main line never took), or that lost their log (a store
/// holding some prefix, no log).
#[derive(Clone, Debug)]
struct Scenario {
    main: Vec<(u32, u8)>,
    k: usize,
    members: Vec<Kind>,
}

#[derive(Clone, Debug)]
enum Kind {
    Current { len: usize, history: usize },
    Stale { len: usize, divergent: usize, history: usize },
    Lost { len: usize },
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        proptest::collection::vec((0u32..6, any::<u8>()), 4..40),
        0.0f64..1.0,
        proptest::collection::vec((0u8..3, 0.0f64..1.0, 0usize..5, 0usize..50), 1..4),
        0usize..4,
    )
        .prop_map(|(main, k, kinds, longest_at)| {
            let k = ((main.len() as f64 * k) as usize).min(main.len() - 1);
            let n = main.len();
            let mut members: Vec<Kind> = kinds
                .into_iter()
                .map(|(kind, at, divergent, history)| match kind {
                    0 => Kind::Current { len: k + ((n - k) as f64 * at) as usize, history },
                    // The old primary (its divergent tail starts at k), or an older replica.
                    1 if divergent > 0 => Kind::Stale { len: k, divergent, history },
                    1 => Kind::Stale { len: (k as f64 * at) as usize, divergent, history },
                    _ => Kind::Lost { len: (n as f64 * at) as usize },
                })
                .collect();
            // Interval 6 went active: at least one member was in it, and
            // its primary logged the whole main line (anywhere in the set).
            let at = longest_at.min(members.len());
            members.insert(at, Kind::Current { len: n, history: n });
            Scenario { main, k, members }
        })
}

fn object(id: u32) -> Vec<u8> {
    format!("obj-{id}").into_bytes()
}

/// Applies entries (seq, epoch, object id, byte) to a member.
fn apply(member: &mut Member, entries: &[(u64, u32, u32, u8)], keep_history: usize) {
    for (seq, epoch, id, byte) in entries {
        if *byte < 16 {
            // Some writes are deletes: a stale copy may hold what the main line removed.
            member.objects.remove(&object(*id));
        } else {
            member.objects.insert(object(*id), (vec![*byte; 8 + *id as usize], Vec::new()));
        }
        member.last_seq = *seq;
        member.last_epoch = *epoch;
    }
    member.logged = entries.iter().map(|(seq, epoch, ..)| request_of(*seq, *epoch)).collect();
    let from = entries.len().saturating_sub(keep_history);
    member.history = entries[from..].iter().map(|(seq, epoch, id, _)| (*seq, *epoch, object(*id))).collect();
}

fn build(scenario: &Scenario) -> Vec<Member> {
    let main: Vec<(u64, u32, u32, u8)> = scenario
        .main
        .iter()
        .enumerate()
        .map(|(i, (id, byte))| ((i + 1) as u64, if i < scenario.k { 5 } else { 6 }, *id, *byte))
        .collect();
    scenario
        .members
        .iter()
        .map(|kind| {
            let mut member = Member::default();
            match kind {
                Kind::Current { len, history } => {
                    apply(&mut member, &main[..*len], *history);
                    member.last_active = 6;
                }
                Kind::Stale { len, divergent, history } => {
                    let mut entries = main[..*len].to_vec();
                    if *len == scenario.k {
                        // The old primary's writes no one else logged.
                        let tail = (0..*divergent as u64).map(|i| (*len as u64 + 1 + i, 5, i as u32, 0xEE));
                        entries.extend(tail);
                    }
                    apply(&mut member, &entries, *history);
                    member.last_active = 5;
                }
                Kind::Lost { len } => {
                    apply(&mut member, &main[..*len], 0);
                    (member.last_seq, member.last_epoch, member.last_active) = (0, 0, 0);
                    member.logged.clear();
                }
            }
            member
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..Default::default() })]

    /// Whatever the members' histories, and however often a request
    /// fails midway (the machine stops; the next one starts over on the
    /// partly recovered members), peering ends with every member
    /// holding exactly the main line's state: every write interval 6
    /// acknowledged, nothing of the divergent tails; and every member
    /// knows the request id of every main-line entry (a resend of one
    /// is answered, whoever is primary next), and of no divergent one.
    #[test]
    fn peering_converges_on_the_main_line_despite_failures(
        scenario in scenario(),
        failures in proptest::collection::vec(0u32..100, 0..64),
        fail_percent in 0u32..30,
    ) {
        let mut members = build(&scenario);
        let mut truth = Member::default();
        let main: Vec<(u64, u32, u32, u8)> = scenario.main.iter().enumerate()
            .map(|(i, (id, byte))| ((i + 1) as u64, 5, *id, *byte)).collect();
        apply(&mut truth, &main, 0);
        let main_ids: Vec<LoggedRequest> = (1..=scenario.main.len() as u64)
            .map(|seq| request_of(seq, if seq as usize <= scenario.k { 5 } else { 6 }))
            .collect();
        let ids: Vec<OsdId> = (0..members.len() as u32).collect();
        let mut draws = failures.into_iter();
        let mut interval = 10;
        let finished = loop {
            interval += 1;
            prop_assert!(interval < 200, "peering never finished");
            let (mut machine, actions) = Peering::start(7, interval, ids.clone());
            let mut queue: VecDeque<Action> = actions.into();
            let mut outcome = None;
            while let Some(action) = queue.pop_front() {
                match action {
                    Action::Send { to, tag, op } => {
                        // Failures drawn from the seed, then none: it must end.
                        if draws.next().is_some_and(|draw| draw < fail_percent) {
                            queue.extend(machine.on_failure(tag, "injected"));
                            continue;
                        }
                        let reply = members[to as usize].answer(op, interval);
                        queue.extend(machine.on_reply(tag, reply));
                    }
                    done => outcome = Some(done),
                }
            }
            if let Some(Action::Active { .. }) = outcome {
                break interval;
            }
            prop_assert!(matches!(outcome, Some(Action::Stuck(_))), "{outcome:?}");
        };
        for (i, member) in members.iter().enumerate() {
            prop_assert_eq!(&member.objects, &truth.objects, "member {} differs", i);
            prop_assert_eq!((member.last_seq, member.last_active), (scenario.main.len() as u64, finished));
            prop_assert_eq!(&member.logged, &main_ids, "member {} request ids", i);
        }
    }
}

#[test]
fn an_unfinished_backfill_is_never_the_authority_and_alone_it_waits() {
    let whole = active_member(&[("a", b"1"), ("b", b"2")]);
    // Took the newest writes while it was filled, but lacks older objects.
    let mut partial = active_member(&[("a", b"1"), ("b", b"2"), ("c", b"3")]);
    partial.objects.remove(b"a".as_slice());
    partial.backfilling = true;
    partial.last_active = 7;
    let mut members = vec![partial.clone(), whole];
    let outcome = run(&mut members, 9);
    assert!(matches!(outcome, Action::Active { authority: 1, .. }), "{outcome:?}");
    assert_eq!(members[0].objects, members[1].objects, "the partial copy was backfilled from the whole one");

    let mut alone = vec![partial.clone(), partial];
    let outcome = run(&mut alone, 9);
    // Neither of the set's OSDs answered with a whole copy.
    assert!(matches!(&outcome, Action::Stuck(why) if why.contains("is down")), "{outcome:?}");
    // With no set recorded, the same holds for want of any whole copy.
    let (mut machine, actions) = Peering::start_with_targets(7, 9, vec![0, 1], vec![], None, None);
    let outcome = drive(&mut alone, 9, &mut machine, actions);
    assert!(matches!(&outcome, Action::Stuck(why) if why.contains("unfinished backfill")), "{outcome:?}");
    assert!(alone.iter().all(|m| m.last_active == 7), "nothing was activated");
}

#[test]
fn a_copy_that_lost_its_log_does_not_stand_for_its_active_set_alone() {
    // The set was osd.0 and osd.1; both logged the newest write. osd.0
    // lost its log with the power before its store took that write (its
    // store kept the request id of an older one); osd.1 kept its log.
    let whole = active_member(&[("a", b"1"), ("b", b"2")]);
    let mut lost = active_member(&[("a", b"1")]);
    lost.log_lost = true;
    let start = |members: Vec<OsdId>| Peering::start_with_targets(7, 9, members, vec![], None, Some(vec![0, 1]));

    // osd.0 alone (osd.1 down): the PG waits for osd.1 (seed 53159).
    let mut members = vec![lost.clone(), whole.clone()];
    let (mut machine, actions) = start(vec![0]);
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(&outcome, Action::Stuck(why) if why.contains("is down") && why.contains("osd.1")), "{outcome:?}");
    assert_eq!(members[0].last_active, 5, "nothing was activated");

    // With osd.1 back, it leads and osd.0 gets the write it lost.
    let (mut machine, actions) = start(vec![0, 1]);
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { authority: 1, .. }), "{outcome:?}");
    assert_eq!(members[0].objects, whole.objects);

    // Every OSD of the set lost its log: no log holds more than their
    // stores, and together they stand for the set.
    let mut members = vec![lost.clone(), lost.clone()];
    let (mut machine, actions) = start(vec![0, 1]);
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");

    // One lost its log, the other became an unfinished backfill since: all
    // of the set answered and no copy holds more, so the whole one leads
    // (waiting would be for good; seed 2058).
    let mut partial = whole.clone();
    partial.backfilling = true;
    let mut members = vec![lost, partial];
    let (mut machine, actions) = start(vec![0, 1]);
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { authority: 0, .. }), "{outcome:?}");
}

#[test]
fn only_an_osd_of_the_last_active_set_may_lead_and_new_members_are_recorded_before_they_serve() {
    // osd.2 alone took the newest writes; osd.0 and osd.1 missed them.
    let stale = active_member(&[("a", b"old")]);
    let start = |record: Option<Vec<OsdId>>| Peering::start_with_targets(7, 9, vec![0, 1], vec![], None, record);

    let mut members = vec![stale.clone(), stale.clone()];
    let (mut machine, actions) = start(Some(vec![2]));
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(&outcome, Action::Stuck(why) if why.contains("is down") && why.contains("osd.2")), "{outcome:?}");
    assert!(members.iter().all(|m| m.last_active == 5), "nothing was activated");

    // With osd.1 in the set, it leads; the members are recorded first.
    let (mut machine, actions) = start(Some(vec![1, 2]));
    let mut queue: VecDeque<Action> = actions.into();
    let mut recorded = None;
    while let Some(action) = queue.pop_front() {
        match action {
            Action::Send { to, tag, op } => {
                let reply = members[to as usize].answer(op, 9);
                queue.extend(machine.on_reply(tag, reply));
            }
            Action::Record { members } => recorded = Some(members),
            other => panic!("{other:?} before the members were recorded"),
        }
    }
    assert_eq!(recorded, Some(vec![0, 1]));
    assert!(machine.is_recording());
    assert!(members.iter().all(|m| m.last_active == 5), "nobody serves before the map records them");
    assert!(machine.on_recorded(Some(&[1, 2])).is_empty(), "the map still has the old set");
    assert!(machine.on_recorded(None).is_empty());
    let actions = machine.on_recorded(Some(&[0, 1]));
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");
    assert!(members.iter().all(|m| m.last_active == 9));

    // The set's OSDs were marked lost (an empty set): the best copy
    // present leads, an unfinished backfill too if that is all there is.
    let mut partial = stale.clone();
    partial.backfilling = true;
    let mut members = vec![partial.clone(), partial];
    let (mut machine, actions) = start(Some(vec![]));
    let outcome = drive(&mut members, 9, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { authority: 0, .. }), "{outcome:?}");
}

#[test]
fn a_recovery_cut_short_leaves_whole_objects_with_their_ids_and_no_seq_is_reused() {
    // osd.0 logged two writes osd.1 never got (seqs 3 and 4, to x and
    // y), so neither was acknowledged; osd.0 begins to recover osd.1 by
    // history and loses its power right after the first install.
    let behind = active_member(&[("x", b"x1"), ("y", b"y1")]);
    let mut ahead = behind.clone();
    ahead.write("x", b"x2");
    ahead.write("y", b"y2");
    let mut members = vec![ahead, behind];
    let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
    let mut queue: VecDeque<Action> = actions.into();
    while let Some(action) = queue.pop_front() {
        let Action::Send { to, tag, op } = action else { panic!("{action:?} before the cut") };
        let install = matches!(op, PeerOp::Install { .. });
        let reply = members[to as usize].answer(op, 9);
        if install {
            break;
        }
        queue.extend(machine.on_reply(tag, reply));
    }
    let cut = members.pop().unwrap();
    assert!(cut.recovered, "the install marked the copy");
    assert_eq!(cut.objects[&b"x".to_vec()].0, b"x2", "the first object went whole, with its write");
    assert_eq!(cut.objects[&b"y".to_vec()].0, b"y1", "the second not at all");
    assert!(cut.logged.contains(&request_of(3, 5)), "the id of the write the copy shows came with it");
    assert!(!cut.logged.contains(&request_of(4, 5)), "not the id of a write it does not show");

    // osd.0 stays down. osd.1 (its last active set's) peers with an OSD
    // of an older interval: it leads, at an unknown position past seq
    // 3, so the new interval never reuses seq 3 (which would displace
    // the id of a write a client may have read), and every member gets
    // seq 3's id: a resend of that write is answered, not run again.
    let older = Member { last_active: 3, ..Member::default() };
    let mut members = vec![cut, older];
    let (mut machine, actions) = Peering::start_with_targets(7, 11, vec![0, 1], vec![], None, Some(vec![0, 5]));
    let outcome = drive(&mut members, 11, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { authority: 0, last_seq: 3, .. }), "{outcome:?}");
    for member in &members {
        assert!(!member.recovered, "activation settles the copy");
        assert_eq!(member.last_seq, 3);
        assert!(member.logged.contains(&request_of(3, 5)));
        assert!(!member.logged.contains(&request_of(4, 5)), "a write no member shows runs when resent");
        assert_eq!(member.objects[&b"x".to_vec()].0, b"x2");
        assert_eq!(member.objects[&b"y".to_vec()].0, b"y1");
    }

    // A changed copy and a member that kept its log, at the same seq of
    // the same interval: the known position wins, even over the
    // primary, and the changed copy is compared, not trusted (here it
    // kept a stale y of its own history).
    let mut whole = active_member(&[("x", b"x1"), ("y", b"y1")]);
    whole.write("x", b"x2");
    let mut changed = active_member(&[("x", b"x1"), ("y", b"y0")]);
    changed.objects.insert(b"x".to_vec(), (b"x2".to_vec(), Vec::new()));
    changed.logged.push(request_of(3, 5));
    changed.recovered = true;
    let mut members = vec![changed, whole];
    let (mut machine, actions) = Peering::start(7, 13, vec![0, 1]);
    let outcome = drive(&mut members, 13, &mut machine, actions);
    assert!(matches!(outcome, Action::Active { authority: 1, last_seq: 3, .. }), "{outcome:?}");
    assert_eq!(members[0].objects[&b"y".to_vec()].0, b"y1", "the changed copy was brought level");
}

#[test]
fn targets_are_fenced_and_activated_but_have_no_say_and_an_unreachable_one_is_left_out() {
    let member = active_member(&[("a", b"1")]);
    // An unfinished backfill claims a newer interval and more entries: ignored.
    let mut target = active_member(&[("a", b"9"), ("z", b"9")]);
    target.last_active = 8;
    target.backfilling = true;
    let mut members = [member.clone(), member, target];
    let (mut machine, actions) = Peering::start_with_targets(7, 9, vec![0, 1], vec![2, 3], None, Some(vec![0, 1]));
    let mut queue: VecDeque<Action> = actions.into();
    let mut primary_backfill = None;
    let outcome = loop {
        match queue.pop_front().expect("peering ends") {
            Action::Send { to: 3, tag, .. } => queue.extend(machine.on_failure(tag, "unreachable")),
            Action::Send { to, tag, op } => {
                if let (0, PeerOp::Activate { backfill, .. }) = (to, &op) {
                    primary_backfill = Some(backfill.clone());
                }
                let reply = members[to as usize].answer(op, 9);
                queue.extend(machine.on_reply(tag, reply));
            }
            end => break end,
        }
    };
    assert_eq!(outcome, Action::Active { authority: 0, last_seq: 1, recovered_objects: 0, backfill: vec![2] });
    assert_eq!(primary_backfill, Some(vec![2]), "the primary replicates to the target that answered");
    assert_eq!(members[2].answered, 2, "the target was queried and activated");
    assert_eq!(members[2].last_active, 9);
    assert!(members[2].rebuilt);
    assert_eq!(members[1].objects, members[0].objects, "nothing moved because of the target's claims");
}

/// Simulator seed 7: a target's backfill ended as its connection to the
/// primary broke, so the primary never made it a member; then the
/// primary's power went in a commit (its log lost, a block torn). The
/// target's whole copy, with its log, outranks the primary's: the primary
/// recovers from it (the torn object too) and fills it again afterwards.
/// An unfinished target, or a whole one no newer, has no say.
#[test]
fn a_target_whose_backfill_ended_is_the_authority_over_members_that_lost_their_logs() {
    let mut primary = active_member(&[("a", b"1"), ("b", b"2")]);
    let target = primary.clone();
    primary.log_lost = true;
    primary.damaged.insert(b"a".to_vec());
    let peer = |members: &mut [Member; 2]| {
        let (mut machine, actions) = Peering::start_with_targets(7, 9, vec![0], vec![1], None, Some(vec![0]));
        drive(members, 9, &mut machine, actions)
    };
    let mut members = [primary.clone(), target.clone()];
    let outcome = peer(&mut members);
    assert!(
        matches!(&outcome, Action::Active { authority: 1, last_seq: 2, recovered_objects: 1, backfill } if backfill == &[1]),
        "{outcome:?}"
    );
    assert!(members[0].damaged.is_empty(), "the torn object was copied from the target");
    assert_eq!(members[0].objects, target.objects);
    assert_eq!(members[0].logged, target.logged, "the target's ids are the PG's");
    assert!(members[1].rebuilt, "the target is filled again (level: nothing moves)");

    // An unfinished backfill has no say: the primary stays the authority.
    let mut unfinished = target.clone();
    unfinished.backfilling = true;
    let mut members = [primary.clone(), unfinished];
    let outcome = peer(&mut members);
    assert!(matches!(&outcome, Action::Active { authority: 0, recovered_objects: 0, .. }), "{outcome:?}");
    // Nor does a whole one that is no newer than the primary's copy.
    let mut kept_log = primary.clone();
    kept_log.log_lost = false;
    let mut members = [kept_log, target.clone()];
    let outcome = peer(&mut members);
    assert!(matches!(&outcome, Action::Active { authority: 0, recovered_objects: 0, .. }), "{outcome:?}");
    // One of an older interval neither.
    let mut older = target;
    older.last_active = 4;
    let mut members = [primary, older];
    let outcome = peer(&mut members);
    assert!(matches!(&outcome, Action::Active { authority: 0, .. }), "{outcome:?}");
}
