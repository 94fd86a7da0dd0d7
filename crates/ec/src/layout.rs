//! Where an object's bytes are among its shards.
//!
//! Stripe `s` holds object bytes `[s * W, (s + 1) * W)`, `W = k * U` the
//! stripe width and `U` the stripe unit; data shard `i` holds the stripe's
//! `i`-th unit at shard offset `s * U`, and each coding shard the parity of
//! the stripe's units at the same offset. So every shard of an object is
//! `ceil(size / W) * U` bytes long, and a byte range of the object touches
//! the same shard offsets in every coding shard as the stripes it covers.

use crate::profile::Profile;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    k: u64,
    unit: u64,
}

/// Object bytes `[object_offset, object_offset + len)`, held by data shard
/// `shard` at `[shard_offset, shard_offset + len)`: never more than one
/// stripe unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub shard: usize,
    pub shard_offset: u64,
    pub object_offset: u64,
    pub len: u64,
}

impl Layout {
    pub fn new(profile: &Profile) -> Layout {
        Layout { k: profile.k() as u64, unit: profile.stripe_unit() as u64 }
    }

    fn width(&self) -> u64 {
        self.k * self.unit
    }

    /// The data shard holding object byte `offset`, and where in it.
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let (stripe, within) = (offset / self.width(), offset % self.width());
        ((within / self.unit) as usize, stripe * self.unit + within % self.unit)
    }

    /// The object byte that data shard `shard` holds at `shard_offset`.
    pub fn object_offset(&self, shard: usize, shard_offset: u64) -> u64 {
        debug_assert!((shard as u64) < self.k, "shard {shard} is not a data shard");
        let (stripe, within) = (shard_offset / self.unit, shard_offset % self.unit);
        stripe * self.width() + shard as u64 * self.unit + within
    }

    /// The pieces of object bytes `[offset, offset + len)`, in object order.
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<Piece> {
        let end = offset.saturating_add(len);
        let mut pieces = Vec::new();
        let mut at = offset;
        while at < end {
            let (shard, shard_offset) = self.locate(at);
            let unit_end = at - at % self.unit + self.unit;
            let piece_end = end.min(unit_end);
            pieces.push(Piece { shard, shard_offset, object_offset: at, len: piece_end - at });
            at = piece_end;
        }
        pieces
    }

    /// The shard bytes `[from, to)` of the stripes object bytes
    /// `[offset, offset + len)` touch: what of each coding shard they change.
    pub fn stripe_span(&self, offset: u64, len: u64) -> (u64, u64) {
        if len == 0 {
            return (0, 0);
        }
        let first = offset / self.width();
        let last = (offset + len - 1) / self.width();
        (first * self.unit, (last + 1) * self.unit)
    }

    /// Every shard's size for an object of `size` bytes: whole stripes.
    pub fn shard_size(&self, size: u64) -> u64 {
        size.div_ceil(self.width()) * self.unit
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn layout(k: u32, unit: u64) -> Layout {
        Layout::new(&Profile::new(k, 1, unit).unwrap())
    }

    #[test]
    fn a_2_plus_1_object_alternates_its_units_between_the_data_shards() {
        let layout = layout(2, 4096);
        assert_eq!(layout.locate(0), (0, 0));
        assert_eq!(layout.locate(4096), (1, 0));
        assert_eq!(layout.locate(8192 + 5), (0, 4096 + 5));
        assert_eq!(layout.shard_size(1), 4096);
        assert_eq!(layout.shard_size(4 << 20), 2 << 20);
        assert_eq!(
            layout.pieces(4000, 200),
            vec![
                Piece { shard: 0, shard_offset: 4000, object_offset: 4000, len: 96 },
                Piece { shard: 1, shard_offset: 0, object_offset: 4096, len: 104 },
            ]
        );
        assert_eq!(layout.stripe_span(4000, 200), (0, 4096));
        assert_eq!(layout.stripe_span(8191, 2), (0, 8192));
    }

    proptest! {
        /// Every byte of a range is in exactly one piece, where `locate`
        /// puts it, and `object_offset` takes it back.
        #[test]
        fn pieces_cover_a_range_once_and_round_trip(
            k in 2u32..8,
            unit_shift in 12u32..17,
            offset in 0u64..1 << 22,
            len in 0u64..1 << 18,
        ) {
            let unit = 1u64 << unit_shift;
            let layout = layout(k, unit);
            let pieces = layout.pieces(offset, len);
            prop_assert_eq!(pieces.iter().map(|p| p.len).sum::<u64>(), len);
            let mut next = offset;
            for piece in &pieces {
                prop_assert_eq!(piece.object_offset, next);
                prop_assert!(piece.len > 0 && piece.len <= unit);
                prop_assert!((piece.shard as u32) < k);
                prop_assert_eq!(layout.locate(piece.object_offset), (piece.shard, piece.shard_offset));
                let last = piece.object_offset + piece.len - 1;
                prop_assert_eq!(layout.locate(last), (piece.shard, piece.shard_offset + piece.len - 1));
                prop_assert_eq!(layout.object_offset(piece.shard, piece.shard_offset), piece.object_offset);
                let (from, to) = layout.stripe_span(offset, len);
                prop_assert!(from <= piece.shard_offset && piece.shard_offset + piece.len <= to);
                next += piece.len;
            }
        }
    }
}
