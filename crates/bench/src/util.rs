//! Small parsers and helpers shared by the bench commands: sizes ("4K",
//! "1G"), durations ("30s", "2m"), timestamps, output paths.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

/// Parses a byte size: a number with an optional binary unit
/// (`K`/`KiB`/`KB` = 1024, `M`, `G`, `T`; case-insensitive; `B` allowed).
pub fn parse_size(s: &str) -> anyhow::Result<u64> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("size {s:?}: expected a number, e.g. 4K or 1G");
    }
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => bail!("size {s:?}: unknown unit {unit:?} (use K, M, G or T)"),
    };
    if num.contains('.') {
        let v: f64 = num.parse().with_context(|| format!("size {s:?}"))?;
        let bytes = v * mult as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            bail!("size {s:?} out of range");
        }
        Ok(bytes.round() as u64)
    } else {
        let v: u64 = num.parse().with_context(|| format!("size {s:?}"))?;
        v.checked_mul(mult)
            .with_context(|| format!("size {s:?} out of range"))
    }
}

/// Parses a duration: a number with an optional unit `ms`, `s` (default),
/// `m`, `h`.
pub fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        bail!("duration {s:?}: expected a number, e.g. 30s or 2m");
    }
    let v: f64 = num.parse().with_context(|| format!("duration {s:?}"))?;
    let secs = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => v / 1000.0,
        "" | "s" | "sec" | "secs" => v,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        u => bail!("duration {s:?}: unknown unit {u:?} (use ms, s, m or h)"),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        bail!("duration {s:?} out of range");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Human form of a byte count with a binary unit.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Human form of a latency in nanoseconds.
pub fn fmt_ns(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.2} s", ns / 1e9)
    } else if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

/// Seconds since the epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// UTC civil date and time from seconds since the epoch (H. Hinnant's algorithm).
fn civil(secs: u64) -> (i64, u32, u32, u32, u32, u32) {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// RFC 3339 UTC timestamp, e.g. `2026-11-21T05:36:00Z`.
pub fn rfc3339(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Compact UTC timestamp for file names, e.g. `20261121T053600Z`.
pub fn stamp(secs: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(secs);
    format!("{y:04}{mo:02}{d:02}T{h:02}{mi:02}{s:02}Z")
}

/// Keeps letters, digits, `-`, `_` and `.`; everything else becomes `_`.
pub fn sanitize_label(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let out = out.trim_matches(|c| c == '_' || c == '.').to_string();
    if out.is_empty() {
        "run".to_string()
    } else {
        out
    }
}

/// The output directory (created if missing); the current directory by default.
pub fn out_dir(out: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating output directory {}", dir.display()))?;
    Ok(dir)
}

/// `dir/stem.ext`, or `dir/stem-2.ext`, `-3`... if that exists: never
/// overwrites an earlier result.
pub fn unique_path(dir: &Path, stem: &str, ext: &str) -> PathBuf {
    let first = dir.join(format!("{stem}.{ext}"));
    if !first.exists() {
        return first;
    }
    for i in 2.. {
        let p = dir.join(format!("{stem}-{i}.{ext}"));
        if !p.exists() {
            return p;
        }
    }
    unreachable!("unbounded loop returns")
}

/// Writes a file in one go, with the path in the error.
pub fn write_file(path: &Path, contents: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert!(parse_size("x").is_err());
        assert!(parse_size("4Q").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("30").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("3 parsecs").is_err());
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(stamp(1_700_000_000), "20231114T221320Z");
    }
}
