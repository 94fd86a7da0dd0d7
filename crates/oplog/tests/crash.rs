//! `shm` mode survives a process crash: a child appends (and trims) on a
//! log mapped from /dev/shm and reports each append that returned; it is
//! killed with SIGKILL at random moments; reopening recovers every reported
//! entry that was not trimmed, intact and in order (the one in flight may
//! be there or not). Many rounds, continuing from what was recovered.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use duplex_oplog::{Entry, MmapRegion, OpKind, PgLog};
use rand::Rng;

const REGION: u64 = 64 << 10;

fn entry(seq: u64) -> Entry {
    let size = (seq * 7919 % 900) as usize;
    Entry {
        pg: 3,
        epoch: 1,
        version: seq,
        seq,
        op: OpKind::Write,
        object: b"o".to_vec(),
        offset: seq,
        data: vec![(seq % 251) as u8; size],
        request: Default::default(),
        snap: 0,
    }
}

#[test]
#[ignore = "run by shm_log_survives_sigkill as a child process"]
fn oplog_crash_child() {
    let Ok(path) = std::env::var("DUPLEX_OPLOG_CRASH_PATH") else { return };
    let (mut log, _) = PgLog::open(MmapRegion::open(path.as_ref(), REGION, false).unwrap(), 3).unwrap();
    let mut out = std::io::stdout().lock();
    loop {
        let seq = log.next_seq();
        if log.len() > 20 {
            // Keep the ring from filling: trim the oldest half, as a flush would.
            // Announce before trimming: if the kill lands between the trim and
            // the line, the parent must not expect the trimmed entries.
            writeln!(out, "trimming {}", seq - 10).unwrap();
            out.flush().unwrap();
            log.trim(seq - 10).unwrap();
        }
        log.append(&entry(seq)).unwrap();
        writeln!(out, "appended {seq}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn shm_log_survives_sigkill() {
    let dir = match tempfile::tempdir_in("/dev/shm") {
        Ok(dir) => dir,
        Err(_) => tempfile::tempdir().unwrap(),
    };
    let path: PathBuf = dir.path().join("pg3.log");
    let mut rng = rand::thread_rng();
    let started = Instant::now();
    let (mut rounds, mut checked) = (0, 0u64);
    while started.elapsed() < Duration::from_secs(8) && rounds < 200 {
        rounds += 1;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["oplog_crash_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("DUPLEX_OPLOG_CRASH_PATH", &path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader =
            std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_millis(rng.gen_range(1..40)));
        child.kill().unwrap();
        child.wait().unwrap();
        let (mut appended, mut trimmed) = (Vec::new(), 0u64);
        for line in reader.join().unwrap() {
            let tokens: Vec<&str> = line.split_whitespace().collect();
            match tokens.as_slice() {
                [.., "appended", seq] => appended.push(seq.parse::<u64>().unwrap()),
                [.., "trimming", seq] => trimmed = seq.parse().unwrap(),
                _ => {}
            }
        }
        let (_, recovered) = PgLog::open(MmapRegion::open(&path, REGION, false).unwrap(), 3).unwrap();
        for seq in appended.iter().filter(|s| **s > trimmed) {
            let found = recovered.iter().find(|e| e.seq == *seq);
            assert_eq!(found, Some(&entry(*seq)), "round {rounds}: acknowledged entry {seq} lost or damaged");
            checked += 1;
        }
        assert!(recovered.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "recovered entries are not consecutive");
        if let (Some(last), Some(max)) = (recovered.last(), appended.iter().max()) {
            assert!(last.seq <= max + 1, "an entry that was never appended appeared");
        }
    }
    eprintln!("oplog crash test: {rounds} kills, {checked} acknowledged entries checked");
    assert!(rounds >= 5 && checked > 0);
}
