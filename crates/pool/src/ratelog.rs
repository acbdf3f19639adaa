//! Rate-limited, summarizing log lines for events that can repeat per block
//! (a heal, a read error, a failing commit): the first occurrence of an
//! event for a given subject (pool, device) is logged at once; later ones
//! within the interval are only counted, and the next line logged for that
//! subject says how many were left out. One line per subject per interval,
//! never one per block.

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Subjects remembered at once; the oldest is forgotten past this (bounded memory).
const MAX_SUBJECTS: usize = 256;

pub struct RateLog {
    interval: Duration,
    /// (subject, last logged, events counted since).
    seen: Mutex<Vec<(String, Instant, u64)>>,
}

impl RateLog {
    pub const fn new(interval: Duration) -> RateLog {
        RateLog {
            interval,
            seen: Mutex::new(Vec::new()),
        }
    }

    /// Counts one event for `subject`. `Some(n)`: log it now, `n` events of
    /// this subject were left out since the last line; `None`: stay quiet.
    pub fn admit(&self, subject: &str) -> Option<u64> {
        let now = Instant::now();
        let mut seen = self.seen.lock();
        if let Some(e) = seen.iter_mut().find(|e| e.0 == subject) {
            if now.duration_since(e.1) < self.interval {
                e.2 += 1;
                return None;
            }
            let skipped = e.2;
            e.1 = now;
            e.2 = 0;
            return Some(skipped);
        }
        if seen.len() >= MAX_SUBJECTS {
            seen.remove(0);
        }
        seen.push((subject.to_string(), now, 0));
        Some(0)
    }

    /// Forgets `subject`: its next event is logged at once (after a recovery).
    pub fn reset(&self, subject: &str) {
        self.seen.lock().retain(|e| e.0 != subject);
    }
}

/// Device events of the pool layer (heals, faults): one line per device and
/// kind of event per minute.
pub static DEVICE_EVENTS: RateLog = RateLog::new(Duration::from_secs(60));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_subject_per_interval_with_the_count_left_out() {
        let log = RateLog::new(Duration::from_millis(200));
        assert_eq!(log.admit("heal d0"), Some(0));
        for _ in 0..1000 {
            assert_eq!(log.admit("heal d0"), None);
        }
        assert_eq!(
            log.admit("heal d1"),
            Some(0),
            "another subject is not held back"
        );
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(log.admit("heal d0"), Some(1000));
        log.reset("heal d0");
        assert_eq!(log.admit("heal d0"), Some(0));
    }
}
