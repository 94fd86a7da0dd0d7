//! Rate control (§4.4.2 of the dissertation): the engine's I/O gives way
//! to the foreground's. Above a pool's high watermark of foreground IOPS
//! the engine issues one I/O per 500 foreground I/Os, between the low and
//! the high one per 100, and below the low one as many as it likes.

/// A pool's watermarks, in foreground IOPS on the OSD.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateControl {
    pub low_iops: u64,
    pub high_iops: u64,
}

/// What the foreground load allows the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allowance {
    Unlimited,
    /// One engine I/O per this many foreground I/Os.
    OnePer(u64),
}

impl RateControl {
    /// `None` if the low watermark lies above the high one.
    pub fn new(low_iops: u64, high_iops: u64) -> Option<RateControl> {
        (low_iops <= high_iops).then_some(RateControl { low_iops, high_iops })
    }

    pub fn allowance(&self, foreground_iops: u64) -> Allowance {
        if foreground_iops > self.high_iops {
            Allowance::OnePer(500)
        } else if foreground_iops > self.low_iops {
            Allowance::OnePer(100)
        } else {
            Allowance::Unlimited
        }
    }
}

/// Counts foreground I/Os and lets the engine take its share of them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Throttle {
    /// Foreground I/Os since the engine last took one.
    earned: u64,
    /// Engine I/Os issued, for the metric.
    pub issued: u64,
}

impl Throttle {
    pub fn foreground(&mut self, ios: u64) {
        self.earned = self.earned.saturating_add(ios);
    }

    /// Whether the engine may issue one I/O now under `allowance`; if so,
    /// it is counted.
    pub fn take(&mut self, allowance: Allowance) -> bool {
        let ok = match allowance {
            Allowance::Unlimited => true,
            Allowance::OnePer(n) if self.earned >= n => {
                self.earned -= n;
                true
            }
            Allowance::OnePer(_) => false,
        };
        self.issued += u64::from(ok);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_takes_one_io_per_500_above_the_high_watermark_and_per_100_between() {
        let rate = RateControl::new(1_000, 10_000).unwrap();
        assert_eq!(RateControl::new(2, 1), None);
        assert_eq!(rate.allowance(500), Allowance::Unlimited);
        assert_eq!(rate.allowance(5_000), Allowance::OnePer(100));
        assert_eq!(rate.allowance(20_000), Allowance::OnePer(500));
        let mut throttle = Throttle::default();
        for (fg_iops, foreground, expected) in [(20_000, 100_000, 200), (5_000, 100_000, 1_000), (10, 0, 7)] {
            throttle.foreground(foreground);
            let mut issued = 0;
            while issued < expected + 10 && throttle.take(rate.allowance(fg_iops)) {
                issued += 1;
                if fg_iops == 10 && issued == expected {
                    break;
                }
            }
            assert_eq!(issued, expected, "at {fg_iops} foreground IOPS");
        }
        assert_eq!(throttle.issued, 1_207);
    }
}
