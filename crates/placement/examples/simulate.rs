//! Placement at scale: balance, data movement and mapping speed.
//!
//! ```sh
//! cargo run --release -p duplex-placement --example simulate -- [hosts] [osds-per-host] [pgs] [size]
//! ```
//! Defaults: 1,000 hosts x 10 OSDs, 1,000,000 PGs, 3 replicas. Maps every PG
//! (on all cores), prints the balance (max and min OSD load over the mean),
//! then adds one host and marks one OSD out and prints how many PG replicas
//! moved against the ideal (the share of data that had to move).

use std::time::Instant;

use duplex_placement::{pg_seed, Hierarchy, HostSpec, OsdSpec};

fn arg(n: usize, default: u32) -> u32 {
    std::env::args().nth(n).map(|s| s.parse().expect("a number")).unwrap_or(default)
}

fn map_all(h: &Hierarchy, pgs: u32, size: usize) -> (Vec<u32>, f64) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let started = Instant::now();
    let chunk = pgs.div_ceil(threads as u32);
    let parts: Vec<Vec<u32>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as u32)
            .map(|t| {
                scope.spawn(move || {
                    let mut out = Vec::with_capacity(chunk as usize * size);
                    let mut set = Vec::with_capacity(size);
                    for pg in t * chunk..((t + 1) * chunk).min(pgs) {
                        h.place_into(pg_seed(1, pg), size, &mut set);
                        assert_eq!(set.len(), size);
                        out.extend_from_slice(&set);
                    }
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("mapping thread")).collect()
    });
    (parts.concat(), started.elapsed().as_secs_f64())
}

fn moved(before: &[u32], after: &[u32], size: usize) -> u64 {
    before
        .chunks(size)
        .zip(after.chunks(size))
        .map(|(b, a)| a.iter().filter(|osd| !b.contains(osd)).count() as u64)
        .sum()
}

fn main() {
    let (hosts, per_host, pgs, size) = (arg(1, 1000), arg(2, 10), arg(3, 1_000_000), arg(4, 3) as usize);
    let spec: Vec<HostSpec> = (0..hosts)
        .map(|h| HostSpec {
            id: 1_000_000 + h,
            osds: (0..per_host).map(|o| OsdSpec { id: h * per_host + o, weight: 1 << 16, is_in: true }).collect(),
        })
        .collect();
    let osds = hosts * per_host;
    println!("{hosts} hosts x {per_host} OSDs = {osds} OSDs, {pgs} PGs, {size} replicas");
    let base = Hierarchy::new(&spec);
    let (before, seconds) = map_all(&base, pgs, size);
    println!(
        "mapping all PGs: {seconds:.2} s ({:.2} us per PG, {} threads)",
        seconds * 1e6 / pgs as f64,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let mut load = vec![0u64; osds as usize];
    for osd in &before {
        load[*osd as usize] += 1;
    }
    let mean = before.len() as f64 / osds as f64;
    let max = *load.iter().max().expect("OSDs") as f64;
    let min = *load.iter().min().expect("OSDs") as f64;
    let variance = load.iter().map(|l| (*l as f64 - mean).powi(2)).sum::<f64>() / osds as f64;
    println!(
        "balance: mean {mean:.1} replicas per OSD, max/mean {:.3}, min/mean {:.3}, stddev/mean {:.3} (binomial ideal {:.3})",
        max / mean,
        min / mean,
        variance.sqrt() / mean,
        (1.0 / mean).sqrt()
    );

    let mut grown = spec.clone();
    grown.push(HostSpec {
        id: 2_000_000,
        osds: (0..per_host).map(|o| OsdSpec { id: osds + o, weight: 1 << 16, is_in: true }).collect(),
    });
    let (after, _) = map_all(&Hierarchy::new(&grown), pgs, size);
    let ideal = before.len() as f64 * per_host as f64 / (osds + per_host) as f64;
    let m = moved(&before, &after, size) as f64;
    println!("add one host ({per_host} OSDs): {m:.0} replicas moved, ideal {ideal:.0}, ratio {:.3}", m / ideal);

    let mut one_out = spec.clone();
    one_out[hosts as usize / 2].osds[0].is_in = false;
    let gone = one_out[hosts as usize / 2].osds[0].id;
    let (after, _) = map_all(&Hierarchy::new(&one_out), pgs, size);
    let held = before.iter().filter(|o| **o == gone).count() as f64;
    let m = moved(&before, &after, size) as f64;
    println!("mark one OSD out: {m:.0} replicas moved, it held {held:.0}, ratio {:.3}", m / held);
}
