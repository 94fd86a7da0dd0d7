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
