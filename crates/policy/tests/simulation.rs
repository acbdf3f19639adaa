//! The planner against a clock the test controls: a simulated year of
//! hourly runs of the Time Machine rules, checked against a reference
//! computed differently (a day-counting calendar, group-by-period over every
//! snapshot ever taken), across DST changes, downtime and a restart.

use policy::{plan, Capacity, Input, Policy, Schedule, SnapshotEntry};
use std::collections::{BTreeMap, BTreeSet};

const HOUR: i64 = 3600;
const DAY: i64 = 86_400;

/// Reference calendar: count whole years and months from 1970 (slow, obvious).
fn ref_ymd(t: i64) -> (i64, i64, i64) {
    let mut days = t.div_euclid(DAY);
    let mut year = 1970;
    let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    loop {
        let len = if leap(year) { 366 } else { 365 };
        if days < len {
            break;
        }
        days -= len;
        year += 1;
    }
    let months = [
        31,
        if leap(year) { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    let mut month = 1;
    for len in months {
        if days < len {
            break;
        }
        days -= len;
        month += 1;
    }
    (year, month, days + 1)
}

/// Reference periods for the Time Machine grid.
fn ref_hour(t: i64) -> (i64, i64, i64, i64) {
    let (y, m, d) = ref_ymd(t);
    (y, m, d, t.rem_euclid(DAY) / HOUR)
}

fn ref_week(t: i64) -> i64 {
    // 1970-01-05 was the first Monday.
    let monday0 = 4 * DAY;
    (t - monday0).div_euclid(7 * DAY)
}

/// Reference retention: group every snapshot by period, keep the newest of
/// the newest N groups, per rule; plus the newest snapshot and held ones.
fn reference(all: &[(i64, String)], held: &BTreeSet<String>) -> BTreeSet<String> {
    fn newest_of_groups<K: Ord + Clone>(
        all: &[(i64, String)],
        key: impl Fn(i64) -> K,
        n: usize,
    ) -> Vec<String> {
        let mut groups: BTreeMap<K, (i64, String)> = BTreeMap::new();
        for (t, name) in all {
            let e = groups.entry(key(*t)).or_insert((*t, name.clone()));
            if *t > e.0 {
                *e = (*t, name.clone());
            }
        }
        let mut v: Vec<(i64, String)> = groups.into_values().collect();
        v.sort();
        v.into_iter().rev().take(n).map(|(_, n)| n).collect()
    }
    let mut keep = BTreeSet::new();
    keep.extend(newest_of_groups(all, ref_hour, 24));
    keep.extend(newest_of_groups(all, ref_ymd, 31));
    keep.extend(newest_of_groups(all, ref_week, usize::MAX));
    if let Some((_, n)) = all.iter().max() {
        keep.insert(n.clone());
    }
    keep.extend(held.iter().cloned());
    keep
}

/// What the daemon keeps between runs: the snapshot list and the last-run record.
#[derive(Default, Clone)]
struct State {
    snapshots: Vec<SnapshotEntry>,
    last_run: Option<i64>,
}

impl State {
    /// One scheduler tick: plan, then apply (take, then destroy the batch).
    fn tick(
        &mut self,
        p: &Policy,
        now: i64,
        cap: Option<&dyn Capacity>,
    ) -> (Option<String>, Vec<String>) {
        let pl = plan(
            p,
            Input {
                now,
                snapshots: &self.snapshots,
                last_run: self.last_run,
                force: false,
                take: true,
            },
            cap,
        );
        if let Some(c) = &pl.create {
            self.snapshots.push(SnapshotEntry {
                name: c.clone(),
                created: now,
                held: false,
            });
            self.last_run = Some(now);
        }
        let doomed: Vec<String> = pl.destroy.iter().map(|d| d.name.clone()).collect();
        self.snapshots.retain(|s| !doomed.contains(&s.name));
        (pl.create, doomed)
    }

    fn names(&self) -> BTreeSet<String> {
        self.snapshots.iter().map(|s| s.name.clone()).collect()
    }
}

fn t(s: &str) -> i64 {
    policy::time::parse_stamp(s).unwrap()
}

/// Europe's DST: local = UTC+2 from the last Sunday of March 01:00Z to the
/// last Sunday of October 01:00Z, else UTC+1 (what a Berlin admin sees).
fn berlin_offset(t: i64) -> i64 {
    let (y, _, _) = ref_ymd(t);
    let last_sunday = |month_end: &str| {
        let mut d = policy::time::parse_stamp(&format!("{y}-{month_end}T0100Z")).unwrap();
        while policy::time::civil(d).weekday != 6 {
            d -= DAY;
        }
        d
    };
    if t >= last_sunday("03-31") && t < last_sunday("10-31") {
        2 * HOUR
    } else {
        HOUR
    }
}

#[test]
fn a_year_of_time_machine_matches_the_reference() {
    let p = Policy::timemachine();
    let start = t("2026-01-01T0000Z");
    let end = start + 365 * DAY;
    let mut state = State::default();
    let mut taken: Vec<(i64, String)> = Vec::new();
    let mut held = BTreeSet::new();
    // A manual snapshot and one held early: neither is ever pruned.
    state.snapshots.push(SnapshotEntry {
        name: "before-upgrade".into(),
        created: start - 10,
        held: false,
    });
    let downtime = (t("2026-06-10T0300Z"), t("2026-06-10T1020Z"));
    let mut now = start;
    let mut checks = 0;
    while now < end {
        if now >= downtime.0 && now < downtime.1 {
            now += 20 * 60;
            continue;
        }
        if now == downtime.1 {
            // Restart: only the snapshot list (names, times, holds) and the
            // last-run record survive; catch-up is one snapshot, not seven.
            let saved = state.clone();
            state = State {
                snapshots: saved
                    .snapshots
                    .iter()
                    .map(|s| SnapshotEntry {
                        name: s.name.clone(),
                        created: s.created,
                        held: s.held,
                    })
                    .collect(),
                last_run: saved.last_run,
            };
        }
        let (created, destroyed) = state.tick(&p, now, None);
        if let Some(c) = created {
            if now != downtime.1 {
                assert_eq!(now % HOUR, 0, "{c} taken off the hour");
            }
            taken.push((now, c));
        } else {
            assert_ne!(
                now % HOUR,
                0,
                "no snapshot at {}",
                policy::time::display(now)
            );
        }
        for d in &destroyed {
            assert!(!held.contains(d) && d.starts_with("auto-"), "{d} pruned");
        }
        if taken.len() == 5 && !held.contains(&taken[4].1) {
            let name = taken[4].1.clone();
            state
                .snapshots
                .iter_mut()
                .find(|s| s.name == name)
                .unwrap()
                .held = true;
            held.insert(name);
        }
        if now % (97 * HOUR) == 0 || now + 20 * 60 >= end {
            let mut want = reference(&taken, &held);
            want.insert("before-upgrade".into());
            assert_eq!(state.names(), want, "at {}", policy::time::display(now));
            checks += 1;
        }
        now += 20 * 60;
    }
    assert!(checks > 80);
    // One catch-up snapshot at restart (10:20Z), none for 03:00..10:00.
    let in_downtime: Vec<_> = taken
        .iter()
        .filter(|(t, _)| *t > downtime.0 && *t <= downtime.1)
        .collect();
    assert_eq!(in_downtime.len(), 1, "{in_downtime:?}");
    assert_eq!(in_downtime[0].1, "auto-2026-06-10T1020Z");
    // Every name unique although local wall-clock hours repeat on 25 October.
    let names: BTreeSet<_> = taken.iter().map(|(_, n)| n).collect();
    assert_eq!(names.len(), taken.len());
    assert_eq!(taken.len(), 365 * 24 - 8 + 1);
    // What is left: 24 hourly + ~30 more daily + one per week + manual + held.
    let left = state.names().len();
    assert!((24 + 30 + 40..24 + 31 + 55).contains(&left), "{left} left");
}

#[test]
fn cron_rules_are_utc_and_cross_dst_once_a_day() {
    // "0 2 * * *" fires at 02:00Z every day: on the DST days too, never twice,
    // never skipped (in Berlin it is 03:00 or 04:00 local by season).
    let mut p = Policy::for_schedule("cron=0 2 * * *").unwrap();
    p.keep = policy::Keep::parse("daily=400").unwrap();
    let mut state = State::default();
    let (start, end) = (t("2026-03-01T0000Z"), t("2026-11-30T0000Z"));
    let mut now = start;
    let mut taken = Vec::new();
    while now < end {
        if let (Some(c), _) = state.tick(&p, now, None) {
            taken.push((now, c));
        }
        now += 10 * 60;
    }
    // A dataset with no automatic snapshot gets one at once, then one a day.
    assert_eq!(taken[0].0, start);
    let taken = &taken[1..];
    assert_eq!(taken.len() as i64, (end - start) / DAY);
    for (at, name) in taken {
        assert_eq!(at.rem_euclid(DAY), 2 * HOUR, "{name}");
    }
    let local: BTreeSet<i64> = taken
        .iter()
        .map(|(t, _)| (t + berlin_offset(*t)).rem_euclid(DAY) / HOUR)
        .collect();
    assert_eq!(local, BTreeSet::from([3, 4]));
    // The 00:00 one shares 1 March with the first 02:00 one: daily keeps the newest.
    assert_eq!(state.snapshots.len(), taken.len());
}

/// A pool where each automatic snapshot holds `unit` percent on its own.
struct FakePool {
    base: f64,
    unit: f64,
    sizes: BTreeMap<String, f64>,
}

impl Capacity for FakePool {
    fn percent_after(&self, destroyed: &[&str]) -> f64 {
        self.base
            + self
                .sizes
                .iter()
                .filter(|(n, _)| !destroyed.contains(&n.as_str()))
                .map(|(_, s)| s * self.unit)
                .sum::<f64>()
    }
}

#[test]
fn past_the_capacity_threshold_oldest_automatic_go_first() {
    let p = Policy::timemachine();
    let start = t("2026-01-01T0000Z");
    let mut state = State::default();
    for h in 0..24 * 40 {
        state.tick(&p, start + h * HOUR, None);
    }
    state.snapshots.push(SnapshotEntry {
        name: "manual".into(),
        created: start,
        held: false,
    });
    let oldest = state.snapshots[0].name.clone();
    state.snapshots[1].held = true;
    let held = state.snapshots[1].name.clone();
    let before = state.names();
    let autos: Vec<String> = state
        .snapshots
        .iter()
        .filter(|s| s.name.starts_with("auto-"))
        .map(|s| s.name.clone())
        .collect();
    // 60% base, 1% per automatic snapshot (with the new one): far past 80%.
    let mut pool = FakePool {
        base: 60.0,
        unit: 1.0,
        sizes: autos.iter().map(|n| (n.clone(), 1.0)).collect(),
    };
    let now = start + 24 * 40 * HOUR;
    pool.sizes
        .insert(format!("auto-{}", policy::time::stamp(now, false)), 1.0);
    let (_, destroyed) = state.tick(&p, now, Some(&pool));
    let destroyed_refs: Vec<&str> = destroyed.iter().map(String::as_str).collect();
    assert!(pool.percent_after(&destroyed_refs) <= 80.0);
    assert!(
        pool.percent_after(&destroyed_refs[1..]) > 80.0,
        "pruned more than needed"
    );
    assert!(destroyed.contains(&oldest));
    assert!(state.names().contains(&held) && state.names().contains("manual"));
    // Oldest first: everything destroyed is older than everything kept (held aside).
    let newest_destroyed = destroyed.iter().max().unwrap();
    for kept in state
        .names()
        .iter()
        .filter(|n| n.starts_with("auto-") && **n != held)
    {
        assert!(
            kept > newest_destroyed,
            "{kept} kept but {newest_destroyed} destroyed"
        );
    }
    assert!(before.len() > state.names().len());
}

#[test]
fn manual_and_held_snapshots_are_never_pruned_and_names_never_collide() {
    let mut p = Policy::for_schedule("frequently=5").unwrap();
    p.keep = policy::Keep::parse("last=2").unwrap();
    let start = t("2026-11-22T1400Z");
    let mut state = State::default();
    state.snapshots.push(SnapshotEntry {
        name: "mine".into(),
        created: start - 100,
        held: false,
    });
    state.snapshots.push(SnapshotEntry {
        name: "auto-odd".into(),
        created: start - 50,
        held: true,
    });
    for m in 0..30 {
        state.tick(&p, start + m * 60, None);
    }
    let names = state.names();
    assert!(
        names.contains("mine") && names.contains("auto-odd"),
        "{names:?}"
    );
    assert_eq!(names.len(), 4, "{names:?}");
    // A forced run in a minute that already has a snapshot adds seconds.
    let now = start + 25 * 60 + 7;
    let pl = plan(
        &p,
        Input {
            now,
            snapshots: &state.snapshots,
            last_run: state.last_run,
            force: true,
            take: true,
        },
        None,
    );
    assert_eq!(pl.create.as_deref(), Some("auto-2026-11-22T142507Z"));
    assert!(pl.destroy.iter().all(|d| d.reasons == ["no rule keeps it"]));
    assert_eq!(pl.manual, ["mine"]);
    // Not due and not forced: nothing to take, a reason why.
    let pl = plan(
        &p,
        Input {
            now: start + 25 * 60 + 30,
            snapshots: &state.snapshots,
            last_run: state.last_run,
            force: false,
            take: true,
        },
        None,
    );
    assert!(
        pl.create.is_none() && pl.create_reason.starts_with("not due"),
        "{}",
        pl.create_reason
    );
    assert_eq!(
        Schedule::parse("frequently=5").unwrap().next_after(now),
        Some(start + 30 * 60)
    );
}
