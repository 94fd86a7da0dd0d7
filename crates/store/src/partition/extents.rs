//! An object's block map as the index keeps it.
//!
//! Most objects map one extent (written in order, or pre-allocated), kept
//! without a heap allocation. Copies on write scatter a snapshotted
//! object's blocks, one extent each: its map is then kept as a direct
//! table, so that a lookup is one memory access, not a binary search whose
//! every step misses the cache (a profile of overwrites after a snapshot
//! showed the search's loads as the planner's largest cost), in a third of
//! the memory.

use crate::onode::Extent;

/// A map with more extents than this is a table, if the table is no larger.
const TABLE_AFTER: usize = 16;
/// A table's entry for a logical block that maps no data block.
const HOLE: u32 = u32::MAX;

#[derive(Clone, Debug)]
pub(crate) enum Extents {
    Empty,
    One(Extent),
    Many(Box<[Extent]>),
    /// Logical block → data block, [`HOLE`] for none; as long as the last
    /// mapped logical block + 1.
    Table(Box<[u32]>),
}

impl Extents {
    /// `extents`: sorted by logical block, non-overlapping, none empty.
    pub fn from_vec(extents: &[Extent]) -> Extents {
        match extents {
            [] => Extents::Empty,
            [one] => Extents::One(*one),
            many => {
                let end = many.last().expect("many").logical_end() as usize;
                // A table entry costs 4 bytes, an extent 12.
                if many.len() <= TABLE_AFTER || end > 3 * many.len() {
                    return Extents::Many(many.into());
                }
                let mut table = vec![HOLE; end].into_boxed_slice();
                for extent in many {
                    // Its last block is below HOLE.
                    debug_assert!(extent.physical.checked_add(extent.len).is_some());
                    for offset in 0..extent.len {
                        table[(extent.logical + offset) as usize] = extent.physical + offset;
                    }
                }
                Extents::Table(table)
            }
        }
    }

    /// The data block holding logical block `logical`, if allocated.
    pub fn physical_for(&self, logical: u32) -> Option<u32> {
        match self {
            Extents::Empty => None,
            Extents::One(one) => one.physical_for(logical),
            Extents::Many(many) => {
                let index = many.partition_point(|e| e.logical_end() <= logical);
                many.get(index).and_then(|e| e.physical_for(logical))
            }
            Extents::Table(table) => table.get(logical as usize).copied().filter(|&block| block != HOLE),
        }
    }

    /// The map as extents, sorted by logical block, neighbours merged.
    pub fn to_vec(&self) -> Vec<Extent> {
        match self {
            Extents::Empty => Vec::new(),
            Extents::One(one) => vec![*one],
            Extents::Many(many) => many.to_vec(),
            Extents::Table(table) => {
                let mut extents: Vec<Extent> = Vec::new();
                for (logical, &physical) in table.iter().enumerate() {
                    if physical == HOLE {
                        continue;
                    }
                    match extents.last_mut() {
                        Some(last)
                            if last.logical_end() as usize == logical && last.physical + last.len == physical =>
                        {
                            last.len += 1
                        }
                        _ => extents.push(Extent { logical: logical as u32, physical, len: 1 }),
                    }
                }
                extents
            }
        }
    }

    /// How many blocks the map maps.
    pub fn mapped_blocks(&self) -> u64 {
        match self {
            Extents::Empty => 0,
            Extents::One(one) => u64::from(one.len),
            Extents::Many(many) => many.iter().map(|e| u64::from(e.len)).sum(),
            Extents::Table(table) => table.iter().filter(|&&block| block != HOLE).count() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Sorted, non-overlapping extents with merged neighbours (as
    /// `ObjectMeta::map_block` keeps them), from (gap, physical, len) triples.
    fn extents_from(pieces: &[(u32, u32, u32)]) -> Vec<Extent> {
        let mut extents: Vec<Extent> = Vec::new();
        let mut logical = 0;
        for &(gap, physical, len) in pieces {
            logical += gap;
            match extents.last_mut() {
                Some(last) if last.logical_end() == logical && last.physical + last.len == physical => last.len += len,
                _ => extents.push(Extent { logical, physical, len }),
            }
            logical += len;
        }
        extents
    }

    proptest! {
        #[test]
        fn every_form_maps_what_its_extents_map(
            pieces in prop::collection::vec((0u32..4, 0u32..100_000, 1u32..4), 0..300),
        ) {
            let extents = extents_from(&pieces);
            let map = Extents::from_vec(&extents);
            prop_assert_eq!(map.to_vec(), extents.clone());
            prop_assert_eq!(map.mapped_blocks(), extents.iter().map(|e| u64::from(e.len)).sum::<u64>());
            let end = extents.last().map_or(0, |e| e.logical_end()) + 3;
            for logical in 0..end {
                let expected = extents.iter().find_map(|e| e.physical_for(logical));
                prop_assert_eq!(map.physical_for(logical), expected, "logical block {}", logical);
            }
        }
    }

    #[test]
    fn a_scattered_map_is_a_table_and_a_sparse_one_is_not() {
        let scattered: Vec<Extent> =
            (0..1024).map(|logical| Extent { logical, physical: 5000 + (logical * 7919) % 4096 * 2, len: 1 }).collect();
        assert!(matches!(Extents::from_vec(&scattered), Extents::Table(_)));
        let sparse: Vec<Extent> =
            (0..100).map(|index| Extent { logical: index * 10, physical: index * 2, len: 1 }).collect();
        assert!(matches!(Extents::from_vec(&sparse), Extents::Many(_)));
    }
}
