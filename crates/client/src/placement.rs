//! Where an operation goes, and when it is tried again: the one place that
//! decides both, for every way this crate sends operations ([`crate::Client`]'s
//! I/O thread, [`crate::ObjectClient`] and the [`crate::load`] generator).
//!
//! Each of them used to compute object → PG → acting set → primary itself
//! and read the OSD's answer itself; three copies of one rule drift apart
//! (a status retried by one and failed by another, a request stamped with
//! an epoch other than the map it was placed under). Here:
//!
//! - [`locate`] / [`locate_pg`]: a [`Target`], the PG and its primary under
//!   one map, and [`Target::request`], the request stamped with that map's
//!   epoch (the OSD compares it with its own to answer `WrongOsd`).
//! - [`judge`]: what an answer means: done (with the client's result), try
//!   again after a pause, or wait for a newer map first ([`Next`]).
//! - [`RetryPolicy`]: how long to pause between attempts, and [`Deadline`]:
//!   when to stop and say [`ClientError::TimedOut`].

use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_map::{ClusterMap, OsdId, Pool};
use duplex_placement::Hierarchy;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};

use crate::error::ClientError;

/// Where an operation goes under one map: its PG and that PG's primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub pool: u32,
    pub pg: u32,
    /// The first OSD of the PG's acting set; `None` while none of it is up.
    pub primary: Option<OsdId>,
    /// The epoch of the map this was computed under.
    pub epoch: u64,
}

/// Where `object` of `pool` goes under `map` (`hierarchy` is `map`'s).
pub(crate) fn locate(map: &ClusterMap, hierarchy: &Hierarchy, pool: u32, object: &[u8]) -> Result<Target, ClientError> {
    place(map, hierarchy, pool, |info| duplex_placement::pg_of(object, info.pg_num))
}

/// Where an operation on PG `pg` of `pool` goes (listings name their PG).
pub(crate) fn locate_pg(map: &ClusterMap, hierarchy: &Hierarchy, pool: u32, pg: u32) -> Result<Target, ClientError> {
    place(map, hierarchy, pool, |_| pg)
}

fn place(
    map: &ClusterMap,
    hierarchy: &Hierarchy,
    pool: u32,
    pg_of: impl FnOnce(&Pool) -> u32,
) -> Result<Target, ClientError> {
    let info = map.pools.get(&pool).ok_or_else(|| ClientError::NoSuchPool(format!("id {pool}")))?;
    let pg = pg_of(info);
    if pg >= info.pg_num {
        return Err(ClientError::Invalid(format!("pool {pool} has {} PGs", info.pg_num)));
    }
    let primary = duplex_map::primary_of(&map.acting(hierarchy, info, pg));
    Ok(Target { pool, pg, primary, epoch: map.epoch })
}

impl Target {
    /// The primary, or, while no OSD of the PG is up, what to do instead:
    /// wait for the next map.
    pub fn primary_or_wait(&self) -> Result<OsdId, Next> {
        self.primary.ok_or_else(|| Next::AwaitMap {
            epoch: self.epoch + 1,
            problem: format!("PG {}.{} has no OSD up", self.pool, self.pg),
        })
    }

    /// The request for this target, stamped with the epoch it was placed under.
    pub fn request(
        &self,
        kind: OpKind,
        object: Bytes,
        offset: u64,
        length: u32,
        data: Bytes,
        client: u64,
    ) -> OpRequest {
        OpRequest {
            kind,
            pool: self.pool,
            pg: self.pg,
            map_epoch: self.epoch,
            object,
            offset,
            length,
            data,
            client,
            snap: 0,
        }
    }
}

/// What comes after an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// The operation ends with this.
    Done(Result<Bytes, ClientError>),
    /// Send again (same request id) after a [`RetryPolicy::backoff`], to
    /// the primary the map names then.
    Retry(String),
    /// Send again once the map reaches `epoch` (or after
    /// [`RetryPolicy::max_backoff`], should it not come).
    AwaitMap { epoch: u64, problem: String },
}

/// What `osd`'s `reply` means to a client whose map is at `map_epoch`.
/// `NotFound`, `Invalid` and `Io` end the operation; `Retry` and `WrongOsd`
/// do not (`WrongOsd` from an OSD with a newer map waits for that map).
pub(crate) fn judge(osd: OsdId, reply: OpReply, map_epoch: u64) -> Next {
    match reply.status {
        Status::Ok => Next::Done(Ok(reply.data)),
        Status::NotFound => Next::Done(Err(ClientError::NotFound)),
        Status::Invalid => Next::Done(Err(ClientError::Invalid(reply.message()))),
        Status::Io => Next::Done(Err(ClientError::Io(reply.message()))),
        Status::NoSpace => Next::Done(Err(ClientError::NoSpace(reply.message()))),
        Status::WrongOsd if reply.map_epoch > map_epoch => {
            Next::AwaitMap { epoch: reply.map_epoch, problem: at_osd(osd, reply.message()) }
        }
        Status::WrongOsd | Status::Retry => Next::Retry(at_osd(osd, reply.message())),
    }
}

/// A problem at `osd`, as [`ClientError::TimedOut`] names it.
pub(crate) fn at_osd(osd: OsdId, why: impl std::fmt::Display) -> String {
    format!("OSD {osd}: {why}")
}

/// How long to pause before the next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// The pause after the first attempt; it doubles with each attempt after.
    pub first_backoff: Duration,
    /// The longest pause, and the longest wait for a map an OSD said is newer.
    pub max_backoff: Duration,
}

impl RetryPolicy {
    /// [`crate::Client`]: 2 ms, doubling, up to 250 ms (many operations in
    /// flight; a new map also resends at once).
    pub const PIPELINED: RetryPolicy =
        RetryPolicy { first_backoff: Duration::from_millis(2), max_backoff: Duration::from_millis(250) };
    /// [`crate::ObjectClient`]: 50 ms every time, then a map fetch.
    pub const ONE_AT_A_TIME: RetryPolicy =
        RetryPolicy { first_backoff: Duration::from_millis(50), max_backoff: Duration::from_millis(50) };

    /// The pause after `attempts` sends.
    pub fn backoff(&self, attempts: u32) -> Duration {
        self.first_backoff.saturating_mul(1 << attempts.min(7)).min(self.max_backoff)
    }
}

/// When an operation stops being tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Deadline {
    at: Instant,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline { at: Instant::now() + timeout, timeout }
    }

    pub fn passed(&self, now: Instant) -> bool {
        self.at <= now
    }

    /// The error an operation ends with at its deadline.
    pub fn timed_out(&self, last_problem: String) -> ClientError {
        let problem = if last_problem.is_empty() { "no reply from the primary".to_string() } else { last_problem };
        ClientError::TimedOut(self.timeout, problem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duplex_map::Command;

    const ONE: u32 = 1 << 16;

    /// Six OSDs on three hosts, pool "rbd" (id 1) of 2 replicas and 64 PGs.
    fn cluster() -> ClusterMap {
        let mut map = ClusterMap::new([1; 16]);
        for id in 0..6 {
            let boot = Command::OsdBoot {
                id,
                addr: format!("127.0.0.1:{}", 6800 + id),
                host: format!("host-{}", id / 2),
                weight: ONE,
            };
            map.run(&boot).unwrap();
        }
        map.run(&Command::PoolCreate { name: "rbd".into(), size: 2, min_size: 1, pg_num: 64 }).unwrap();
        map
    }

    #[test]
    fn the_primary_is_the_first_of_the_acting_set() {
        let map = cluster();
        let hierarchy = map.hierarchy();
        let pool = map.pool_by_name("rbd").unwrap().clone();
        let mut primaries = std::collections::BTreeSet::new();
        for n in 0..32 {
            let name = format!("obj.{n}");
            let target = locate(&map, &hierarchy, pool.id, name.as_bytes()).unwrap();
            let pg = duplex_placement::pg_of(name.as_bytes(), pool.pg_num);
            let acting = map.acting(&hierarchy, &pool, pg);
            assert_eq!(acting.len(), 2, "{name}: two replicas");
            assert_eq!(target, Target { pool: pool.id, pg, primary: Some(acting[0]), epoch: map.epoch }, "{name}");
            assert_eq!(target.primary_or_wait(), Ok(acting[0]));
            primaries.insert(acting[0]);
            let request = target.request(OpKind::Read, Bytes::from(name), 4096, 512, Bytes::new(), 9);
            assert_eq!((request.pool, request.pg, request.map_epoch), (pool.id, pg, map.epoch));
        }
        assert!(primaries.len() > 1, "objects spread over several primaries: {primaries:?}");
        assert_eq!(locate_pg(&map, &hierarchy, pool.id, 5).unwrap().pg, 5);
    }

    #[test]
    fn a_pg_with_no_osd_up_waits_for_the_next_map() {
        let mut map = cluster();
        for id in 0..6 {
            map.run(&Command::MarkDown { id }).unwrap();
        }
        let target = locate(&map, &map.hierarchy(), 1, b"obj").unwrap();
        assert_eq!(target.primary, None);
        assert_eq!(
            target.primary_or_wait(),
            Err(Next::AwaitMap { epoch: map.epoch + 1, problem: format!("PG 1.{} has no OSD up", target.pg) })
        );
    }

    #[test]
    fn an_unknown_pool_or_pg_is_an_error() {
        let map = cluster();
        let hierarchy = map.hierarchy();
        assert_eq!(locate(&map, &hierarchy, 7, b"obj"), Err(ClientError::NoSuchPool("id 7".into())));
        assert_eq!(map.pool_by_name("rbd").map(|p| p.id), Some(1));
        assert_eq!(locate_pg(&map, &hierarchy, 1, 64), Err(ClientError::Invalid("pool 1 has 64 PGs".into())));
    }

    #[test]
    fn retry_and_wrong_osd_are_retried_and_the_rest_end_the_operation() {
        let answer = |status, epoch| judge(3, OpReply::error(status, epoch, "why"), 10);
        assert_eq!(answer(Status::Retry, 10), Next::Retry("OSD 3: why".into()));
        assert_eq!(answer(Status::WrongOsd, 10), Next::Retry("OSD 3: why".into()));
        assert_eq!(answer(Status::WrongOsd, 9), Next::Retry("OSD 3: why".into()));
        assert_eq!(answer(Status::WrongOsd, 12), Next::AwaitMap { epoch: 12, problem: "OSD 3: why".into() });
        assert_eq!(answer(Status::NotFound, 10), Next::Done(Err(ClientError::NotFound)));
        assert_eq!(answer(Status::Invalid, 10), Next::Done(Err(ClientError::Invalid("why".into()))));
        assert_eq!(answer(Status::Io, 10), Next::Done(Err(ClientError::Io("why".into()))));
        assert_eq!(answer(Status::Ok, 10), Next::Done(Ok(Bytes::from_static(b"why"))));
    }

    #[test]
    fn backoff_doubles_up_to_its_limit() {
        let ms = Duration::from_millis;
        let pipelined: Vec<Duration> = (0..10).map(|n| RetryPolicy::PIPELINED.backoff(n)).collect();
        assert_eq!(pipelined, [2, 4, 8, 16, 32, 64, 128, 250, 250, 250].map(ms));
        assert_eq!(RetryPolicy::PIPELINED.backoff(u32::MAX), ms(250));
        assert!((0..20).all(|n| RetryPolicy::ONE_AT_A_TIME.backoff(n) == ms(50)));
    }

    #[test]
    fn a_deadline_passes_at_its_instant_and_names_the_last_problem() {
        let deadline = Deadline::after(Duration::from_secs(3600));
        assert!(!deadline.passed(Instant::now()));
        assert!(deadline.passed(deadline.at));
        let timeout = Duration::from_secs(3600);
        assert_eq!(deadline.timed_out("OSD 1: busy".into()), ClientError::TimedOut(timeout, "OSD 1: busy".into()));
        assert_eq!(
            deadline.timed_out(String::new()),
            ClientError::TimedOut(timeout, "no reply from the primary".into())
        );
    }
}
