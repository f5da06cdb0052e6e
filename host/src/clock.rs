//! Wall-clock time as mst records it: time since the Unix epoch (a clock set before 1970 reads
//! as the epoch rather than failing).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time since the Unix epoch.
pub fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Whole seconds since the Unix epoch.
pub fn unix_secs() -> u64 {
    since_epoch().as_secs()
}

/// Milliseconds since the Unix epoch.
pub fn unix_millis() -> u64 {
    since_epoch().as_millis() as u64
}

/// `secs` since the epoch as a compact UTC stamp, `20261130T015500Z` (run ids).
pub fn utc_compact(secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = utc_parts(secs);
    format!("{y:04}{m:02}{d:02}T{hh:02}{mm:02}{ss:02}Z")
}

/// `secs` since the epoch as an RFC 3339 UTC time, `2026-11-30T01:55:00Z`.
pub fn utc_rfc3339(secs: u64) -> String {
    let (y, m, d, hh, mm, ss) = utc_parts(secs);
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// Year, month, day, hour, minute and second of `secs` since the epoch, in UTC.
fn utc_parts(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps_are_civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        let secs = 20_787 * 86_400 + 3600 + 55 * 60 + 7;
        assert_eq!(utc_compact(secs), "20261130T015507Z");
        assert_eq!(utc_rfc3339(secs), "2026-11-30T01:55:07Z");
    }
}
