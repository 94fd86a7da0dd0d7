//! An EC pool's profile: `k` data shards, `m` coding shards, and the
//! stripe unit (the bytes of one shard in one stripe).

use std::fmt;

/// Shards a PG of an EC pool has at most (`k + m`): the map's limit on a
/// PG's set (`duplex_map::command::MAX_POOL_SIZE`).
pub const MAX_SHARDS: u8 = 10;
/// The smallest stripe unit: one store block.
pub const MIN_STRIPE_UNIT: u32 = 4 << 10;
/// The largest stripe unit.
pub const MAX_STRIPE_UNIT: u32 = 64 << 10;
/// The stripe unit when none is asked for: a 4 KiB write then touches
/// one data shard and the parity.
pub const DEFAULT_STRIPE_UNIT: u32 = 4 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Profile {
    k: u8,
    m: u8,
    stripe_unit: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("'{0}' is not an erasure code: write it as k+m, such as 2+1 or 4+2")]
    Syntax(String),
    #[error("an erasure code needs k >= 2 data shards and m >= 1 coding shards (got {k}+{m}); for one data shard use replication")]
    TooFew { k: u32, m: u32 },
    #[error("{k}+{m} is {} shards; a PG holds at most {MAX_SHARDS}", k + m)]
    TooMany { k: u32, m: u32 },
    #[error("a stripe unit is a power of two from 4 to 64 KiB (got {0} bytes)")]
    StripeUnit(u64),
    #[error(
        "the stripe ({k} x {stripe_unit} bytes) does not divide the object size ({object_size} bytes): \
         choose a smaller stripe unit or a k that divides it"
    )]
    ObjectSize { k: u8, stripe_unit: u32, object_size: u64 },
    #[error("{k}+{m} needs {} failure domains (hosts) and the pool's rule has {domains}", k + m)]
    TooFewDomains { k: u8, m: u8, domains: usize },
}

impl Profile {
    pub fn new(k: u32, m: u32, stripe_unit: u64) -> Result<Profile, ProfileError> {
        if k < 2 || m < 1 {
            return Err(ProfileError::TooFew { k, m });
        }
        if k + m > MAX_SHARDS as u32 {
            return Err(ProfileError::TooMany { k, m });
        }
        let unit_ok =
            stripe_unit.is_power_of_two() && (MIN_STRIPE_UNIT as u64..=MAX_STRIPE_UNIT as u64).contains(&stripe_unit);
        if !unit_ok {
            return Err(ProfileError::StripeUnit(stripe_unit));
        }
        Ok(Profile { k: k as u8, m: m as u8, stripe_unit: stripe_unit as u32 })
    }

    /// `k+m`, as `duplex pool create --ec` takes it.
    pub fn parse(code: &str, stripe_unit: u64) -> Result<Profile, ProfileError> {
        let syntax = || ProfileError::Syntax(code.to_string());
        let (k, m) = code.trim().split_once('+').ok_or_else(syntax)?;
        let number = |text: &str| text.trim().parse::<u32>().map_err(|_| syntax());
        Profile::new(number(k)?, number(m)?, stripe_unit)
    }

    pub fn k(&self) -> usize {
        self.k as usize
    }

    pub fn m(&self) -> usize {
        self.m as usize
    }

    pub fn shards(&self) -> usize {
        self.k() + self.m()
    }

    pub fn stripe_unit(&self) -> u32 {
        self.stripe_unit
    }

    /// The data bytes of one stripe.
    pub fn stripe_width(&self) -> u64 {
        self.k as u64 * self.stripe_unit as u64
    }

    /// The pool's default min_size: k + 1, so that one more failure
    /// while it serves leaves the data readable.
    pub fn default_min_size(&self) -> usize {
        self.k() + 1
    }

    /// Raw bytes stored per byte written: (k + m) / k.
    pub fn overhead(&self) -> f64 {
        self.shards() as f64 / self.k() as f64
    }

    /// Checks that objects of `object_size` bytes are whole stripes, and
    /// that the pool's rule spreads the shards over enough failure domains.
    pub fn check_pool(&self, object_size: u64, domains: usize) -> Result<(), ProfileError> {
        if object_size == 0 || !object_size.is_multiple_of(self.stripe_width()) {
            return Err(ProfileError::ObjectSize { k: self.k, stripe_unit: self.stripe_unit, object_size });
        }
        if domains < self.shards() {
            return Err(ProfileError::TooFewDomains { k: self.k, m: self.m, domains });
        }
        Ok(())
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{} ({} KiB stripe unit)", self.k, self.m, self.stripe_unit >> 10)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tested_codes_parse_and_bad_ones_say_why() {
        for (code, k, m) in [("2+1", 2, 1), ("2+2", 2, 2), (" 4 + 2 ", 4, 2)] {
            let profile = Profile::parse(code, 4096).unwrap();
            assert_eq!((profile.k(), profile.m(), profile.default_min_size()), (k, m, k + 1));
        }
        assert_eq!(Profile::parse("2+1", 4096).unwrap().overhead(), 1.5);
        assert!(matches!(Profile::parse("2:1", 4096), Err(ProfileError::Syntax(_))));
        assert!(matches!(Profile::parse("two+1", 4096), Err(ProfileError::Syntax(_))));
        assert!(matches!(Profile::parse("1+1", 4096), Err(ProfileError::TooFew { .. })));
        assert!(matches!(Profile::parse("3+0", 4096), Err(ProfileError::TooFew { .. })));
        assert!(matches!(Profile::parse("30+3", 4096), Err(ProfileError::TooMany { .. })));
        for unit in [0, 2048, 6144, 128 << 10] {
            assert_eq!(Profile::parse("2+1", unit), Err(ProfileError::StripeUnit(unit)));
        }
        assert!(Profile::parse("2+1", 64 << 10).is_ok());
    }

    #[test]
    fn a_pool_needs_whole_stripes_per_object_and_a_domain_per_shard() {
        let profile = Profile::parse("2+1", 4096).unwrap();
        assert_eq!(profile.check_pool(4 << 20, 3), Ok(()));
        assert!(matches!(profile.check_pool(4 << 20, 2), Err(ProfileError::TooFewDomains { domains: 2, .. })));
        let three = Profile::parse("3+1", 4096).unwrap();
        let err = three.check_pool(4 << 20, 4).unwrap_err();
        assert!(matches!(err, ProfileError::ObjectSize { .. }));
        assert!(err.to_string().contains("does not divide the object size"), "{err}");
        assert_eq!(three.check_pool(3 << 20, 4), Ok(()));
    }
}
