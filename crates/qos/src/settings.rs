//! An image's QoS settings as operators write them (`duplex image set`,
//! `duplex pool set`): its [`Limits`], and its reservation and weight in
//! the OSDs' schedulers.
//!
//! A request's cost is counted in 4 KiB operations ([`cost`]), so a
//! reservation of 1,000 IOPS is 1,000 4 KiB operations a second, or 250 of
//! 16 KiB, as Ceph's mClock counts `max(bytes, bandwidth/iops)`.

use crate::limit::{LimitError, Limits, MAX_IOPS};
use crate::scheduler::ClassSpec;

/// Every setting, by the names `duplex image set` takes.
pub const KEYS: [&str; 9] = [
    "qos_iops",
    "qos_read_iops",
    "qos_write_iops",
    "qos_bps",
    "qos_read_bps",
    "qos_write_bps",
    "qos_burst_s",
    "qos_reservation_iops",
    "qos_weight",
];

/// The weight of an image that sets none.
pub const DEFAULT_WEIGHT: f64 = 1.0;
/// The least and the most weight a setting takes.
pub const MIN_WEIGHT: f64 = 0.01;
pub const MAX_WEIGHT: f64 = 100.0;

/// The bytes one cost unit stands for.
pub const COST_BYTES: u64 = 4096;

/// What a request of `bytes` costs a scheduler: one unit per started
/// 4 KiB, at least one.
pub fn cost(bytes: u64) -> f64 {
    bytes.div_ceil(COST_BYTES).max(1) as f64
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassSettings {
    pub limits: Limits,
    /// 4 KiB operations a second the image is owed at each OSD under
    /// contention, 0 for none.
    pub reservation_iops: u64,
    /// Its share of what reservations leave, against other images' weights.
    pub weight: f64,
}

impl Default for ClassSettings {
    fn default() -> Self {
        ClassSettings { limits: Limits::default(), reservation_iops: 0, weight: DEFAULT_WEIGHT }
    }
}

impl ClassSettings {
    /// Settings from `key=value` pairs over the defaults, checked as a whole.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<ClassSettings, LimitError> {
        let mut settings = ClassSettings::default();
        for (key, value) in pairs {
            settings.set(key, value)?;
        }
        settings.check()?;
        Ok(settings)
    }

    /// [`Self::from_pairs`] of owned text, as the map keeps it.
    pub fn from_strings(pairs: &[(String, String)]) -> Result<ClassSettings, LimitError> {
        ClassSettings::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// Sets `key` (one of [`KEYS`]) from its text. Call [`Self::check`]
    /// once every key is set.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), LimitError> {
        let bad = |expected| LimitError::BadValue { key: key.to_string(), value: value.to_string(), expected };
        match key {
            "qos_reservation_iops" => {
                let text = value.trim();
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad("a whole number of 4 KiB operations a second (0: none)"));
                }
                let iops: u64 = text.parse().map_err(|_| bad("a whole number below 2^64"))?;
                if iops > MAX_IOPS {
                    return Err(LimitError::TooLarge {
                        key: key.to_string(),
                        value: value.to_string(),
                        max: MAX_IOPS.to_string(),
                    });
                }
                self.reservation_iops = iops;
            }
            "qos_weight" => {
                let weight: f64 = value.trim().parse().map_err(|_| bad("a number"))?;
                if !(MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
                    return Err(bad("a number from 0.01 to 100 (the default is 1)"));
                }
                self.weight = weight;
            }
            _ => self.limits.set(key, value)?,
        }
        Ok(())
    }

    /// The settings agree with each other: a reservation is not above
    /// the image's own IOPS limit.
    pub fn check(&self) -> Result<(), LimitError> {
        let ceiling =
            [self.limits.iops, self.limits.read_iops, self.limits.write_iops].into_iter().filter(|&l| l != 0).min();
        match ceiling {
            Some(limit) if self.reservation_iops > limit => Err(LimitError::BadValue {
                key: "qos_reservation_iops".into(),
                value: self.reservation_iops.to_string(),
                expected: "at most the image's own IOPS limits",
            }),
            _ => Ok(()),
        }
    }

    /// The settings that differ from the defaults, as `key=value` text
    /// that [`Self::set`] reads back.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let mut out = self.limits.settings();
        if self.reservation_iops != 0 {
            out.push(("qos_reservation_iops", self.reservation_iops.to_string()));
        }
        if self.weight != DEFAULT_WEIGHT {
            out.push(("qos_weight", self.weight.to_string()));
        }
        out
    }

    /// Nothing differs from the defaults.
    pub fn is_default(&self) -> bool {
        *self == ClassSettings::default()
    }

    /// The image's class in an OSD's scheduler. Its limit is left to the
    /// limiter in front of the scheduler, which has a burst allowance.
    pub fn class_spec(&self) -> ClassSpec {
        ClassSpec::new(self.reservation_iops as f64, self.weight, 0.0)
            .expect("settings are checked when set: reservation and weight are in range")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_read_back_and_bad_ones_are_named() {
        let s =
            ClassSettings::from_pairs([("qos_iops", "2000"), ("qos_reservation_iops", "500"), ("qos_weight", "2.5")])
                .unwrap();
        assert_eq!(s.limits.iops, 2000);
        assert_eq!(s.class_spec().reservation(), 500.0);
        assert_eq!(s.class_spec().weight(), 2.5);
        let text = s.settings();
        let again = ClassSettings::from_pairs(text.iter().map(|(k, v)| (*k, v.as_str()))).unwrap();
        assert_eq!(again, s);
        for (key, value) in [
            ("qos_weight", "0"),
            ("qos_weight", "-1"),
            ("qos_weight", "NaN"),
            ("qos_weight", "101"),
            ("qos_reservation_iops", "-5"),
            ("qos_reservation_iops", "1e3"),
            ("qos_reservation_iops", "100000001"),
            ("qos_resrevation", "5"),
        ] {
            let err = ClassSettings::from_pairs([(key, value)]).unwrap_err();
            assert!(err.to_string().contains(key), "{key}={value}: {err}");
        }
        let err = ClassSettings::from_pairs([("qos_write_iops", "100"), ("qos_reservation_iops", "200")]).unwrap_err();
        assert!(err.to_string().contains("at most"), "{err}");
        assert!(ClassSettings::from_pairs([("qos_weight", "1")]).unwrap().is_default());
    }

    #[test]
    fn cost_counts_started_4k_blocks() {
        assert_eq!(cost(0), 1.0);
        assert_eq!(cost(512), 1.0);
        assert_eq!(cost(4096), 1.0);
        assert_eq!(cost(4097), 2.0);
        assert_eq!(cost(1 << 20), 256.0);
    }
}
