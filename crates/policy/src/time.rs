//! UTC calendar arithmetic on Unix seconds (no time zones: names and
//! periods are UTC, so a DST change can neither repeat nor skip a slot).

/// A civil UTC date and time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Civil {
    pub year: i64,
    /// 1..=12
    pub month: u32,
    /// 1..=31
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Monday .. 6 = Sunday
    pub weekday: u32,
}

/// Days since 1970-01-01 -> (year, month, day) (H. Hinnant's algorithm).
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// (year, month, day) -> days since 1970-01-01.
pub fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

pub fn civil(t: i64) -> Civil {
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    Civil {
        year,
        month,
        day,
        hour: (secs / 3600) as u32,
        minute: (secs % 3600 / 60) as u32,
        second: (secs % 60) as u32,
        // 1970-01-01 was a Thursday (3 when Monday is 0).
        weekday: (days + 3).rem_euclid(7) as u32,
    }
}

pub fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `2026-11-22 14:00:00Z`, for messages.
pub fn display(t: i64) -> String {
    let c = civil(t);
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}Z",
        c.year, c.month, c.day, c.hour, c.minute, c.second
    )
}

/// Parses `YYYY-MM-DDTHHMMZ` or `YYYY-MM-DDTHHMMSSZ` (the stamp in an
/// automatic snapshot's name).
pub fn parse_stamp(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    let with_secs = match b.len() {
        16 => false,
        18 => true,
        _ => return None,
    };
    if b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[b.len() - 1] != b'Z' {
        return None;
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute) = (num(11..13)?, num(13..15)?);
    let second = if with_secs { num(15..17)? } else { 0 };
    if !(1..=12).contains(&month)
        || day == 0
        || day > days_in_month(i64::from(year), month)
        || hour > 23
        || minute > 59
        || second > 59
    {
        return None;
    }
    Some(
        days_from_civil(i64::from(year), month, day) * 86_400
            + i64::from(hour * 3600 + minute * 60 + second),
    )
}

/// `2026-11-22T1400Z` (minute precision) or with seconds.
pub fn stamp(t: i64, seconds: bool) -> String {
    let c = civil(t);
    let mut s = format!(
        "{:04}-{:02}-{:02}T{:02}{:02}",
        c.year, c.month, c.day, c.hour, c.minute
    );
    if seconds {
        s.push_str(&format!("{:02}", c.second));
    }
    s.push('Z');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_round_trips() {
        for days in -800_000..800_000i64 {
            if days % 7 != 0 {
                continue;
            }
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(civil(0).weekday, 3);
        let t = 1_795_240_643; // Sat Nov 21 05:57:23 2026
        let c = civil(t);
        assert_eq!((c.year, c.month, c.day, c.weekday), (2026, 11, 21, 5));
        assert_eq!(stamp(t, false), "2026-11-21T0557Z");
        assert_eq!(parse_stamp("2026-11-21T0557Z"), Some(t - 23));
        assert_eq!(parse_stamp(&stamp(t, true)), Some(t));
        for bad in [
            "2026-02-30T0000Z",
            "2026-11-21T2400Z",
            "2026-11-21 0557Z",
            "x",
        ] {
            assert_eq!(parse_stamp(bad), None, "{bad}");
        }
    }
}
