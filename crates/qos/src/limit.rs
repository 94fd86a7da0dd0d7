//! An image's limits, and the token buckets that enforce them.
//!
//! Each limit set (non-zero) is a bucket filling at the limit's rate and
//! holding at most `rate × burst_seconds`: an idle image may burst that
//! much above its rate, and over any span `T` an image gets at most
//! `rate × T` plus one bucket (plus the last I/O, which may take the bucket
//! into debt: an I/O larger than the bucket still passes once it is full,
//! and the next waits until the debt is paid). An I/O passes only when
//! every bucket that counts it has room, and then takes from all of them,
//! so no bucket is charged for an I/O another one held back.
//!
//! Zero means unlimited, as in Ceph's `rbd_qos_*` settings.

use thiserror::Error;

/// Microseconds per second.
const MICROS: f64 = 1_000_000.0;

/// The most any IOPS limit takes: past it is a typo, not a limit.
pub const MAX_IOPS: u64 = 100_000_000;
/// The most any bytes-per-second limit takes (1 PiB/s).
pub const MAX_BPS: u64 = 1 << 50;
/// The longest burst allowance, in seconds.
pub const MAX_BURST_SECONDS: f64 = 3600.0;
/// The burst allowance when none is set: one second's worth.
pub const DEFAULT_BURST_SECONDS: f64 = 1.0;

/// The settings, by the names `duplex image set` takes.
pub const KEYS: [&str; 7] =
    ["qos_iops", "qos_read_iops", "qos_write_iops", "qos_bps", "qos_read_bps", "qos_write_bps", "qos_burst_s"];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    Read,
    Write,
}

/// An image's limits. Each rate is per second, 0 for none.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub iops: u64,
    pub read_iops: u64,
    pub write_iops: u64,
    pub bps: u64,
    pub read_bps: u64,
    pub write_bps: u64,
    /// How many seconds' worth of each rate an idle image may spend at once.
    pub burst_seconds: f64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            iops: 0,
            read_iops: 0,
            write_iops: 0,
            bps: 0,
            read_bps: 0,
            write_bps: 0,
            burst_seconds: DEFAULT_BURST_SECONDS,
        }
    }
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("unknown QoS setting '{key}' (one of: {})", crate::settings::KEYS.join(", "))]
    UnknownKey { key: String },
    #[error("{key}: '{value}' is not {expected}")]
    BadValue { key: String, value: String, expected: &'static str },
    #[error("{key}: {value} is more than the most it takes, {max}")]
    TooLarge { key: String, value: String, max: String },
}

/// What a rate counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Unit {
    Ops,
    Bytes,
}

/// Each rate setting: its key, what it counts, and which direction (None: both).
const RATES: [(&str, Unit, Option<Direction>); 6] = [
    ("qos_iops", Unit::Ops, None),
    ("qos_read_iops", Unit::Ops, Some(Direction::Read)),
    ("qos_write_iops", Unit::Ops, Some(Direction::Write)),
    ("qos_bps", Unit::Bytes, None),
    ("qos_read_bps", Unit::Bytes, Some(Direction::Read)),
    ("qos_write_bps", Unit::Bytes, Some(Direction::Write)),
];

impl Limits {
    fn rate(&self, index: usize) -> u64 {
        [self.iops, self.read_iops, self.write_iops, self.bps, self.read_bps, self.write_bps][index]
    }

    fn rate_mut(&mut self, index: usize) -> &mut u64 {
        match index {
            0 => &mut self.iops,
            1 => &mut self.read_iops,
            2 => &mut self.write_iops,
            3 => &mut self.bps,
            4 => &mut self.read_bps,
            _ => &mut self.write_bps,
        }
    }

    /// No rate is limited.
    pub fn is_unlimited(&self) -> bool {
        (0..RATES.len()).all(|i| self.rate(i) == 0)
    }

    /// Sets `key` (one of [`KEYS`]) from its text: a whole number (bytes
    /// per second may carry a K, M, G or T suffix, powers of 1024), 0 for
    /// unlimited; or the burst allowance in seconds (a positive number).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), LimitError> {
        let bad = |expected| LimitError::BadValue { key: key.to_string(), value: value.to_string(), expected };
        if key == "qos_burst_s" {
            let seconds: f64 = value.trim().parse().map_err(|_| bad("a number of seconds"))?;
            if !seconds.is_finite() || seconds <= 0.0 {
                return Err(bad("a number of seconds above 0"));
            }
            if seconds > MAX_BURST_SECONDS {
                return Err(LimitError::TooLarge {
                    key: key.to_string(),
                    value: value.to_string(),
                    max: format!("{MAX_BURST_SECONDS} s"),
                });
            }
            self.burst_seconds = seconds;
            return Ok(());
        }
        let Some(index) = RATES.iter().position(|(name, ..)| *name == key) else {
            return Err(LimitError::UnknownKey { key: key.to_string() });
        };
        let (unit, max) = match RATES[index].1 {
            Unit::Ops => (parse_count(value, false), MAX_IOPS),
            Unit::Bytes => (parse_count(value, true), MAX_BPS),
        };
        let expected = match RATES[index].1 {
            Unit::Ops => "a whole number of operations a second (0: unlimited)",
            Unit::Bytes => "a whole number of bytes a second, with K, M, G or T if wanted (0: unlimited)",
        };
        let rate = unit.ok_or_else(|| bad(expected))?;
        if rate > max {
            return Err(LimitError::TooLarge { key: key.to_string(), value: value.to_string(), max: max.to_string() });
        }
        *self.rate_mut(index) = rate;
        Ok(())
    }

    /// The settings that differ from the defaults, as `key=value` text
    /// that [`Limits::set`] reads back.
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let mut out: Vec<(&'static str, String)> = RATES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.rate(*i) != 0)
            .map(|(i, (key, ..))| (*key, self.rate(i).to_string()))
            .collect();
        if self.burst_seconds != DEFAULT_BURST_SECONDS {
            out.push(("qos_burst_s", self.burst_seconds.to_string()));
        }
        out
    }

    /// This share (0 to 1] of every limit: a gateway's part of an image's
    /// limits when several serve it. A limit never scales to 0 (unlimited).
    pub fn scaled(&self, share: f64) -> Limits {
        debug_assert!(share > 0.0 && share <= 1.0, "a share of {share}");
        let mut out = *self;
        for i in 0..RATES.len() {
            let rate = self.rate(i);
            if rate != 0 {
                *out.rate_mut(i) = ((rate as f64 * share).floor() as u64).max(1);
            }
        }
        out
    }
}

/// A whole number, with a binary size suffix if `suffixes`.
fn parse_count(text: &str, suffixes: bool) -> Option<u64> {
    let text = text.trim();
    let (digits, multiplier) = match text.char_indices().last() {
        Some((at, c)) if suffixes && c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return None,
            };
            (&text[..at], 1u64 << shift)
        }
        _ => (text, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(multiplier)
}

/// Tokens filling at a rate up to a capacity. Starts full.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    /// Tokens a microsecond.
    rate: f64,
    capacity: f64,
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: u64,
}

impl TokenBucket {
    pub fn new(per_second: f64, capacity: f64, now: u64) -> TokenBucket {
        assert!(per_second > 0.0 && capacity >= 1.0, "a bucket of {per_second}/s holding {capacity}");
        TokenBucket { rate: per_second / MICROS, capacity, tokens: capacity, at: now }
    }

    fn refill(&mut self, now: u64) {
        if now > self.at {
            self.tokens = (self.tokens + (now - self.at) as f64 * self.rate).min(self.capacity);
            self.at = now;
        }
    }

    /// Microseconds from `now` until `amount` may pass (0: now). An
    /// amount larger than the bucket passes once it is full.
    pub fn wait(&mut self, amount: f64, now: u64) -> u64 {
        self.refill(now);
        let need = amount.min(self.capacity);
        if self.tokens >= need {
            0
        } else {
            ((need - self.tokens) / self.rate).ceil().max(1.0) as u64
        }
    }

    /// Takes `amount` (the bucket may go into debt).
    pub fn take(&mut self, amount: f64, now: u64) {
        self.refill(now);
        self.tokens -= amount;
    }

    /// A new rate and capacity; what it holds is kept, up to the new capacity.
    pub fn reconfigure(&mut self, per_second: f64, capacity: f64, now: u64) {
        assert!(per_second > 0.0 && capacity >= 1.0, "a bucket of {per_second}/s holding {capacity}");
        self.refill(now);
        self.rate = per_second / MICROS;
        self.capacity = capacity;
        self.tokens = self.tokens.min(capacity);
    }
}

/// An image's limits at work: one bucket per limit set.
#[derive(Clone, Debug)]
pub struct Limiter {
    limits: Limits,
    /// By index into the rates, the buckets of the limits set.
    buckets: Vec<(usize, TokenBucket)>,
}

impl Limiter {
    pub fn new(limits: Limits, now: u64) -> Limiter {
        let mut limiter = Limiter { limits: Limits::default(), buckets: Vec::new() };
        limiter.set_limits(limits, now);
        limiter
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Nothing is limited: every I/O passes at once.
    pub fn is_unlimited(&self) -> bool {
        self.buckets.is_empty()
    }

    /// New limits, live: a bucket kept keeps what it holds (up to its new
    /// capacity); a new one starts full.
    pub fn set_limits(&mut self, limits: Limits, now: u64) {
        let mut buckets = Vec::new();
        for (i, _) in RATES.iter().enumerate() {
            let rate = limits.rate(i);
            if rate == 0 {
                continue;
            }
            let per_second = rate as f64;
            let capacity = (per_second * limits.burst_seconds).max(1.0);
            let bucket = match self.buckets.iter().position(|(index, _)| *index == i) {
                Some(at) => {
                    let mut bucket = self.buckets.swap_remove(at).1;
                    bucket.reconfigure(per_second, capacity, now);
                    bucket
                }
                None => TokenBucket::new(per_second, capacity, now),
            };
            buckets.push((i, bucket));
        }
        self.limits = limits;
        self.buckets = buckets;
    }

    /// Admits an I/O of `bytes` going `direction` now (`Ok`), or says when
    /// it may go (`Err(at)`, later than `now`): then nothing is taken.
    pub fn admit(&mut self, direction: Direction, bytes: u64, now: u64) -> Result<(), u64> {
        let counts = |index: usize| -> Option<f64> {
            let (_, unit, only) = RATES[index];
            if only.is_some_and(|d| d != direction) {
                return None;
            }
            Some(match unit {
                Unit::Ops => 1.0,
                Unit::Bytes => bytes as f64,
            })
        };
        let mut wait = 0;
        for (index, bucket) in &mut self.buckets {
            if let Some(amount) = counts(*index) {
                wait = wait.max(bucket.wait(amount, now));
            }
        }
        if wait > 0 {
            return Err(now + wait);
        }
        for (index, bucket) in &mut self.buckets {
            if let Some(amount) = counts(*index) {
                bucket.take(amount, now);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn settings_parse_with_clear_errors_and_read_back() {
        let mut limits = Limits::default();
        limits.set("qos_iops", "2000").unwrap();
        limits.set("qos_bps", "100M").unwrap();
        limits.set("qos_burst_s", "5").unwrap();
        limits.set("qos_write_bps", "0").unwrap();
        assert_eq!((limits.iops, limits.bps, limits.burst_seconds, limits.write_bps), (2000, 100 << 20, 5.0, 0));
        let mut back = Limits::default();
        for (key, value) in limits.settings() {
            back.set(key, &value).unwrap();
        }
        assert_eq!(back, limits);
        assert!(matches!(limits.set("qos_iops", "-5"), Err(LimitError::BadValue { .. })));
        assert!(matches!(limits.set("qos_iops", "2k"), Err(LimitError::BadValue { .. })), "IOPS take no suffix");
        assert!(matches!(limits.set("qos_iops", "1000000000"), Err(LimitError::TooLarge { .. })));
        assert!(matches!(limits.set("qos_bps", "5P"), Err(LimitError::BadValue { .. })));
        assert!(matches!(limits.set("qos_bps", "99999999999T"), Err(LimitError::BadValue { .. })), "overflows");
        assert!(matches!(limits.set("qos_burst_s", "0"), Err(LimitError::BadValue { .. })));
        assert!(matches!(limits.set("qos_burst_s", "NaN"), Err(LimitError::BadValue { .. })));
        assert!(matches!(limits.set("qos_burst_s", "7200"), Err(LimitError::TooLarge { .. })));
        let unknown = limits.set("qos_iosp", "5").unwrap_err();
        assert!(unknown.to_string().contains("qos_iops"), "{unknown}");
        assert_eq!(limits.iops, 2000, "a refused setting changes nothing");
        assert!(Limits::default().is_unlimited() && !limits.is_unlimited());
        assert_eq!(limits.scaled(0.5).iops, 1000);
        let mut tiny = Limits::default();
        tiny.set("qos_iops", "1").unwrap();
        assert_eq!(tiny.scaled(0.25).iops, 1, "a share never becomes unlimited");
    }

    #[test]
    fn an_idle_image_bursts_its_allowance_then_holds_its_rate() {
        let mut limits = Limits::default();
        limits.set("qos_iops", "100").unwrap();
        limits.set("qos_burst_s", "2").unwrap();
        let mut limiter = Limiter::new(limits, 0);
        let mut passed = 0;
        while limiter.admit(Direction::Write, 4096, 0).is_ok() {
            passed += 1;
        }
        assert_eq!(passed, 200, "two seconds' worth at once");
        let at = limiter.admit(Direction::Read, 4096, 0).unwrap_err();
        assert_eq!(at, 10_000, "then one every 10 ms");
        assert!(limiter.admit(Direction::Read, 4096, at).is_ok());
    }

    #[test]
    fn direction_limits_count_only_their_direction_and_a_held_io_takes_nothing() {
        let mut limits = Limits::default();
        limits.set("qos_write_iops", "10").unwrap();
        limits.set("qos_bps", "1M").unwrap();
        let mut limiter = Limiter::new(limits, 0);
        for _ in 0..10 {
            limiter.admit(Direction::Write, 1, 0).unwrap();
        }
        assert!(limiter.admit(Direction::Write, 1, 0).is_err(), "the write IOPS are spent");
        // Reads pass: only bytes count them. A held write took no bytes.
        let mut reads = 0u64;
        while limiter.admit(Direction::Read, 4096, 0).is_ok() {
            reads += 1;
        }
        // 1 MiB less the writes' 10 bytes holds 255 reads of 4 KiB, not 256.
        assert_eq!(reads, 255, "the byte bucket counts reads and writes alike");
    }

    #[test]
    fn an_io_larger_than_the_bucket_passes_when_full_and_the_next_waits_out_the_debt() {
        let mut limits = Limits::default();
        limits.set("qos_bps", "1M").unwrap();
        let mut limiter = Limiter::new(limits, 0);
        limiter.admit(Direction::Write, 4 << 20, 0).expect("a full bucket lets a 4 MiB write go");
        let at = limiter.admit(Direction::Write, 4096, 0).unwrap_err();
        // 3 MiB of debt plus 4 KiB, at 1 MiB/s.
        assert!((3_000_000..3_010_000).contains(&at), "waits {at} µs");
    }

    #[test]
    fn live_changes_keep_what_a_bucket_holds() {
        let mut limits = Limits::default();
        limits.set("qos_iops", "1000").unwrap();
        let mut limiter = Limiter::new(limits, 0);
        for _ in 0..1000 {
            limiter.admit(Direction::Read, 1, 0).unwrap();
        }
        limits.set("qos_iops", "10").unwrap();
        limiter.set_limits(limits, 0);
        assert!(limiter.admit(Direction::Read, 1, 0).is_err(), "an emptied bucket is not refilled by a change");
        assert_eq!(limiter.admit(Direction::Read, 1, 0), Err(100_000));
        limiter.set_limits(Limits::default(), 0);
        assert!(limiter.is_unlimited() && limiter.admit(Direction::Read, 1, 0).is_ok());
    }

    proptest! {
        /// Over any span, what passes is at most the rate over it plus one
        /// bucket plus one I/O (its debt), for every limit; and a client
        /// that always has I/O waiting gets the rate (work is not withheld).
        #[test]
        fn no_span_passes_more_than_its_rate_and_a_bucket(
            iops in 1u64..5_000,
            bps in prop_oneof![Just(0u64), 4_096u64..50_000_000],
            burst in 0.1f64..3.0,
            ios in prop::collection::vec((0u64..3_000, prop::bool::ANY, 1u64..262_144), 50..400),
        ) {
            let limits = Limits { iops, bps, burst_seconds: burst, ..Limits::default() };
            let mut limiter = Limiter::new(limits, 0);
            // Each I/O arrives `gap` µs after the previous one passed (a
            // closed loop) and passes at the first instant it is admitted.
            let mut now = 0u64;
            let mut passed: Vec<(u64, u64)> = Vec::new();
            for (gap, read, bytes) in &ios {
                now += gap;
                let direction = if *read { Direction::Read } else { Direction::Write };
                loop {
                    match limiter.admit(direction, *bytes, now) {
                        Ok(()) => break,
                        Err(at) => {
                            prop_assert!(at > now, "told to wait until {} at {}", at, now);
                            now = at;
                        }
                    }
                }
                passed.push((now, *bytes));
            }
            let largest = ios.iter().map(|io| io.2).max().unwrap_or(0) as f64;
            for (i, (start, _)) in passed.iter().enumerate() {
                let mut count = 0f64;
                let mut bytes = 0f64;
                for (at, size) in &passed[i..] {
                    count += 1.0;
                    bytes += *size as f64;
                    let span = (*at - *start) as f64 / 1e6;
                    let ops_cap = (iops as f64 * burst).max(1.0);
                    prop_assert!(count <= iops as f64 * span + ops_cap + 1.0 + 1e-6,
                        "{} I/Os in {} s at {} IOPS with {} s of burst", count, span, iops, burst);
                    if bps > 0 {
                        let bytes_cap = (bps as f64 * burst).max(1.0);
                        prop_assert!(bytes <= bps as f64 * span + bytes_cap + largest + 1.0,
                            "{} bytes in {} s at {} B/s", bytes, span, bps);
                    }
                }
            }
        }
    }

    #[test]
    fn a_saturating_client_gets_its_limit_within_a_percent() {
        for iops in [500u64, 2_000, 10_000] {
            let limits = Limits { iops, ..Limits::default() };
            let mut limiter = Limiter::new(limits, 0);
            let (mut now, mut passed) = (0u64, 0u64);
            let end = 10_000_000;
            while now < end {
                match limiter.admit(Direction::Write, 4096, now) {
                    Ok(()) => passed += 1,
                    Err(at) => now = at,
                }
            }
            let expected = iops * 10 + iops; // ten seconds, and the initial bucket
            assert!(passed.abs_diff(expected) * 100 <= expected, "{passed} of {expected} at {iops} IOPS");
        }
    }
}
