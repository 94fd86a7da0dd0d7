//! The monitor's data directory: the Raft log and hard state, durable
//! before any message that depends on them is sent.
//!
//! `log`: appended records, one per batch of entries raft hands out:
//! `length u32 | crc32c u32 | protobuf entries (length-prefixed each)`.
//! A torn last record (crash mid-append) fails its crc and ends the replay.
//! Batches replay through [`crate::append_to_log`], which applies the
//! overwrites a new leader makes.
//! `hard_state`: replaced atomically (write a temporary file, fsync, rename).

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::eraftpb::{Entry, HardState};

pub struct DataDir {
    dir: PathBuf,
    log: File,
}

#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("monitor data directory {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("monitor data directory {0}: corrupt hard state")]
    CorruptHardState(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DataDirError + '_ {
    move |source| DataDirError::Io { path: path.display().to_string(), source }
}

impl DataDir {
    /// Opens (creating) `dir`; returns it with the persisted log and hard state.
    pub fn open(dir: &Path) -> Result<(DataDir, Vec<Entry>, Option<HardState>), DataDirError> {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let log_path = dir.join("log");
        let mut bytes = Vec::new();
        if log_path.exists() {
            File::open(&log_path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io(&log_path))?;
        }
        let mut entries = Vec::new();
        let mut valid = 0usize;
        let mut at = 0usize;
        while at + 8 <= bytes.len() {
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
            let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().expect("4 bytes"));
            let Some(body) = bytes.get(at + 8..at + 8 + len) else { break };
            if crc32c::crc32c(body) != crc {
                break;
            }
            let Some(batch) = decode_batch(body) else { break };
            crate::append_to_log(&mut entries, &batch);
            at += 8 + len;
            valid = at;
        }
        let log = OpenOptions::new().create(true).append(true).open(&log_path).map_err(io(&log_path))?;
        // Drop a torn tail so that new records follow the last good one.
        log.set_len(valid as u64).map_err(io(&log_path))?;
        let hs_path = dir.join("hard_state");
        let hard_state = if hs_path.exists() {
            let mut bytes = Vec::new();
            File::open(&hs_path).and_then(|mut f| f.read_to_end(&mut bytes)).map_err(io(&hs_path))?;
            let bad = || DataDirError::CorruptHardState(dir.display().to_string());
            let (body, crc) = bytes.split_at_checked(bytes.len().saturating_sub(4)).ok_or_else(bad)?;
            if crc.len() != 4 || crc32c::crc32c(body).to_le_bytes() != crc {
                return Err(bad());
            }
            Some(HardState::parse_from_bytes(body).map_err(|_| bad())?)
        } else {
            None
        };
        Ok((DataDir { dir: dir.to_path_buf(), log }, entries, hard_state))
    }

    /// Appends a batch of entries and fsyncs.
    pub fn append(&mut self, batch: &[Entry]) -> Result<(), DataDirError> {
        if batch.is_empty() {
            return Ok(());
        }
        let mut body = Vec::new();
        for entry in batch {
            let bytes = entry.write_to_bytes().expect("encoding an entry");
            body.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            body.extend_from_slice(&bytes);
        }
        let mut record = Vec::with_capacity(body.len() + 8);
        record.extend_from_slice(&(body.len() as u32).to_le_bytes());
        record.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        record.extend_from_slice(&body);
        let path = self.dir.join("log");
        self.log.write_all(&record).and_then(|()| self.log.sync_data()).map_err(io(&path))
    }

    /// Replaces the hard state durably.
    pub fn save_hard_state(&mut self, hs: &HardState) -> Result<(), DataDirError> {
        let mut bytes = hs.write_to_bytes().expect("encoding the hard state");
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let tmp = self.dir.join("hard_state.tmp");
        let path = self.dir.join("hard_state");
        let mut file = File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io(&self.dir))
    }
}

fn decode_batch(mut body: &[u8]) -> Option<Vec<Entry>> {
    let mut batch = Vec::new();
    while !body.is_empty() {
        let len = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
        let bytes = body.get(4..4 + len)?;
        batch.push(Entry::parse_from_bytes(bytes).ok()?);
        body = &body[4 + len..];
    }
    Some(batch)
}
