//! Whose history wins, and how each other member catches up with it.

use std::collections::BTreeMap;

use duplex_map::OsdId;
use duplex_proto::peering::PeerInfo;

use super::Plan;

/// The member whose history wins: newest `last_active`, then a position
/// its log knows over a lost one ([`PeerInfo::position_lost`]: a lost log,
/// or a copy an unfinished recovery changed, which reports a seq past
/// every id it holds but whose store's record may name a write whose data
/// never landed), then highest `last_seq`; on a tie the primary (no data
/// needs to move through it), then the lowest id. A member with no entry
/// at all knows its position: it wins over a lost one of its interval
/// (simulator seed 8840, where "epoch 0" told the two apart no more). An unfinished backfill lacks objects and never wins:
/// with only such members there is no authority (the PG waits for an OSD
/// that holds it whole), unless `lost` (every whole copy was marked lost:
/// the best unfinished one is all there is).
pub fn choose_authority(primary: OsdId, infos: &BTreeMap<OsdId, PeerInfo>, lost: bool) -> Option<(OsdId, PeerInfo)> {
    let best = |unfinished: bool| {
        infos
            .iter()
            .filter(|(_, info)| info.backfilling == unfinished)
            .max_by_key(|(osd, info)| (rank(info), **osd == primary, std::cmp::Reverse(**osd)))
            .map(|(osd, info)| (*osd, *info))
    };
    best(false).or_else(|| if lost { best(true) } else { None })
}

/// A backfill target whose copy is whole (its backfill ended) and whose
/// history outranks `authority`'s, the best member's, by the key of
/// [`choose_authority`]: the best such target.
///
/// A target takes every write of its interval, like a member, so once
/// its backfill ended its copy is as good as one: better, when the
/// members lost their logs or fell behind. Simulator seed 7 (pool size
/// 2, min_size 1, two faults at once): osd.2's backfill ended as the
/// connection to the primary osd.3 broke, so osd.3 never made it a
/// member; osd.3's power then went in a commit (a torn block, its log
/// lost), and peering chose osd.3 over osd.2's whole copy and filled
/// osd.2 again from the torn one: no good copy was left to repair from.
/// Only a target with its whole log (`!log_lost`, `!position_lost`)
/// qualifies, so that what it holds is known.
pub fn whole_target_over(
    authority: &PeerInfo,
    targets: &BTreeMap<OsdId, (PeerInfo, Vec<duplex_proto::peering::LoggedRequest>)>,
) -> Option<OsdId> {
    targets
        .iter()
        .filter(|(_, (info, _))| whole_with_its_log(info) && rank(info) > rank(authority))
        .max_by_key(|(osd, (info, _))| (rank(info), std::cmp::Reverse(**osd)))
        .map(|(osd, _)| *osd)
}

/// How one copy's history ranks against another's: newest `last_active`,
/// then a known position over a lost one, then highest `last_seq`.
pub(super) fn rank(info: &PeerInfo) -> (u64, bool, u64) {
    (info.last_active, !info.position_lost, info.last_seq)
}

/// A copy holding the whole PG with the log that places it: a target's
/// answer counts only then ([`whole_target_over`]).
pub(super) fn whole_with_its_log(info: &PeerInfo) -> bool {
    !info.backfilling && !info.log_lost && !info.position_lost
}

/// How `member` catches up with the authority in the interval that began
/// at epoch `interval` (`None`: it already has).
pub(super) fn plan_for(member: &PeerInfo, authority: &PeerInfo, interval: u64) -> Option<Plan> {
    // Logs that end at the same entry hold the same history; an epoch of 0
    // proves nothing (no entry, or the log was lost), unless the member
    // was active in this very interval: peering (or a backfill in the
    // background) made it level then, and a lost log would have begun
    // another interval (a restart). Without that, a PG with no write yet
    // would fill such a member again at every peering.
    let end = |info: &PeerInfo| (info.last_seq, info.last_epoch);
    if (member.last_epoch > 0 || member.last_active == interval) && end(member) == end(authority) {
        return None;
    }
    // Behind, and the authority's history reaches back to the member's
    // last entry (whose epoch it checks): copy what the gap touched.
    if member.last_epoch > 0 && member.last_seq < authority.last_seq && authority.history_from <= member.last_seq {
        return Some(Plan::History { after: member.last_seq, after_epoch: member.last_epoch });
    }
    Some(Plan::Backfill)
}
