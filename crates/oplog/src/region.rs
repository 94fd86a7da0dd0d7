//! Where a PG's log lives. A region is a fixed-size byte array; what
//! "written" means for durability depends on the kind (see the crate docs).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

pub trait Region: Send {
    fn len(&self) -> u64;
    fn read(&self, offset: u64, len: usize) -> &[u8];
    /// Writes `bytes`; when it returns, they survive what the region kind survives.
    fn write(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()>;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sizes a new (empty) log file; refuses one of another size, which would
/// cut live entries off (or leave them out of reach) if resized.
fn size_new_file(file: &File, path: &Path, len: u64) -> io::Result<()> {
    match file.metadata()?.len() {
        0 => file.set_len(len),
        current if current == len => Ok(()),
        current => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is a {current}-byte log but {len} bytes are configured; flush it with the old size first",
                path.display()
            ),
        )),
    }
}

/// A mapped file: `shm` (tmpfs: survives a process crash) or `pmem` (with
/// `persist`, each write is flushed to the medium before returning).
pub struct MmapRegion {
    map: memmap2::MmapMut,
    persist: bool,
}

impl MmapRegion {
    /// Opens or creates `path` with `len` bytes.
    pub fn open(path: &Path, len: u64, persist: bool) -> io::Result<MmapRegion> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        size_new_file(&file, path, len)?;
        // SAFETY: the file is this log's own; no other process maps it while
        // this OSD holds its device lock.
        let map = unsafe { memmap2::MmapOptions::new().len(len as usize).map_mut(&file)? };
        Ok(MmapRegion { map, persist })
    }
}

impl Region for MmapRegion {
    fn len(&self) -> u64 {
        self.map.len() as u64
    }

    fn read(&self, offset: u64, len: usize) -> &[u8] {
        &self.map[offset as usize..offset as usize + len]
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let at = offset as usize;
        self.map[at..at + bytes.len()].copy_from_slice(bytes);
        if self.persist {
            self.map.flush_range(at, bytes.len())?;
        }
        Ok(())
    }
}

/// A file on a disk written with O_DSYNC (durable on return), mirrored in
/// memory for reads: for machines without persistent memory.
pub struct FileRegion {
    file: File,
    mirror: Vec<u8>,
}

impl FileRegion {
    pub fn open(path: &Path, len: u64) -> io::Result<FileRegion> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_DSYNC)
            .open(path)?;
        size_new_file(&file, path, len)?;
        let mut mirror = vec![0u8; len as usize];
        file.read_exact_at(&mut mirror, 0)?;
        Ok(FileRegion { file, mirror })
    }
}

impl Region for FileRegion {
    fn len(&self) -> u64 {
        self.mirror.len() as u64
    }

    fn read(&self, offset: u64, len: usize) -> &[u8] {
        &self.mirror[offset as usize..offset as usize + len]
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        // Checked before the file is written: past the end, it would grow.
        debug_assert!(
            offset + bytes.len() as u64 <= self.len(),
            "write of {} at {offset} past the region",
            bytes.len()
        );
        self.file.write_all_at(bytes, offset)?;
        self.mirror[offset as usize..offset as usize + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }
}

/// Lets one log type hold whichever region kind the OSD was configured with.
impl<R: Region + ?Sized> Region for Box<R> {
    fn len(&self) -> u64 {
        (**self).len()
    }

    fn read(&self, offset: u64, len: usize) -> &[u8] {
        (**self).read(offset, len)
    }

    fn write(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        (**self).write(offset, bytes)
    }
}
