//! Progress bars for long object walks (snapshot trims, rollbacks,
//! flattens), and times as operators read them.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar counting objects, drawn on stderr only when it is a terminal.
pub struct ObjectsBar(ProgressBar);

pub fn bar(what: &str) -> ObjectsBar {
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos}/{len} objects eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    ObjectsBar(bar)
}

impl ObjectsBar {
    pub fn update(&self, done: u64, all: u64) {
        self.0.set_length(all);
        self.0.set_position(done);
    }

    pub fn finish(self) {
        self.0.finish_and_clear();
    }
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS` (UTC).
pub fn format_time(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_as_calendar_dates() {
        assert_eq!(super::format_time(0), "1970-01-01 00:00:00");
        assert_eq!(super::format_time(1_795_651_200 + 3_723), "2026-11-26 01:02:03");
        assert_eq!(super::format_time(951_782_400), "2000-02-29 00:00:00");
    }
}
