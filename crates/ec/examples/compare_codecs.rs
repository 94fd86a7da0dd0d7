//! The two Reed-Solomon crates on this machine, for the codes EC pools use:
//! full-stripe encode throughput, and the parity update of one 4 KiB write.
//!
//!     cargo run --release -p duplex-ec --example compare_codecs
//!
//! (`reed-solomon-erasure` with its `simd-accel` C code; `reed-solomon-simd`
//! as `duplex_ec::Codec` uses it.) Prints one line per code and unit.

use std::hint::black_box;
use std::time::{Duration, Instant};

use duplex_ec::{codec::apply_delta, Codec, Profile};
use rand::{Rng, SeedableRng};

/// Runs `work` for about `budget`; returns calls per second.
fn rate(budget: Duration, mut work: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < budget {
        for _ in 0..16 {
            work();
        }
        calls += 16;
    }
    calls as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let budget = Duration::from_millis(700);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    println!("| code | stripe unit | simd encode GiB/s | erasure encode GiB/s | simd 4 KiB delta µs | erasure 4 KiB update µs |");
    println!("| --- | --- | --- | --- | --- | --- |");
    for (k, m) in [(2usize, 1usize), (2, 2), (4, 2)] {
        for unit in [4096usize, 65536] {
            let data: Vec<Vec<u8>> = (0..k).map(|_| (0..unit).map(|_| rng.gen()).collect()).collect();
            let stripe_bytes = (k * unit) as f64;

            let mut codec = Codec::new(Profile::new(k as u32, m as u32, unit as u64).expect("a tested code"));
            let refs: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
            let simd = rate(budget, || {
                black_box(codec.encode(black_box(&refs)).expect("encodes"));
            }) * stripe_bytes;

            let erasure = reed_solomon_erasure::galois_8::ReedSolomon::new(k, m).expect("a tested code");
            let mut shards: Vec<Vec<u8>> = data.iter().cloned().chain((0..m).map(|_| vec![0u8; unit])).collect();
            let classic = rate(budget, || {
                erasure.encode(black_box(&mut shards)).expect("encodes");
            }) * stripe_bytes;

            // One 4 KiB write to data shard 0: the parity's change.
            let old = data[0][..4096].to_vec();
            let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
            let mut parity = vec![vec![0u8; 4096]; m];
            let simd_delta = rate(budget, || {
                for (shard, delta) in parity.iter_mut().zip(codec.parity_delta(0, &old, &new).expect("delta")) {
                    apply_delta(shard, &delta);
                }
            });
            // reed-solomon-erasure has no delta: re-encode the 4 KiB columns of the stripe.
            let mut columns: Vec<Vec<u8>> =
                (0..k + m).map(|i| if i < k { data[i][..4096].to_vec() } else { vec![0; 4096] }).collect();
            let erasure_update = rate(budget, || {
                erasure.encode(black_box(&mut columns)).expect("encodes");
            });
            println!(
                "| {k}+{m} | {} KiB | {:.2} | {:.2} | {:.2} | {:.2} |",
                unit >> 10,
                simd / (1u64 << 30) as f64,
                classic / (1u64 << 30) as f64,
                1e6 / simd_delta,
                1e6 / erasure_update,
            );
        }
    }
}
