//! Why the tier deduplicates globally (the dissertation's table 2.1): a
//! data set with a known duplicate fraction, its objects placed on OSDs
//! by the placement crate, deduplicated within each OSD ("local") or
//! across the cluster by double hashing ("global"). Local dedup finds a
//! duplicate only when both copies' objects landed on one OSD, so its
//! ratio falls as OSDs are added; global dedup's does not move.

use std::collections::HashSet;

use duplex_placement::{pg_of, pg_seed, Hierarchy, HostSpec, OsdSpec};

/// Objects as lists of chunk contents (ids standing for fingerprints).
pub struct DataSet {
    pub objects: Vec<(Vec<u8>, Vec<u64>)>,
}

impl DataSet {
    /// `objects` objects of `chunks` chunks each; each chunk is, with
    /// probability `duplicate`, one of `common` shared contents, else a
    /// content of its own; reproducible by `seed`.
    pub fn synthetic(objects: usize, chunks: usize, duplicate: f64, common: u64, seed: u64) -> DataSet {
        let mut next = xorshift(seed);
        let mut unique = common;
        let objects = (0..objects)
            .map(|i| {
                let contents = (0..chunks)
                    .map(|_| {
                        if (next() % 1_000_000) as f64 / 1_000_000.0 < duplicate {
                            next() % common
                        } else {
                            unique += 1;
                            unique
                        }
                    })
                    .collect();
                (format!("vm{}.{:06}", i / 256, i % 256).into_bytes(), contents)
            })
            .collect();
        DataSet { objects }
    }

    /// As fio's `dedupe_percentage` makes them (the dissertation's table
    /// 2.1 workload): each chunk is, with probability `duplicate`, a copy of
    /// a chunk written before it, else new.
    pub fn copies(objects: usize, chunks: usize, duplicate: f64, seed: u64) -> DataSet {
        let mut next = xorshift(seed);
        let mut written: Vec<u64> = Vec::with_capacity(objects * chunks);
        let objects = (0..objects)
            .map(|i| {
                let contents: Vec<u64> = (0..chunks)
                    .map(|_| {
                        let content = if !written.is_empty() && (next() % 1_000_000) as f64 / 1_000_000.0 < duplicate {
                            written[(next() % written.len() as u64) as usize]
                        } else {
                            written.len() as u64 + 1_000_000_000
                        };
                        written.push(content);
                        content
                    })
                    .collect();
                (format!("fio{}.{:06}", i / 256, i % 256).into_bytes(), contents)
            })
            .collect();
        DataSet { objects }
    }

    pub fn chunks(&self) -> usize {
        self.objects.iter().map(|(_, c)| c.len()).sum()
    }

    /// Logical chunks over distinct ones: the best any dedup can do.
    pub fn global_ratio(&self) -> f64 {
        let distinct: HashSet<u64> = self.objects.iter().flat_map(|(_, c)| c.iter().copied()).collect();
        self.chunks() as f64 / distinct.len() as f64
    }

    /// The same with each OSD deduplicating only the objects placed on
    /// it (one copy each: `osds` hosts of one OSD, `pg_num` PGs).
    pub fn local_ratio(&self, osds: u32, pg_num: u32) -> f64 {
        let hosts: Vec<HostSpec> =
            (0..osds).map(|id| HostSpec { id, osds: vec![OsdSpec { id, weight: 1 << 16, is_in: true }] }).collect();
        let hierarchy = Hierarchy::new(&hosts);
        let mut per_osd: Vec<HashSet<u64>> = vec![HashSet::new(); osds as usize];
        for (name, contents) in &self.objects {
            let osd = hierarchy.place(pg_seed(1, pg_of(name, pg_num)), 1)[0];
            per_osd[osd as usize].extend(contents.iter().copied());
        }
        let stored: usize = per_osd.iter().map(HashSet::len).sum();
        self.chunks() as f64 / stored as f64
    }
}

/// A tiny reproducible generator (xorshift64): the data sets need no more.
fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_dedup_loses_ratio_as_osds_are_added_and_global_does_not() {
        // Half the chunks drawn from 2,000 common contents.
        let data = DataSet::synthetic(2_000, 16, 0.5, 2_000, 7);
        let global = data.global_ratio();
        assert!((1.7..2.0).contains(&global), "global ratio {global}");
        let mut last = f64::MAX;
        for osds in [1, 4, 16] {
            let local = data.local_ratio(osds, 256);
            assert!(local <= global + 1e-9, "local {local} beats global {global}");
            assert!(local < last, "{osds} OSDs: local {local} did not fall from {last}");
            last = local;
        }
        assert!((data.local_ratio(1, 256) - global).abs() < 1e-9, "one OSD is global");
        // Copies of earlier chunks: half of them duplicates, so the best
        // dedup saves about half.
        let fio = DataSet::copies(2_000, 16, 0.5, 9);
        let saved = 1.0 - 1.0 / fio.global_ratio();
        assert!((0.45..0.55).contains(&saved), "global saves {saved}");
        let local_saved = |osds| 1.0 - 1.0 / fio.local_ratio(osds, 256);
        let (four, sixteen) = (local_saved(4), local_saved(16));
        assert!(sixteen < four && four < saved * 0.7, "locally saved: {four} on 4 OSDs, {sixteen} on 16, of {saved}");
    }
}
