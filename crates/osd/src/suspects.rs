//! Peers whose connections broke, probed for whether their process is gone.
//!
//! A peer whose connection to an OSD broke (or whose peering request
//! failed) names that OSD a suspect. This OSD's suspects thread probes the
//! suspect's address from the map: if nothing listens there any more (the
//! connection is refused), the process is gone, and the monitors mark it
//! down at once instead of after the heartbeat grace (Ceph's
//! `osd_fast_fail_on_connection_refused`). A hung OSD's port still accepts,
//! and one cut off answers nothing: both are left to the grace.
//!
//! A process killed with -9 does not vanish at once: a thread of it in an
//! uninterruptible device wait (an fsync under load) keeps every socket of
//! it open, the listener too, until that wait ends. A probe in that window
//! is accepted. Its connections then break, and its peers name it again,
//! but perhaps within the interval one suspect is probed at most once: that
//! naming must not be dropped (it once was, and a killed OSD then waited
//! for the 6 s grace). So a naming inside the interval is deferred to its
//! end, and a probe that was accepted is made once more after the interval.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use duplex_map::OsdId;
use duplex_mon_client::MonMessage;

use crate::cluster::{heartbeat_client, MapCell, MonLink};

/// How long a probe of a suspect's address waits for its answer. A gone
/// process's address answers at once (the kernel refuses); a hung one's
/// accepts; one cut off answers nothing, and is left to the grace.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// One suspect is probed at most this often.
const PROBE_AGAIN_AFTER: Duration = Duration::from_millis(500);

/// When to probe which suspect: pure, so that its rules are tested without
/// sockets or clocks.
#[derive(Debug, Default)]
pub struct ProbeSchedule {
    /// When each suspect was last probed.
    probed: HashMap<OsdId, Instant>,
    /// Probes owed, and when they are due; `true`: a re-check of an
    /// accepted probe (accepted again, it is not made a third time).
    owed: HashMap<OsdId, (Instant, bool)>,
}

/// What a probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    /// Refused: the process is gone.
    Refused,
    /// Accepted: a process listens (perhaps one that is still exiting).
    Accepted,
    /// No answer in time, or another error: left to the grace.
    Inconclusive,
}

impl ProbeSchedule {
    /// `osd` was named a suspect at `now`.
    pub fn named(&mut self, osd: OsdId, now: Instant) {
        let due = match self.probed.get(&osd) {
            Some(at) => (*at + PROBE_AGAIN_AFTER).max(now),
            None => now,
        };
        // A naming makes a full probe owed (not a re-check), as early as allowed.
        let entry = self.owed.entry(osd).or_insert((due, false));
        *entry = (entry.0.min(due), false);
    }

    /// The probes due at `now`, removed from what is owed, in OSD order.
    pub fn due(&mut self, now: Instant) -> Vec<(OsdId, bool)> {
        let mut due: Vec<(OsdId, bool)> =
            self.owed.iter().filter(|(_, (at, _))| *at <= now).map(|(osd, (_, recheck))| (*osd, *recheck)).collect();
        due.sort_unstable();
        for (osd, _) in &due {
            self.owed.remove(osd);
            self.probed.insert(*osd, now);
        }
        debug_assert!(self.owed.values().all(|(at, _)| *at > now), "a due probe left owed");
        due
    }

    /// The probe of `osd` (a re-check or not) made at `now` found `result`.
    pub fn found(&mut self, osd: OsdId, recheck: bool, result: ProbeResult, now: Instant) {
        if result == ProbeResult::Accepted && !recheck {
            let entry = self.owed.entry(osd).or_insert((now + PROBE_AGAIN_AFTER, true));
            entry.0 = entry.0.min(now + PROBE_AGAIN_AFTER);
        }
    }

    /// When the next owed probe is due (None: none is owed).
    pub fn next_due(&self) -> Option<Instant> {
        self.owed.values().map(|(at, _)| *at).min()
    }

    /// Forgets suspects probed long ago, so that the table stays as small
    /// as the set of recent suspects.
    pub fn forget_before(&mut self, before: Instant) {
        self.probed.retain(|osd, at| *at >= before || self.owed.contains_key(osd));
    }
}

/// Starts the thread that probes suspects (see the module's comment).
/// Returns where the other threads name their suspects.
pub fn watch_suspects(link: MonLink, cell: Arc<MapCell>) -> std::io::Result<crossbeam_channel::Sender<OsdId>> {
    let (suspects, named) = crossbeam_channel::bounded::<OsdId>(256);
    std::thread::Builder::new().name("osd-suspects".into()).spawn(move || {
        let mut client = heartbeat_client(&link);
        let mut schedule = ProbeSchedule::default();
        loop {
            let wait = schedule.next_due().map(|at| at.saturating_duration_since(Instant::now()));
            let received = match wait {
                Some(wait) => named.recv_timeout(wait),
                None => named.recv().map_err(|_| crossbeam_channel::RecvTimeoutError::Disconnected),
            };
            match received {
                Ok(osd) if osd != link.id => schedule.named(osd, Instant::now()),
                Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            }
            for (osd, recheck) in schedule.due(Instant::now()) {
                let result = probe(&link, &cell, &mut client, osd);
                schedule.found(osd, recheck, result, Instant::now());
            }
            if let Some(long_ago) = Instant::now().checked_sub(PROBE_AGAIN_AFTER) {
                // Probed before that, a suspect named now is probed at once anyway.
                schedule.forget_before(long_ago);
            }
        }
    })?;
    Ok(suspects)
}

/// Probes `osd`'s address from the current map, and reports it gone to the
/// monitors if it refuses.
fn probe(link: &MonLink, cell: &MapCell, client: &mut duplex_mon_client::MonClient, osd: OsdId) -> ProbeResult {
    let view = cell.load();
    let Some(info) = view.map.osds.get(&osd).filter(|o| o.up) else { return ProbeResult::Inconclusive };
    let Some(addr) = view.addr_of(osd) else { return ProbeResult::Inconclusive };
    let incarnation = info.state_epoch;
    match std::net::TcpStream::connect_timeout(&addr, PROBE_TIMEOUT) {
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            tracing::warn!(osd, %addr, "a peer's address refuses connections: reporting it gone");
            let report = MonMessage::PeerRefused { target: osd, incarnation, reporter: link.id };
            if let Err(err) = client.notify(&report) {
                tracing::warn!(osd, %err, "the monitors did not take the report; the grace will find it");
            }
            ProbeResult::Refused
        }
        Err(err) => {
            tracing::debug!(osd, %addr, %err, "probe of a suspect peer failed, not refused");
            ProbeResult::Inconclusive
        }
        Ok(_) => {
            tracing::debug!(osd, %addr, "a suspect peer accepts connections: still there (checked again shortly)");
            ProbeResult::Accepted
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_naming_is_probed_at_once() {
        let now = Instant::now();
        let mut schedule = ProbeSchedule::default();
        schedule.named(3, now);
        assert_eq!(schedule.next_due(), Some(now));
        assert_eq!(schedule.due(now), vec![(3, false)]);
        assert_eq!(schedule.next_due(), None);
    }

    /// The 6 s failover: a kill -9'd OSD still exiting is probed and
    /// accepts; its connections break 0.2 s later and it is named again.
    /// That naming is kept, and probed at the interval's end.
    #[test]
    fn a_naming_inside_the_interval_is_deferred_not_dropped() {
        let start = Instant::now();
        let mut schedule = ProbeSchedule::default();
        schedule.named(1, start);
        assert_eq!(schedule.due(start), vec![(1, false)]);
        schedule.found(1, false, ProbeResult::Inconclusive, start);
        assert_eq!(schedule.next_due(), None, "an inconclusive probe is not re-checked by itself");
        let again = start + Duration::from_millis(200);
        schedule.named(1, again);
        assert!(schedule.due(again).is_empty(), "inside the interval");
        assert_eq!(schedule.next_due(), Some(start + PROBE_AGAIN_AFTER));
        assert_eq!(schedule.due(start + PROBE_AGAIN_AFTER), vec![(1, false)]);
    }

    #[test]
    fn an_accepted_probe_is_checked_once_more() {
        let start = Instant::now();
        let mut schedule = ProbeSchedule::default();
        schedule.named(2, start);
        assert_eq!(schedule.due(start), vec![(2, false)]);
        schedule.found(2, false, ProbeResult::Accepted, start);
        let later = start + PROBE_AGAIN_AFTER;
        assert_eq!(schedule.next_due(), Some(later));
        assert_eq!(schedule.due(later), vec![(2, true)]);
        schedule.found(2, true, ProbeResult::Accepted, later);
        assert_eq!(schedule.next_due(), None, "a hung OSD is not probed forever: the grace finds it");
    }

    #[test]
    fn a_naming_while_a_recheck_is_owed_makes_a_full_probe() {
        let start = Instant::now();
        let mut schedule = ProbeSchedule::default();
        schedule.named(2, start);
        schedule.due(start);
        schedule.found(2, false, ProbeResult::Accepted, start);
        schedule.named(2, start + Duration::from_millis(100));
        let later = start + PROBE_AGAIN_AFTER;
        assert_eq!(schedule.due(later), vec![(2, false)]);
        assert!(schedule.due(later + PROBE_AGAIN_AFTER).is_empty());
    }

    #[test]
    fn suspects_are_probed_in_osd_order_and_forgotten_later() {
        let start = Instant::now();
        let mut schedule = ProbeSchedule::default();
        for osd in [5, 1, 3] {
            schedule.named(osd, start);
        }
        assert_eq!(schedule.due(start), vec![(1, false), (3, false), (5, false)]);
        schedule.forget_before(start + Duration::from_secs(1));
        schedule.named(3, start + Duration::from_secs(1));
        assert_eq!(schedule.due(start + Duration::from_secs(1)), vec![(3, false)], "forgotten: probed at once");
    }
}
