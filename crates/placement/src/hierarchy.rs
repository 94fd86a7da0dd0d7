//! The placement hierarchy (root → host → OSD) and replica selection.

use crate::straw2::draw;

/// An OSD as placement sees it. `weight` is 16.16 fixed point (1.0 = 65536),
/// conventionally the device's capacity in TiB.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OsdSpec {
    pub id: u32,
    pub weight: u32,
    /// Out OSDs receive no data (an OSD that is merely down keeps its place).
    pub is_in: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSpec {
    pub id: u32,
    pub osds: Vec<OsdSpec>,
}

#[derive(Clone, Debug)]
struct Host {
    id: u32,
    /// Sum of the weights of all its OSDs, out ones included: marking an OSD
    /// out must not change how its host ranks, or PGs that never used that
    /// OSD would move too.
    weight: u64,
    /// OSDs with a positive weight, in or out.
    osds: Vec<OsdSpec>,
}

/// A compiled hierarchy.
#[derive(Clone, Debug)]
pub struct Hierarchy {
    hosts: Vec<Host>,
    in_osds: usize,
}

/// Rounds [`Hierarchy::place_indep`] tries for each position before it
/// leaves it empty (CRUSH's `choose_total_tries`).
const INDEP_TRIES: usize = 50;

/// `place_indep` draws in rounds from here on, apart from `place`'s 0 and 1.
const INDEP_ROUNDS: u32 = 16;

/// Larger draw wins; on a tie the smaller id wins, whatever the input order.
fn better(a: (i64, u32), b: (i64, u32)) -> bool {
    a.0 > b.0 || (a.0 == b.0 && a.1 < b.1)
}

impl Hierarchy {
    /// Compiles `hosts`; zero weights and empty hosts drop out. Panics on
    /// duplicate host or OSD ids (a malformed map, refused upstream).
    pub fn new(hosts: &[HostSpec]) -> Hierarchy {
        let mut seen_hosts = std::collections::HashSet::new();
        let mut seen_osds = std::collections::HashSet::new();
        let mut compiled = Vec::new();
        for host in hosts {
            assert!(seen_hosts.insert(host.id), "host {} appears twice", host.id);
            let osds: Vec<OsdSpec> = host
                .osds
                .iter()
                .inspect(|o| assert!(seen_osds.insert(o.id), "OSD {} appears twice", o.id))
                .filter(|o| o.weight > 0)
                .copied()
                .collect();
            let weight = osds.iter().map(|o| o.weight as u64).sum();
            if weight > 0 {
                compiled.push(Host { id: host.id, weight, osds });
            }
        }
        let in_osds = compiled.iter().flat_map(|h| &h.osds).filter(|o| o.is_in).count();
        Hierarchy { hosts: compiled, in_osds }
    }

    /// OSDs that can receive data.
    pub fn osd_count(&self) -> usize {
        self.in_osds
    }

    /// The ordered OSDs of the PG with straw2 seed `seed` (see
    /// [`crate::pg_seed`]); the first is the primary.
    ///
    /// Hosts are ranked by their straw2 draw; each host in rank order gives
    /// its best OSD, and a host whose best OSD is out is skipped (the
    /// replica goes to the next host, as a CRUSH leaf rejection does). When
    /// there are fewer usable hosts than `size`, further replicas are the
    /// next-best in OSDs of the ranked hosts. Fewer than `size` OSDs only if
    /// fewer are in.
    pub fn place(&self, seed: u32, size: usize) -> Vec<u32> {
        let mut out = Vec::with_capacity(size);
        self.place_into(seed, size, &mut out);
        out
    }

    /// [`Hierarchy::place`] into a reused buffer.
    pub fn place_into(&self, seed: u32, size: usize, out: &mut Vec<u32>) {
        out.clear();
        if size == 0 || self.in_osds == 0 {
            return;
        }
        let mut considered = (size + 2).min(self.hosts.len());
        let ranking = loop {
            let ranking = self.top_hosts(seed, considered);
            out.clear();
            for &index in &ranking {
                if out.len() == size {
                    break;
                }
                let (best, is_in) = self.best_osd(seed, index);
                if is_in {
                    out.push(best);
                }
            }
            if out.len() == size || considered == self.hosts.len() {
                break ranking;
            }
            considered = (considered * 2).min(self.hosts.len());
        };
        // Not enough usable hosts: in OSDs of the ranked hosts, best first,
        // a host's best before anyone's second (so distinct hosts come first).
        let most_osds = self.hosts.iter().map(|h| h.osds.len()).max().unwrap_or(0);
        for nth in 0..most_osds {
            for &index in &ranking {
                if out.len() == size {
                    break;
                }
                if let Some(osd) = self.nth_best_in_osd(seed, index, nth, out) {
                    out.push(osd);
                }
            }
        }
        debug_assert!(out.len() == size.min(self.in_osds), "placed {} of {size}", out.len());
        debug_assert!({
            let mut sorted = out.clone();
            sorted.sort_unstable();
            sorted.windows(2).all(|w| w[0] != w[1])
        });
    }

    /// The OSDs of an erasure-coded PG's shards, by position: position `i`
    /// holds shard `i`, and a position no usable host is left for is `None`
    /// (the PG is degraded there; two shards never share a host). Like
    /// Ceph's CRUSH `indep` mode, an OSD going out moves only the positions
    /// it held, where [`Hierarchy::place`] would shift every later replica
    /// along: a shard's position is part of what it holds, so a shift would
    /// mean rebuilding every later shard.
    ///
    /// Position `p` draws a host in rounds `p, p + size, p + 2·size, …`
    /// (all rounds in position order, so a host two positions draw goes to
    /// the one that drew it in the earlier round) by host weights, out OSDs
    /// included, so in/out never changes which host a position gets. Then
    /// the host's best in OSD for that round holds the shard; a host with
    /// no in OSD sends its position on to further rounds, among the hosts
    /// no other position holds.
    pub fn place_indep(&self, seed: u32, size: usize) -> Vec<Option<u32>> {
        let mut hosts: Vec<Option<(usize, u32)>> = vec![None; size];
        if self.in_osds == 0 {
            return vec![None; size];
        }
        let mut next_round = 0;
        for attempt in 0..INDEP_TRIES {
            let mut open = false;
            for position in 0..size {
                if hosts[position].is_some() {
                    continue;
                }
                let round = (position + size * attempt) as u32;
                let host = self.best_host(seed, round);
                if hosts.iter().flatten().any(|(h, _)| *h == host) {
                    open = true;
                } else {
                    hosts[position] = Some((host, round));
                }
            }
            next_round = attempt + 1;
            if !open {
                break;
            }
        }
        let mut out: Vec<Option<u32>> = hosts
            .iter()
            .map(|chosen| chosen.and_then(|(host, round)| self.best_in_osd_in_round(seed, host, round)))
            .collect();
        // Positions on hosts with no in OSD: later rounds, hosts no one holds.
        for position in 0..size {
            if out[position].is_some() || hosts[position].is_none() {
                continue;
            }
            for attempt in next_round..next_round + INDEP_TRIES {
                let round = (position + size * attempt) as u32;
                let host = self.best_host(seed, round);
                if hosts.iter().flatten().any(|(h, _)| *h == host) {
                    continue;
                }
                if let Some(osd) = self.best_in_osd_in_round(seed, host, round) {
                    hosts.push(Some((host, round)));
                    out[position] = Some(osd);
                    break;
                }
            }
        }
        debug_assert!({
            let mut ids: Vec<u32> = out.iter().flatten().copied().collect();
            ids.sort_unstable();
            ids.windows(2).all(|w| w[0] != w[1])
        });
        out
    }

    /// The host with the best draw in round `round` of [`Hierarchy::place_indep`].
    fn best_host(&self, seed: u32, round: u32) -> usize {
        let mut winner: Option<((i64, u32), usize)> = None;
        for (index, host) in self.hosts.iter().enumerate() {
            let d = (draw(seed, host.id, INDEP_ROUNDS + 2 * round, host.weight), host.id);
            if winner.is_none_or(|(w, _)| better(d, w)) {
                winner = Some((d, index));
            }
        }
        winner.expect("a hierarchy with in OSDs has hosts").1
    }

    /// The host's best in OSD in round `round` of [`Hierarchy::place_indep`]
    /// (`None`: all of its OSDs are out).
    fn best_in_osd_in_round(&self, seed: u32, index: usize, round: u32) -> Option<u32> {
        let mut winner: Option<(i64, u32)> = None;
        for osd in self.hosts[index].osds.iter().filter(|o| o.is_in) {
            let d = (draw(seed, osd.id, INDEP_ROUNDS + 2 * round + 1, osd.weight as u64), osd.id);
            if winner.is_none_or(|w| better(d, w)) {
                winner = Some(d);
            }
        }
        winner.map(|(_, id)| id)
    }

    /// Indexes of the `count` best hosts by draw, best first.
    fn top_hosts(&self, seed: u32, count: usize) -> Vec<usize> {
        let mut best: Vec<(i64, u32, usize)> = Vec::with_capacity(count + 1);
        for (index, host) in self.hosts.iter().enumerate() {
            let d = (draw(seed, host.id, 0, host.weight), host.id);
            if best.len() == count && !better(d, (best[count - 1].0, best[count - 1].1)) {
                continue;
            }
            let at = best.iter().position(|b| better(d, (b.0, b.1))).unwrap_or(best.len());
            best.insert(at, (d.0, d.1, index));
            best.truncate(count);
        }
        best.into_iter().map(|b| b.2).collect()
    }

    /// The host's best OSD by draw among all its OSDs, and whether it is in.
    fn best_osd(&self, seed: u32, index: usize) -> (u32, bool) {
        let mut winner: Option<((i64, u32), bool)> = None;
        for osd in &self.hosts[index].osds {
            let d = (draw(seed, osd.id, 1, osd.weight as u64), osd.id);
            if winner.is_none_or(|(w, _)| better(d, w)) {
                winner = Some((d, osd.is_in));
            }
        }
        let ((_, id), is_in) = winner.expect("compiled hosts have OSDs");
        (id, is_in)
    }

    /// The host's `n`-th best in OSD (0 = best) that is not already chosen.
    fn nth_best_in_osd(&self, seed: u32, index: usize, n: usize, chosen: &[u32]) -> Option<u32> {
        let mut ranked: Vec<(i64, u32)> = self.hosts[index]
            .osds
            .iter()
            .filter(|o| o.is_in)
            .map(|o| (draw(seed, o.id, 1, o.weight as u64), o.id))
            .collect();
        ranked.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        ranked.get(n).map(|r| r.1).filter(|id| !chosen.contains(id))
    }
}
