//! Byte sizes as the CLI and the config take them (`512`, `4K`, `1.5G`).
//!
//! Lives here, the lowest crate that parses sizes from the config
//! (`[bucket] cache_bytes`); `dataset::props` re-exports it.

/// Serde field helper for byte sizes in config files: an integer, or a
/// string as the CLI takes (`"128M"`, `"1.5G"`).
pub fn de_size<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    struct V;
    impl serde::de::Visitor<'_> for V {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a byte count: an integer or a size such as \"128M\"")
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("invalid size {v}: negative")))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<u64, E> {
            parse_size(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

/// Why a size string was refused; names the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeError {
    pub value: String,
    pub reason: &'static str,
}

impl std::fmt::Display for SizeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "invalid size '{}': {} (expected a number with an optional K, M, G, T, P or E suffix, e.g. 512, 4K, 1.5G)",
            self.value, self.reason
        )
    }
}

impl std::error::Error for SizeError {}

/// Parses a size like zfs does: `512`, `4K`, `16k`, `10M`, `1.5G`, `2T`,
/// binary units, case-insensitive, with an optional `B` or `iB` suffix.
/// Fractions are allowed with a unit; the result is rounded down to a byte.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        value: s.to_string(),
        reason,
    };
    let t = s.trim();
    if t.is_empty() {
        return Err(err("empty"));
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    if num.is_empty() {
        return Err(err(if t.starts_with('-') {
            "negative"
        } else {
            "no number"
        }));
    }
    let suffix = suffix.trim_start().to_ascii_lowercase();
    let shift: u32 = match suffix.as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        "e" | "eb" | "eib" => 60,
        _ => return Err(err("unknown unit")),
    };
    let (int_part, frac_part) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if frac_part.contains('.') {
        return Err(err("not a number"));
    }
    if int_part.is_empty() && frac_part.is_empty() {
        return Err(err("not a number"));
    }
    if frac_part.len() > 18 {
        return Err(err("too many decimals"));
    }
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().map_err(|_| err("too large"))?
    };
    let frac: u128 = if frac_part.is_empty() {
        0
    } else {
        frac_part.parse().map_err(|_| err("not a number"))?
    };
    if frac != 0 && shift == 0 {
        return Err(err("fractional bytes"));
    }
    let unit: u128 = 1u128 << shift;
    let scale = 10u128.pow(frac_part.len() as u32);
    let total = int
        .checked_mul(unit)
        .and_then(|v| v.checked_add(frac * unit / scale))
        .ok_or_else(|| err("too large"))?;
    u64::try_from(total).map_err(|_| err("too large"))
}

/// Serde field helper for an optional byte size (`cache_bytes = "64M"`).
pub fn de_opt_size<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<u64>, D::Error> {
    de_size(d).map(Some)
}
