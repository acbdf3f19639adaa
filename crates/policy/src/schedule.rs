//! How often a policy takes a snapshot: the slots of a schedule, in UTC.

use crate::time::{civil, days_from_civil};
use crate::Error;
use std::fmt;

/// A schedule. Every variant cuts time into slots; a policy is due when no
/// run happened since the start of the current slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Every N minutes (slots aligned to multiples of N minutes since the epoch).
    Frequently(u32),
    Hourly,
    Daily,
    /// Weeks start on Monday 00:00 UTC.
    Weekly,
    Monthly,
    Yearly,
    /// `minute hour day-of-month month day-of-week`, evaluated in UTC.
    Cron(Cron),
    /// `none`: no slots; snapshots come from events and `policy run` only.
    Never,
}

pub const DEFAULT_FREQUENT_MINUTES: u32 = 15;

impl Schedule {
    pub fn parse(s: &str) -> Result<Schedule, Error> {
        let s = s.trim();
        let bad = |why: &str| Error::Schedule(format!("'{s}': {why}"));
        if let Some(spec) = s.strip_prefix("cron=").or_else(|| s.strip_prefix("cron ")) {
            return Ok(Schedule::Cron(Cron::parse(spec)?));
        }
        if let Some(n) = s.strip_prefix("frequently=") {
            let n: u32 = n
                .trim_end_matches('m')
                .parse()
                .map_err(|_| bad("expected frequently=MINUTES"))?;
            if !(1..=1440).contains(&n) {
                return Err(bad("minutes must be 1 to 1440"));
            }
            return Ok(Schedule::Frequently(n));
        }
        Ok(match s {
            "none" => Schedule::Never,
            "frequently" => Schedule::Frequently(DEFAULT_FREQUENT_MINUTES),
            "hourly" => Schedule::Hourly,
            "daily" => Schedule::Daily,
            "weekly" => Schedule::Weekly,
            "monthly" => Schedule::Monthly,
            "yearly" => Schedule::Yearly,
            _ => return Err(bad(
                "expected frequently[=MINUTES], hourly, daily, weekly, monthly, yearly, none or cron=\"M H DOM MON DOW\"",
            )),
        })
    }

    /// Start of the slot containing `t`: the latest slot start <= t.
    /// `None` for `none`, and for a cron rule that matched nothing in the last 5 years.
    pub fn slot_start(&self, t: i64) -> Option<i64> {
        let day = t.div_euclid(86_400);
        let c = civil(t);
        Some(match self {
            Schedule::Frequently(n) => {
                let p = i64::from(*n) * 60;
                t.div_euclid(p) * p
            }
            Schedule::Hourly => t.div_euclid(3600) * 3600,
            Schedule::Daily => day * 86_400,
            Schedule::Weekly => (day - i64::from(c.weekday)) * 86_400,
            Schedule::Monthly => days_from_civil(c.year, c.month, 1) * 86_400,
            Schedule::Yearly => days_from_civil(c.year, 1, 1) * 86_400,
            Schedule::Cron(cron) => return cron.at_or_before(t),
            Schedule::Never => return None,
        })
    }

    /// The first slot start strictly after `t`.
    pub fn next_after(&self, t: i64) -> Option<i64> {
        let c = civil(t);
        Some(match self {
            Schedule::Frequently(_) | Schedule::Hourly | Schedule::Daily | Schedule::Weekly => {
                let len = match self {
                    Schedule::Frequently(n) => i64::from(*n) * 60,
                    Schedule::Hourly => 3600,
                    Schedule::Daily => 86_400,
                    _ => 7 * 86_400,
                };
                self.slot_start(t)? + len
            }
            Schedule::Monthly => {
                let (y, m) = if c.month == 12 {
                    (c.year + 1, 1)
                } else {
                    (c.year, c.month + 1)
                };
                days_from_civil(y, m, 1) * 86_400
            }
            Schedule::Yearly => days_from_civil(c.year + 1, 1, 1) * 86_400,
            Schedule::Cron(cron) => return cron.after(t),
            Schedule::Never => return None,
        })
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Frequently(n) => write!(f, "frequently={n}"),
            Schedule::Hourly => f.write_str("hourly"),
            Schedule::Daily => f.write_str("daily"),
            Schedule::Weekly => f.write_str("weekly"),
            Schedule::Monthly => f.write_str("monthly"),
            Schedule::Yearly => f.write_str("yearly"),
            Schedule::Cron(c) => write!(f, "cron={}", c.text),
            Schedule::Never => f.write_str("none"),
        }
    }
}

/// A cron rule: each field a set of allowed values (bit i = value i).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    text: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    /// Bit 0 = Sunday (cron's numbering; 7 is folded onto 0).
    weekdays: u64,
    days_any: bool,
    weekdays_any: bool,
}

/// How far a cron search looks before giving up (a rule like `0 0 30 2 *` never matches).
const CRON_SEARCH_DAYS: i64 = 5 * 366;

impl Cron {
    pub fn parse(spec: &str) -> Result<Cron, Error> {
        let spec = spec.trim().trim_matches('"');
        let fields: Vec<&str> = spec.split_whitespace().collect();
        if fields.len() != 5 {
            return Err(Error::Schedule(format!(
                "cron rule '{spec}': expected 5 fields (minute hour day-of-month month day-of-week)"
            )));
        }
        let field = |i: usize, lo: u32, hi: u32| parse_field(spec, fields[i], lo, hi);
        let mut weekdays = field(4, 0, 7)?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        Ok(Cron {
            text: spec.to_string(),
            minutes: field(0, 0, 59)?,
            hours: field(1, 0, 23)?,
            days: field(2, 1, 31)?,
            months: field(3, 1, 12)?,
            weekdays,
            days_any: fields[2] == "*",
            weekdays_any: fields[4] == "*",
        })
    }

    fn day_matches(&self, day: i64) -> bool {
        let c = civil(day * 86_400);
        if self.months & (1 << c.month) == 0 {
            return false;
        }
        let dom = self.days & (1 << c.day) != 0;
        let dow = self.weekdays & (1 << ((c.weekday + 1) % 7)) != 0;
        // Cron: when both day fields are restricted, either may match.
        match (self.days_any, self.weekdays_any) {
            (true, true) => true,
            (false, true) => dom,
            (true, false) => dow,
            (false, false) => dom || dow,
        }
    }

    /// Matching minutes of a day, as minute-of-day, ascending.
    fn times(&self) -> impl DoubleEndedIterator<Item = i64> + '_ {
        (0..24)
            .filter(|h| self.hours & (1 << h) != 0)
            .flat_map(move |h| {
                (0..60)
                    .filter(|m| self.minutes & (1 << m) != 0)
                    .map(move |m| h * 60 + m)
            })
    }

    fn at_or_before(&self, t: i64) -> Option<i64> {
        let today = t.div_euclid(86_400);
        let now_min = t.rem_euclid(86_400) / 60;
        for day in (today - CRON_SEARCH_DAYS..=today).rev() {
            if !self.day_matches(day) {
                continue;
            }
            let bound = if day == today { now_min } else { 1439 };
            if let Some(m) = self.times().rev().find(|m| *m <= bound) {
                return Some(day * 86_400 + m * 60);
            }
        }
        None
    }

    fn after(&self, t: i64) -> Option<i64> {
        let today = t.div_euclid(86_400);
        let now_min = t.rem_euclid(86_400) / 60;
        for day in today..=today + CRON_SEARCH_DAYS {
            if !self.day_matches(day) {
                continue;
            }
            let found = if day == today {
                self.times().find(|m| *m > now_min)
            } else {
                self.times().next()
            };
            if let Some(m) = found {
                return Some(day * 86_400 + m * 60);
            }
        }
        None
    }
}

/// `*`, `N`, `A-B`, `*/S`, `A-B/S`, and comma lists of them.
fn parse_field(spec: &str, field: &str, lo: u32, hi: u32) -> Result<u64, Error> {
    let bad = || {
        Error::Schedule(format!(
            "cron rule '{spec}': bad field '{field}' (values {lo}-{hi})"
        ))
    };
    let num = |s: &str| -> Result<u32, Error> {
        let n: u32 = s.parse().map_err(|_| bad())?;
        if (lo..=hi).contains(&n) {
            Ok(n)
        } else {
            Err(bad())
        }
    };
    let mut bits = 0u64;
    for item in field.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => (r, s.parse::<u32>().ok().filter(|s| *s > 0).ok_or_else(bad)?),
            None => (item, 1),
        };
        let (a, b) = if range == "*" {
            (lo, hi)
        } else if let Some((a, b)) = range.split_once('-') {
            (num(a)?, num(b)?)
        } else {
            let n = num(range)?;
            (n, if item.contains('/') { hi } else { n })
        };
        if a > b {
            return Err(bad());
        }
        for v in (a..=b).step_by(step as usize) {
            bits |= 1 << v;
        }
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::parse_stamp;

    fn t(s: &str) -> i64 {
        parse_stamp(s).unwrap()
    }

    #[test]
    fn slots() {
        let now = t("2026-11-22T1437Z"); // a Sunday
        assert_eq!(
            Schedule::Hourly.slot_start(now),
            Some(t("2026-11-22T1400Z"))
        );
        assert_eq!(
            Schedule::Frequently(15).slot_start(now),
            Some(t("2026-11-22T1430Z"))
        );
        assert_eq!(Schedule::Daily.slot_start(now), Some(t("2026-11-22T0000Z")));
        assert_eq!(
            Schedule::Weekly.slot_start(now),
            Some(t("2026-11-16T0000Z"))
        );
        assert_eq!(
            Schedule::Monthly.slot_start(now),
            Some(t("2026-11-01T0000Z"))
        );
        assert_eq!(
            Schedule::Yearly.next_after(now),
            Some(t("2027-01-01T0000Z"))
        );
        assert_eq!(
            Schedule::Monthly.next_after(t("2026-12-31T2359Z")),
            Some(t("2027-01-01T0000Z"))
        );
        assert_eq!(
            Schedule::Weekly.next_after(now),
            Some(t("2026-11-23T0000Z"))
        );
    }

    #[test]
    fn cron_rules() {
        let c = Schedule::parse("cron=30 2 * * 1-5").unwrap();
        // Sunday 14:37 -> the last match was Friday 02:30.
        assert_eq!(
            c.slot_start(t("2026-11-22T1437Z")),
            Some(t("2026-11-20T0230Z"))
        );
        assert_eq!(
            c.next_after(t("2026-11-22T1437Z")),
            Some(t("2026-11-23T0230Z"))
        );
        let q = Schedule::parse("cron=*/15 * * * *").unwrap();
        assert_eq!(
            q.slot_start(t("2026-11-22T1437Z")),
            Some(t("2026-11-22T1430Z"))
        );
        assert_eq!(
            q.next_after(t("2026-11-22T1430Z")),
            Some(t("2026-11-22T1445Z"))
        );
        let sun = Schedule::parse("cron=0 0 * * 7").unwrap();
        assert_eq!(
            sun.slot_start(t("2026-11-22T1437Z")),
            Some(t("2026-11-22T0000Z"))
        );
        assert_eq!(
            Schedule::parse("cron=0 0 30 2 *").unwrap().next_after(0),
            None
        );
        for bad in [
            "cron=61 * * * *",
            "cron=* * *",
            "cron=5-1 * * * *",
            "every",
            "frequently=0",
        ] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
    }
}
