//! The data directory replays exactly what was persisted: batches in order
//! with a new leader's overwrites applied, a torn tail dropped, and the hard
//! state replaced atomically.

use std::io::Write;

use duplex_mon::datadir::DataDir;
use raft::eraftpb::{Entry, HardState};

fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
    Entry { index, term, data: data.to_vec().into(), ..Default::default() }
}

#[test]
fn batches_replay_with_overwrites_and_a_torn_tail_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut data, log, hs) = DataDir::open(dir.path()).unwrap();
        assert!(log.is_empty() && hs.is_none());
        data.append(&[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")]).unwrap();
        // A new leader in term 2 overwrites index 3 onwards.
        data.append(&[entry(3, 2, b"C"), entry(4, 2, b"D")]).unwrap();
        let hs = HardState { term: 2, vote: 3, commit: 4, ..Default::default() };
        data.save_hard_state(&hs).unwrap();
    }
    // A crash in the middle of the next append leaves a torn record.
    let mut log = std::fs::OpenOptions::new().append(true).open(dir.path().join("log")).unwrap();
    log.write_all(&[200, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(log);

    let (mut data, log, hs) = DataDir::open(dir.path()).unwrap();
    let summary: Vec<(u64, u64, Vec<u8>)> = log.iter().map(|e| (e.index, e.term, e.data.to_vec())).collect();
    assert_eq!(
        summary,
        vec![(1, 1, b"a".to_vec()), (2, 1, b"b".to_vec()), (3, 2, b"C".to_vec()), (4, 2, b"D".to_vec())]
    );
    let hs = hs.unwrap();
    assert_eq!((hs.term, hs.vote, hs.commit), (2, 3, 4));
    // Appending after the torn tail was dropped still replays.
    data.append(&[entry(5, 2, b"E")]).unwrap();
    drop(data);
    let (_, log, _) = DataDir::open(dir.path()).unwrap();
    assert_eq!(log.last().map(|e| e.index), Some(5));
}

#[test]
fn a_corrupt_hard_state_is_refused_not_guessed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut data, _, _) = DataDir::open(dir.path()).unwrap();
        let hs = HardState { term: 7, ..Default::default() };
        data.save_hard_state(&hs).unwrap();
    }
    let path = dir.path().join("hard_state");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
    assert!(DataDir::open(dir.path()).is_err());
}
