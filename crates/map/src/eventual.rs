//! Eventually consistent pools (issue 30): a write is acknowledged once
//! the PG's primary has it in its own operation log, and reaches the
//! replicas in the background. The primary keeps the oldest write its
//! replicas have not acknowledged younger than `max_lag`: past it, new
//! writes wait for their replicas as in a strong pool (back-pressure), so
//! a primary's failure loses at most the writes acknowledged within
//! `max_lag` before it (docs/OSD.md, "Eventual pools").

use serde::{Deserialize, Serialize};

use crate::{CommandError, Pool};

/// An eventual pool's setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Eventual {
    /// The longest a write acknowledged to a client may stay on its
    /// primary alone, in milliseconds.
    pub max_lag_ms: u32,
}

impl Default for Eventual {
    fn default() -> Self {
        Eventual { max_lag_ms: Eventual::DEFAULT_MAX_LAG_MS }
    }
}

impl Eventual {
    pub const DEFAULT_MAX_LAG_MS: u32 = 1000;
    /// Below this, every write would wait for its replicas anyway (a
    /// replication round trip under load is a few milliseconds).
    pub const MIN_MAX_LAG_MS: u32 = 10;
    /// Past a minute, a failure could take more than an operator expects
    /// of a "small" loss window; past the replication timeout (10 s) the
    /// writes themselves time out first.
    pub const MAX_MAX_LAG_MS: u32 = 60_000;

    /// Why this setting cannot make a pool (`None`: it can).
    pub fn invalid_because(&self) -> Option<String> {
        let ms = self.max_lag_ms;
        if !(Self::MIN_MAX_LAG_MS..=Self::MAX_MAX_LAG_MS).contains(&ms) {
            return Some(format!(
                "max_lag is {} ms to {} s (got {ms} ms)",
                Self::MIN_MAX_LAG_MS,
                Self::MAX_MAX_LAG_MS / 1000
            ));
        }
        None
    }
}

/// Parses a lag as an operator writes it: `250ms`, `1s`, `1.5s`, or a bare
/// number of milliseconds.
pub fn parse_lag(value: &str) -> Result<u32, String> {
    let value = value.trim();
    let bad = || format!("'{value}' is not a duration (say 250ms, 1s or 1.5s)");
    let (number, scale) = if let Some(ms) = value.strip_suffix("ms") {
        (ms, 1.0)
    } else if let Some(s) = value.strip_suffix('s') {
        (s, 1000.0)
    } else {
        (value, 1.0)
    };
    let number: f64 = number.trim().parse().map_err(|_| bad())?;
    let ms = number * scale;
    if !ms.is_finite() || ms < 0.0 || ms > f64::from(u32::MAX) || ms.fract() != 0.0 {
        return Err(bad());
    }
    Ok(ms as u32)
}

/// A lag as `parse_lag` reads it back, for `duplex pool list`.
pub fn format_lag(ms: u32) -> String {
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

/// Pool `pool` with `max_lag` set to `value`.
pub(crate) fn set_max_lag(pool: &Pool, value: &str) -> Result<Pool, CommandError> {
    let invalid = CommandError::Invalid;
    let mut new = pool.clone();
    let Some(eventual) = new.eventual.as_mut() else {
        return Err(invalid(format!(
            "pool '{}' is strongly consistent: max_lag is an eventual pool's (a pool's consistency is chosen when it is created)",
            pool.name
        )));
    };
    eventual.max_lag_ms = parse_lag(value).map_err(invalid)?;
    if let Some(why) = eventual.invalid_because() {
        return Err(invalid(why));
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lags_parse_as_operators_write_them_and_nothing_else() {
        assert_eq!(parse_lag("250ms"), Ok(250));
        assert_eq!(parse_lag("1s"), Ok(1000));
        assert_eq!(parse_lag("1.5s"), Ok(1500));
        assert_eq!(parse_lag(" 40 "), Ok(40));
        for bad in ["", "s", "-1s", "1.0005s", "fast", "1e99s", "NaNs", "1m"] {
            assert!(parse_lag(bad).is_err(), "{bad} parsed");
        }
        for ms in [10, 250, 1000, 1500, 60_000] {
            assert_eq!(parse_lag(&format_lag(ms)), Ok(ms));
        }
    }

    #[test]
    fn a_lag_outside_its_range_is_refused() {
        assert!(Eventual { max_lag_ms: 9 }.invalid_because().is_some());
        assert!(Eventual { max_lag_ms: 60_001 }.invalid_because().is_some());
        assert!(Eventual::default().invalid_because().is_none());
    }
}
