//! The store against a model: random batches of write / truncate / delete /
//! pre-allocate / attribute operations, with unmount-remount (and sometimes
//! a "crash": dropping the store without a checkpoint) in between; every
//! read equals the model, and fsck stays clean.

mod common;

use common::*;
use duplex_store::{fsck, IoBackend, Store};
use proptest::prelude::*;

fn run(seed: u64, batches: usize, backend: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(backend);
    // A 16 KiB journal forces checkpoints every few batches.
    let path = make_store(dir.path(), 48 << 20, 2, 16 << 10, &config);
    let mut model = Model::default();
    let mut rng = rng(seed);
    let mut store = Store::open(&path, &config).unwrap();
    for round in 0..batches {
        // Batches are per partition: split each random batch by partition.
        let batch = random_batch(&mut rng, 2, 5, 6);
        let (group, single) = first_group_only(batch);
        let expected = model.apply(&single);
        let result = store.partition_for(&group.to_be_bytes()).apply(&single);
        match (&expected, &result) {
            (Ok(()), Ok(_)) => {}
            (Err(_), Err(err)) if is_rejection(err) => {}
            _ => panic!("round {round}: model says {expected:?}, store says {result:?} for {single:?}"),
        }
        if round % 9 == 8 {
            if rand::Rng::gen_bool(&mut rng, 0.5) {
                store.close().unwrap();
            } else {
                drop(store); // no checkpoint: the next mount replays the journal
            }
            store = Store::open(&path, &config).unwrap();
            assert_matches_model(&mut store, &model);
        }
    }
    assert_matches_model(&mut store, &model);
    store.close().unwrap();
    let report = fsck(&path, &config, true);
    assert!(report.clean, "fsck: {report:#?}");
    let mut store = Store::open(&path, &config).unwrap();
    assert_matches_model(&mut store, &model);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model_io_uring(seed in any::<u64>()) {
        run(seed, 60, IoBackend::Auto);
    }

    #[test]
    fn store_matches_model_pread(seed in any::<u64>()) {
        run(seed, 60, IoBackend::Pread);
    }
}

#[test]
fn long_sequence_matches_model() {
    run(0xD0D1E5, 400, IoBackend::Auto);
}

/// Found by CI's random cases in session 34 (the pread backend). A batch
/// deleted obj-3, cloned it from obj-0, wrote obj-0 (copying the shared
/// block), then wrote obj-3 past its end: growing it zeroed the tail of
/// its last block in place, though its blocks came from a clone this
/// batch (the write path copies those), and the write then copied the
/// block it had just changed in place.
#[test]
fn regression_seed_10656689786654224125() {
    run(10656689786654224125, 60, IoBackend::Pread);
}
