//! The store: `mkfs`, `open`, and the hand-off of partitions to their threads.

use std::path::Path;

use crate::chunks::ChunkPool;
use crate::device::{create_file, AlignedBuf, Device, DeviceConfig};
use crate::error::{Result, StoreError};
use crate::layout::{MkfsOptions, PartitionHeader, Superblock};
use crate::partition::mount::MountParams;
use crate::partition::{Partition, PartitionConfig};
use crate::BLOCK_SIZE;

/// How a store is opened.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub device: DeviceConfig,
    /// Metadata page cache per partition (crc table and onode pages).
    pub metadata_cache_bytes: u64,
    /// Dirty metadata per partition that triggers a checkpoint.
    pub max_dirty_bytes: u64,
    pub read_only: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            device: DeviceConfig::default(),
            metadata_cache_bytes: 64 << 20,
            max_dirty_bytes: 32 << 20,
            read_only: false,
        }
    }
}

/// Formats `path` (a block device, or a regular file created or sized by
/// `options.size_bytes`). Everything on it is lost.
pub fn mkfs(path: &Path, options: &MkfsOptions, config: &StoreConfig) -> Result<Superblock> {
    if let Some(size) = options.size_bytes {
        create_file(path, size)?;
        if let Some(mirror) = &config.device.mirror {
            create_file(&mirror.second, size)?;
        }
    }
    let device = Device::create(path, &config.device)?;
    let mut fsid = [0u8; 16];
    fill_random(&mut fsid)?;
    let superblock = Superblock::plan(device.size_bytes(), device.sector_size(), options, fsid)?;
    assert!(superblock.device_blocks * BLOCK_SIZE as u64 <= device.size_bytes(), "the plan outgrows the device");
    let mut io = device.queue()?;
    let device_blocks = superblock.device_blocks;
    let zero_area = |io: &mut dyn crate::device::BlockIo, start: u64, blocks: u64| -> Result<()> {
        assert!(start + blocks <= device_blocks, "zeroing blocks {start}+{blocks} past the device's {device_blocks}");
        let chunk_blocks = 256u64;
        let zeros = AlignedBuf::zeroed(chunk_blocks as usize * BLOCK_SIZE);
        let mut block = start;
        while block < start + blocks {
            let n = chunk_blocks.min(start + blocks - block);
            io.write_many(&[(block * BLOCK_SIZE as u64, &zeros[..n as usize * BLOCK_SIZE])])
                .map_err(|e| StoreError::io("zeroing metadata", e))?;
            block += n;
        }
        Ok(())
    };
    // Invalidate an older superblock first: a half-made store must not mount.
    zero_area(io.as_mut(), 0, 1)?;
    io.flush().map_err(|e| StoreError::io("flushing", e))?;
    for (index, g) in superblock.partitions.iter().enumerate() {
        // Bitmaps must start clear and the journal must hold no record. The
        // whole journal is written (not only its first block) so that, on a
        // sparse file, record writes land on allocated blocks: ext4 can then
        // complete them inline instead of allocating (and punting the write
        // to an io_uring worker) on every record.
        zero_area(io.as_mut(), g.headers.start, 2)?;
        zero_area(io.as_mut(), g.journal.start, g.journal.blocks)?;
        zero_area(io.as_mut(), g.slot_bitmap.start, g.slot_bitmap.blocks + g.claims.blocks)?;
        let header = PartitionHeader { fsid, partition: index as u32, header_seq: 1, journal_start_seq: 1 };
        let buf = AlignedBuf::from_slice(&crate::partition::commit::pad_to_block(&header.encode()));
        io.write_many(&[((g.headers.start + 1) * BLOCK_SIZE as u64, &buf[..])])
            .map_err(|e| StoreError::io("writing a partition header", e))?;
    }
    // Every chunk starts free: its allocation and written pages clear.
    let region = superblock.data;
    let zeros = AlignedBuf::zeroed(BLOCK_SIZE);
    let pages: Vec<u64> =
        (0..region.chunks as u32).flat_map(|c| [region.bitmap_page(c, 0), region.bitmap_page(c, 1)]).collect();
    for batch in pages.chunks(256) {
        let requests: Vec<(u64, &[u8])> = batch.iter().map(|page| (page * BLOCK_SIZE as u64, &zeros[..])).collect();
        io.write_many(&requests).map_err(|e| StoreError::io("zeroing the chunks' bitmaps", e))?;
    }
    io.flush().map_err(|e| StoreError::io("flushing", e))?;
    let buf = AlignedBuf::from_slice(&superblock.encode());
    io.write_many(&[(0, &buf[..])]).map_err(|e| StoreError::io("writing the superblock", e))?;
    io.flush().map_err(|e| StoreError::io("flushing", e))?;
    Ok(superblock)
}

pub(crate) fn fill_random(bytes: &mut [u8]) -> Result<()> {
    // SAFETY: getrandom writes at most len bytes into the buffer.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(StoreError::io("reading random bytes for the fsid", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// A mounted store: the superblock and one [`Partition`] per partition.
pub struct Store {
    device: Device,
    superblock: Superblock,
    partitions: Vec<Partition>,
}

impl Store {
    /// Mounts the store on `path`: validates the superblock, and for each
    /// partition replays its journal and rebuilds its index.
    pub fn open(path: &Path, config: &StoreConfig) -> Result<Store> {
        let device = Device::open(path, &config.device, !config.read_only)?;
        let mut first = AlignedBuf::zeroed(BLOCK_SIZE);
        let mut io = device.queue()?;
        io.read_many(&mut [(0, &mut first[..])]).map_err(|e| StoreError::io("reading the superblock", e))?;
        let superblock = Superblock::decode(&first)?;
        if superblock.device_blocks * BLOCK_SIZE as u64 > device.size_bytes() {
            return Err(StoreError::corrupt(format!(
                "the store spans {} bytes but {} has only {}",
                superblock.device_blocks * BLOCK_SIZE as u64,
                path.display(),
                device.size_bytes()
            )));
        }
        if superblock.sector_size < device.sector_size() {
            return Err(StoreError::invalid(format!(
                "the store was made with {}-byte sectors but this device needs {}-byte direct I/O",
                superblock.sector_size,
                device.sector_size()
            )));
        }
        let partition_config = PartitionConfig {
            cache_pages: (config.metadata_cache_bytes / BLOCK_SIZE as u64) as usize,
            max_dirty_pages: (config.max_dirty_bytes / BLOCK_SIZE as u64).max(64) as usize,
            read_only: config.read_only,
        };
        let partition_count = superblock.partitions.len() as u32;
        let pool = std::sync::Arc::new(ChunkPool::new(superblock.data));
        let partitions = superblock
            .partitions
            .iter()
            .enumerate()
            .map(|(index, geometry)| {
                let params = MountParams {
                    index: index as u32,
                    partition_count,
                    fsid: superblock.fsid,
                    geometry: *geometry,
                    region: superblock.data,
                    pool: pool.clone(),
                    sector: superblock.sector_size,
                    config: partition_config,
                };
                Partition::mount(device.queue()?, params)
            })
            .collect::<Result<Vec<_>>>()?;
        // Superblock::decode refuses a store without partitions; partition_of divides by their count.
        assert!(!partitions.is_empty());
        let mut owned = std::collections::BTreeSet::new();
        for partition in &partitions {
            for &chunk in partition.alloc.owned_chunks() {
                if !owned.insert(chunk) {
                    return Err(StoreError::corrupt(format!(
                        "data chunk {chunk} is claimed by two partitions (one of them partition {})",
                        partition.index()
                    )));
                }
            }
        }
        pool.fill(&owned);
        Ok(Store { device, superblock, partitions })
    }

    pub fn superblock(&self) -> &Superblock {
        &self.superblock
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The partition that owns `key`: its group modulo the partition count.
    pub fn partition_of(&self, key: &[u8]) -> usize {
        (crate::key::group_of(key) % self.partitions.len() as u32) as usize
    }

    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    pub fn partition_mut(&mut self, index: usize) -> &mut Partition {
        &mut self.partitions[index]
    }

    /// The partition that owns `key`.
    pub fn partition_for(&mut self, key: &[u8]) -> &mut Partition {
        let index = self.partition_of(key);
        &mut self.partitions[index]
    }

    /// Hands out the partitions, one per thread; close each with [`Partition::close`].
    pub fn into_partitions(self) -> Vec<Partition> {
        self.partitions
    }

    /// Checkpoints every partition: the next mount replays nothing.
    pub fn close(self) -> Result<()> {
        for partition in self.partitions {
            partition.close()?;
        }
        match self.device.mirror() {
            Some(mirror) => mirror.close(),
            None => Ok(()),
        }
    }
}
