//! The verifying workload of the fault tests: stamped 4 KiB blocks written
//! and read at random through an image, every operation recorded with its
//! times, then a final read of every block; `duplex_verify::check` judges
//! the history (no acknowledged write lost, no read back in time).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;

use bytes::Bytes;
use duplex_client::Image;
use duplex_verify::{History, Outcome, Recorder, Stamp};
use rand::{Rng, SeedableRng};

pub const BLOCK: u64 = 4096;

pub struct Counters {
    pub acknowledged: AtomicU64,
    pub failed: AtomicU64,
    pub reads: AtomicU64,
}

/// Random stamped writes (and 1 in 5 reads) over `blocks` blocks, `in_flight`
/// at a time, until `stop`. Failed writes are recorded as unknown outcomes.
pub fn run(
    image: &Arc<Image>,
    recorder: &Arc<Recorder>,
    writer: u32,
    blocks: u64,
    in_flight: usize,
    stop: &AtomicBool,
    counters: &Arc<Counters>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(writer as u64);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut outstanding = 0;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        while outstanding < in_flight {
            let block = rng.gen_range(0..blocks);
            let ticket = recorder.invoke();
            let (recorder, counters, done) = (Arc::clone(recorder), Arc::clone(counters), done_tx.clone());
            if rng.gen_ratio(1, 5) {
                image.read_async(
                    block * BLOCK,
                    BLOCK as u32,
                    Box::new(move |result| {
                        if let Ok(data) = result {
                            recorder.read_done(ticket, block, &data, false);
                            counters.reads.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = done.send(());
                    }),
                );
            } else {
                seq += 1;
                let stamp = Stamp { writer, seq, block };
                image.write_async(
                    block * BLOCK,
                    Bytes::from(stamp.encode(BLOCK as usize)),
                    Box::new(move |result| {
                        let outcome = if result.is_ok() { Outcome::Acknowledged } else { Outcome::Unknown };
                        recorder.write_done(ticket, stamp, outcome);
                        let counter = if result.is_ok() { &counters.acknowledged } else { &counters.failed };
                        counter.fetch_add(1, Ordering::Relaxed);
                        let _ = done.send(());
                    }),
                );
            }
            outstanding += 1;
        }
        if done_rx.recv().is_ok() {
            outstanding -= 1;
        }
    }
    while outstanding > 0 && done_rx.recv().is_ok() {
        outstanding -= 1;
    }
}

/// Reads every block once more (the final check) and returns the history.
pub fn finish(image: &Image, recorder: &Recorder, blocks: u64) -> History {
    for block in 0..blocks {
        let ticket = recorder.invoke();
        let data =
            image.read(block * BLOCK, BLOCK as u32).unwrap_or_else(|e| panic!("final read of block {block}: {e}"));
        recorder.read_done(ticket, block, &data, true);
    }
    recorder.history()
}
