//! The deduplication tier's pool settings (docs/DEDUP.md): a **base pool**
//! names its **chunk pool** and how its objects are cut into chunks; a
//! chunk pool holds content-addressed chunk objects only, and says how
//! they are compressed. Both are set by [`crate::Command::PoolSet`], one
//! `key=value` at a time, checked here so that the CLI can refuse a bad
//! value before it changes anything.

use serde::{Deserialize, Serialize};

use crate::{CommandError, Pool, PoolId};

/// A base pool's tier: where its chunks go, and how the engine cuts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DedupTier {
    pub chunk_pool: PoolId,
    /// Chunks of this many bytes (a power of two, 16–128 KiB), or of this
    /// many on average ([`Chunking::Content`]). Fixed once set, as is
    /// `chunking`: the chunk maps already written follow them.
    pub chunk_size: u32,
    /// Where chunks begin: on a grid, or where the content says.
    pub chunking: Chunking,
    /// Foreground operations a second on an OSD below which the engine
    /// runs free (§4.4.2's low watermark).
    pub low_watermark: u32,
    /// Above this the engine issues one chunk I/O per 500 foreground I/Os
    /// (between the two, one per 100).
    pub high_watermark: u32,
    /// The operator's override of the rate control (`duplex dedup run|pause|auto`).
    pub mode: DedupMode,
}

/// How the engine cuts an object into chunks (docs/DEDUP.md, "Chunking").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Chunking {
    /// Every `chunk_size` bytes from the object's start.
    #[default]
    Fixed,
    /// On 4 KiB block boundaries chosen by the blocks' contents, so that
    /// bytes shifted by whole blocks still meet their twins
    /// (`duplex_dedup::cut`): `chunk_size` on average, from half of it to
    /// one and a half.
    Content,
}

impl Chunking {
    pub fn parse(text: &str) -> Result<Chunking, String> {
        match text {
            "fixed" => Ok(Chunking::Fixed),
            "content" => Ok(Chunking::Content),
            _ => Err(format!("chunking is fixed or content, not '{text}'")),
        }
    }
}

impl std::fmt::Display for Chunking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Chunking::Fixed => "fixed",
            Chunking::Content => "content",
        })
    }
}

/// Whether the engine runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DedupMode {
    /// As the watermarks allow.
    #[default]
    Auto,
    /// Unthrottled, whatever the foreground load.
    Run,
    /// No passes (promotions still run: writers wait on them).
    Pause,
}

impl DedupMode {
    pub fn parse(text: &str) -> Result<DedupMode, String> {
        match text {
            "auto" => Ok(DedupMode::Auto),
            "run" => Ok(DedupMode::Run),
            "pause" => Ok(DedupMode::Pause),
            _ => Err(format!("dedup_mode is auto, run or pause, not '{text}'")),
        }
    }
}

impl std::fmt::Display for DedupMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DedupMode::Auto => "auto",
            DedupMode::Run => "run",
            DedupMode::Pause => "pause",
        })
    }
}

impl DedupTier {
    pub const MIN_CHUNK_SIZE: u32 = 16 << 10;
    pub const MAX_CHUNK_SIZE: u32 = 128 << 10;
    pub const DEFAULT_CHUNK_SIZE: u32 = 32 << 10;
    pub const DEFAULT_LOW_WATERMARK: u32 = 1_000;
    pub const DEFAULT_HIGH_WATERMARK: u32 = 10_000;

    pub fn new(chunk_pool: PoolId) -> DedupTier {
        DedupTier {
            chunk_pool,
            chunk_size: Self::DEFAULT_CHUNK_SIZE,
            chunking: Chunking::Fixed,
            low_watermark: Self::DEFAULT_LOW_WATERMARK,
            high_watermark: Self::DEFAULT_HIGH_WATERMARK,
            mode: DedupMode::Auto,
        }
    }

    /// The longest chunk the engine cuts (a chunk map entry starts at most
    /// this many bytes less one before any byte it holds).
    pub fn max_chunk_len(&self) -> u32 {
        match self.chunking {
            Chunking::Fixed => self.chunk_size,
            Chunking::Content => self.chunk_size / 2 * 3,
        }
    }
}

/// How a chunk pool stores its chunks' bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Compression {
    None,
    Lz4,
    /// zstd at this level (1–19).
    Zstd(u8),
}

impl Compression {
    pub fn parse(text: &str) -> Result<Compression, String> {
        match text {
            "none" | "off" => Ok(Compression::None),
            "lz4" => Ok(Compression::Lz4),
            "zstd" => Ok(Compression::Zstd(3)),
            _ => match text.strip_prefix("zstd:").map(str::parse::<u8>) {
                Some(Ok(level)) if (1..=19).contains(&level) => Ok(Compression::Zstd(level)),
                _ => Err(format!("compression is none, lz4, zstd or zstd:LEVEL (1 to 19), not '{text}'")),
            },
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compression::None => f.write_str("none"),
            Compression::Lz4 => f.write_str("lz4"),
            Compression::Zstd(level) => write!(f, "zstd:{level}"),
        }
    }
}

/// A chunk pool's settings. A pool is a chunk pool from its creation on
/// ([`crate::Command::PoolCreateChunks`]): it takes chunk operations only,
/// so it never holds an object the tier's replay rules do not cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkStore {
    pub compression: Compression,
    /// A chunk is stored compressed only if that saves at least this many
    /// per mille of its bytes (else raw: decompressing it would cost reads
    /// for nothing).
    pub min_saving_permille: u16,
}

impl Default for ChunkStore {
    fn default() -> ChunkStore {
        ChunkStore { compression: Compression::Lz4, min_saving_permille: 125 }
    }
}

/// The keys [`crate::Command::PoolSet`] takes.
pub const POOL_SET_KEYS: &str = "dedup_low_watermark, dedup_high_watermark, dedup_mode (a deduplicated pool); compression, compression_min_saving (a chunk pool); max_lag (an eventual pool); qos_iops, qos_read_iops, qos_write_iops, qos_bps, qos_read_bps, qos_write_bps, qos_burst_s, qos_reservation_iops, qos_weight (its images' QoS unless an image sets its own)";

/// Pool `pool` given a tier in `chunk_pool`, cut into `chunk_size` chunks
/// by `chunking`. `Ok(None)`: it has that tier already. A tier is set
/// once: the chunk maps its engine writes name chunks of that pool, size
/// and layout.
pub fn set_tier(
    pool: &Pool,
    chunk_pool: &Pool,
    chunk_size: u32,
    chunking: Chunking,
) -> Result<Option<Pool>, CommandError> {
    let invalid = |why: String| Err(CommandError::Invalid(why));
    if chunk_pool.chunks.is_none() {
        return invalid(format!(
            "pool '{0}' is not a chunk pool (create one with `duplex pool create {0} --chunk-pool`)",
            chunk_pool.name
        ));
    }
    if pool.chunks.is_some() {
        return invalid(format!("pool '{}' is a chunk pool; it cannot have a tier itself", pool.name));
    }
    if pool.is_erasure() {
        return invalid(format!(
            "pool '{}' is erasure-coded; a deduplicated pool is replicated (its chunk maps are omaps)",
            pool.name
        ));
    }
    if pool.is_eventual() || chunk_pool.is_eventual() {
        return invalid(format!(
            "pool '{}' is eventually consistent; a tier's chunk references must not be lost with a primary",
            if pool.is_eventual() { &pool.name } else { &chunk_pool.name }
        ));
    }
    if !chunk_size.is_power_of_two() || !(DedupTier::MIN_CHUNK_SIZE..=DedupTier::MAX_CHUNK_SIZE).contains(&chunk_size) {
        return invalid(format!("a chunk size is a power of two from 16 to 128 KiB (got {chunk_size} bytes)"));
    }
    match pool.dedup {
        Some(tier) if tier.chunk_pool == chunk_pool.id && tier.chunk_size == chunk_size && tier.chunking == chunking => {
            Ok(None)
        }
        Some(_) => invalid(format!(
            "pool '{}' already has a tier; its chunk maps name chunks of that pool, size and chunking, so it cannot change",
            pool.name
        )),
        None => {
            let tier = DedupTier { chunk_size, chunking, ..DedupTier::new(chunk_pool.id) };
            Ok(Some(Pool { dedup: Some(tier), ..pool.clone() }))
        }
    }
}

/// Pool `pool` with `key` set to `value`, in `map`. `Ok(None)`: it
/// already is.
pub fn pool_set(pool: &Pool, key: &str, value: &str) -> Result<Option<Pool>, CommandError> {
    let invalid = |why: String| CommandError::Invalid(why);
    let mut new = pool.clone();
    match key {
        "dedup_tier" | "chunk_size" | "chunking" => {
            return Err(invalid(format!(
                "{key} is set once, with the tier (`duplex pool create {} --dedup-tier CHUNK_POOL --chunk-size SIZE --chunking fixed|content`): the chunk maps written follow it",
                pool.name
            )))
        }
        "dedup_mode" => {
            let Some(tier) = new.dedup.as_mut() else {
                return Err(invalid(format!("pool '{}' has no tier", pool.name)));
            };
            tier.mode = DedupMode::parse(value).map_err(invalid)?;
        }
        "dedup_low_watermark" | "dedup_high_watermark" => {
            let Some(tier) = new.dedup.as_mut() else {
                return Err(invalid(format!("pool '{}' has no tier: set dedup_tier first", pool.name)));
            };
            let value: u32 = value
                .parse()
                .map_err(|_| invalid(format!("{key} is a count of operations a second, not '{value}'")))?;
            match key {
                "dedup_low_watermark" => tier.low_watermark = value,
                _ => tier.high_watermark = value,
            }
            if tier.low_watermark > tier.high_watermark {
                return Err(invalid(format!(
                    "the low watermark ({}) is above the high one ({})",
                    tier.low_watermark, tier.high_watermark
                )));
            }
        }
        "compression" | "compression_min_saving" => {
            let Some(store) = new.chunks.as_mut() else {
                return Err(invalid(format!("pool '{}' is not a chunk pool: {key} is a chunk pool's", pool.name)));
            };
            if key == "compression" {
                store.compression = Compression::parse(value).map_err(invalid)?;
            } else {
                let percent = value.trim_end_matches('%');
                match percent.parse::<u16>() {
                    Ok(p) if p <= 100 => store.min_saving_permille = p * 10,
                    _ => return Err(invalid(format!("compression_min_saving is a percentage 0-100, not '{value}'"))),
                }
            }
        }
        "max_lag" => new = crate::eventual::set_max_lag(pool, value)?,
        key if key.starts_with("qos_") => {
            let mut settings = pool.default_settings();
            settings.set(key, value).map_err(|err| invalid(err.to_string()))?;
            settings.check().map_err(|err| invalid(err.to_string()))?;
            new.qos = settings.settings().into_iter().map(|(key, value)| (key.to_string(), value)).collect();
        }
        _ => return Err(invalid(format!("no pool setting '{key}' (there are: {POOL_SET_KEYS})"))),
    }
    Ok((new != *pool).then_some(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ClusterMap, Command};

    fn map() -> ClusterMap {
        let mut map = ClusterMap::new([0; 16]);
        for id in 0..3 {
            let boot = Command::OsdBoot {
                id,
                addr: format!("127.0.0.1:{}", 7000 + id),
                host: format!("h{id}"),
                weight: 1 << 16,
            };
            map.run(&boot).unwrap();
        }
        map.run(&Command::PoolCreate { name: "vms".into(), size: 2, min_size: 1, pg_num: 8 }).unwrap();
        let chunks = Command::PoolCreateChunks {
            name: "chunks".into(),
            size: 2,
            min_size: 1,
            pg_num: 8,
            store: ChunkStore::default(),
        };
        map.run(&chunks).unwrap();
        map
    }

    fn set(map: &mut ClusterMap, name: &str, key: &str, value: &str) -> Result<(), CommandError> {
        map.run(&Command::PoolSet { name: name.into(), key: key.into(), value: value.into() }).map(|_| ())
    }

    #[test]
    fn a_pools_default_image_limits_are_checked_and_kept_in_order() {
        let mut map = map();
        set(&mut map, "vms", "qos_iops", "2000").unwrap();
        set(&mut map, "vms", "qos_write_bps", "100M").unwrap();
        let pool = map.pool_by_name("vms").unwrap();
        assert_eq!(pool.qos, vec![("qos_iops".into(), "2000".into()), ("qos_write_bps".into(), "104857600".into())]);
        assert_eq!((pool.default_limits().iops, pool.default_limits().write_bps), (2000, 100 << 20));
        let epoch = map.epoch;
        assert_eq!(
            map.run(&Command::PoolSet { name: "vms".into(), key: "qos_iops".into(), value: "2000".into() }),
            Ok(None),
            "the same limit: no new epoch"
        );
        assert_eq!(map.epoch, epoch);
        for (key, bad) in [("qos_iops", "-1"), ("qos_iosp", "5"), ("qos_burst_s", "0")] {
            let err = set(&mut map, "vms", key, bad).unwrap_err();
            assert!(err.to_string().contains("qos_"), "{key}={bad}: {err}");
        }
        set(&mut map, "vms", "qos_iops", "0").unwrap();
        assert_eq!(map.pool_by_name("vms").unwrap().qos.len(), 1, "0 removes a default");
        assert_eq!(crate::codec::decode_map(&crate::codec::encode_map(&map)).unwrap(), map);
    }

    #[test]
    fn an_images_qos_settings_are_checked_kept_canonical_and_go_with_their_pool() {
        let mut map = map();
        let pool = map.pool_by_name("vms").unwrap().id;
        let image_set = |map: &mut ClusterMap, pairs: &[(&str, &str)]| {
            let settings = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            map.run(&Command::ImageQosSet { pool, image: 0xabc, settings })
        };
        image_set(&mut map, &[("qos_reservation_iops", "500"), ("qos_weight", "2"), ("qos_bps", "1M")]).unwrap();
        let kept = &map.image_qos[&(pool, 0xabc)];
        assert_eq!(kept.len(), 3);
        assert!(kept.contains(&("qos_bps".to_string(), "1048576".to_string())), "{kept:?}");
        let epoch = map.epoch;
        assert_eq!(
            image_set(&mut map, &[("qos_bps", "1024K"), ("qos_weight", "2.0"), ("qos_reservation_iops", "500")]),
            Ok(None)
        );
        assert_eq!(map.epoch, epoch, "the same settings in other words: no new epoch");
        for bad in [("qos_weight", "0"), ("qos_reservation_iops", "x"), ("qos_nope", "1")] {
            let err = image_set(&mut map, &[bad]).unwrap_err();
            assert!(err.to_string().contains(bad.0), "{bad:?}: {err}");
        }
        let err = map.run(&Command::ImageQosSet { pool: 99, image: 1, settings: vec![] }).unwrap_err();
        assert!(err.to_string().contains("99"), "{err}");
        assert_eq!(crate::codec::decode_map(&crate::codec::encode_map(&map)).unwrap(), map);
        // A hostile map with unchecked settings is refused when decoded.
        let mut hostile = map.clone();
        hostile.image_qos.insert((pool, 1), vec![("qos_weight".into(), "-3".into())]);
        assert!(crate::codec::decode_map(&crate::codec::encode_map(&hostile)).is_err());
        image_set(&mut map, &[("qos_weight", "1")]).unwrap();
        assert!(map.image_qos.is_empty(), "default settings remove the entry");
        image_set(&mut map, &[("qos_weight", "3")]).unwrap();
        map.run(&Command::PoolDelete { name: "vms".into() }).unwrap();
        assert!(map.image_qos.is_empty(), "a removed pool's images' settings go with it");
    }

    #[test]
    fn a_tier_names_a_chunk_pool_once_with_a_valid_chunk_size() {
        let mut map = map();
        let tier = |chunk_pool: &str, chunk_size: u32| Command::PoolSetTier {
            name: "vms".into(),
            chunk_pool: chunk_pool.into(),
            chunk_size,
            chunking: Chunking::Fixed,
        };
        assert!(map.run(&tier("vms", 32 << 10)).is_err(), "a plain pool is no chunk pool");
        for bad in [8 << 10, 48 << 10, 256 << 10] {
            assert!(map.run(&tier("chunks", bad)).is_err(), "{bad}");
        }
        let epoch = map.epoch;
        map.run(&tier("chunks", 64 << 10)).unwrap();
        assert_eq!(map.epoch, epoch + 1);
        let chunk_pool = map.pool_by_name("chunks").unwrap().id;
        let vms = map.pool_by_name("vms").unwrap();
        assert_eq!(vms.dedup, Some(DedupTier { chunk_size: 64 << 10, ..DedupTier::new(chunk_pool) }));
        map.run(&tier("chunks", 64 << 10)).unwrap();
        assert_eq!(map.epoch, epoch + 1, "setting the same tier again changes nothing");
        let again = map.run(&tier("chunks", 32 << 10)).unwrap_err().to_string();
        assert!(again.contains("cannot change"), "{again}");
        let content = Command::PoolSetTier {
            name: "vms".into(),
            chunk_pool: "chunks".into(),
            chunk_size: 64 << 10,
            chunking: Chunking::Content,
        };
        assert!(map.run(&content).unwrap_err().to_string().contains("cannot change"), "chunking is set once");
        let fixed_tier = map.pool_by_name("vms").unwrap().dedup.unwrap();
        assert_eq!(fixed_tier.max_chunk_len(), 64 << 10);
        let content_tier = DedupTier { chunking: Chunking::Content, ..fixed_tier };
        assert_eq!(content_tier.max_chunk_len(), 96 << 10);
        for c in [Chunking::Fixed, Chunking::Content] {
            assert_eq!(Chunking::parse(&c.to_string()), Ok(c));
        }
        assert!(Chunking::parse("rabin").is_err());
        let nested = Command::PoolSetTier {
            name: "chunks".into(),
            chunk_pool: "chunks".into(),
            chunk_size: 32 << 10,
            chunking: Chunking::Fixed,
        };
        assert!(map.run(&nested).is_err(), "a chunk pool has no tier");
        let busy = map.run(&Command::PoolDelete { name: "chunks".into() }).unwrap_err().to_string();
        assert!(busy.contains("holds the chunks of pool 'vms'"), "{busy}");
        map.run(&Command::PoolDelete { name: "vms".into() }).unwrap();
        map.run(&Command::PoolDelete { name: "chunks".into() }).unwrap();
    }

    #[test]
    fn settings_are_checked_and_belong_to_their_pool_kind() {
        let mut map = map();
        assert!(set(&mut map, "vms", "dedup_low_watermark", "10").is_err(), "no tier yet");
        let tier = Command::PoolSetTier {
            name: "vms".into(),
            chunk_pool: "chunks".into(),
            chunk_size: 32 << 10,
            chunking: Chunking::Fixed,
        };
        map.run(&tier).unwrap();
        set(&mut map, "vms", "dedup_high_watermark", "5000").unwrap();
        set(&mut map, "vms", "dedup_low_watermark", "200").unwrap();
        let tier = map.pool_by_name("vms").unwrap().dedup.unwrap();
        assert_eq!((tier.low_watermark, tier.high_watermark), (200, 5000));
        assert!(set(&mut map, "vms", "dedup_low_watermark", "6000").is_err(), "above the high one");
        assert!(set(&mut map, "vms", "dedup_low_watermark", "lots").is_err());
        set(&mut map, "vms", "dedup_mode", "pause").unwrap();
        assert_eq!(map.pool_by_name("vms").unwrap().dedup.unwrap().mode, DedupMode::Pause);
        assert!(set(&mut map, "vms", "dedup_mode", "later").is_err());
        assert!(set(&mut map, "vms", "chunk_size", "64K").is_err(), "fixed with the tier");
        assert!(set(&mut map, "vms", "chunking", "content").is_err(), "fixed with the tier");
        assert!(set(&mut map, "vms", "compression", "lz4").is_err(), "a chunk pool's setting");
        assert!(set(&mut map, "vms", "colour", "blue").is_err());
        set(&mut map, "chunks", "compression", "zstd:7").unwrap();
        set(&mut map, "chunks", "compression_min_saving", "25%").unwrap();
        let store = map.pool_by_name("chunks").unwrap().chunks.unwrap();
        assert_eq!(store, ChunkStore { compression: Compression::Zstd(7), min_saving_permille: 250 });
        for bad in ["zstd:0", "zstd:20", "gzip", "zstd:"] {
            assert!(set(&mut map, "chunks", "compression", bad).is_err(), "{bad}");
        }
        assert!(set(&mut map, "chunks", "compression_min_saving", "101").is_err());
        assert!(set(&mut map, "chunks", "dedup_low_watermark", "1").is_err(), "a chunk pool has no tier");
        assert!(set(&mut map, "nope", "compression", "lz4").is_err());
    }

    #[test]
    fn compression_names_round_trip() {
        for c in [Compression::None, Compression::Lz4, Compression::Zstd(1), Compression::Zstd(19)] {
            assert_eq!(Compression::parse(&c.to_string()), Ok(c));
        }
    }
}
