//! Dataset records and properties, inherited down the tree as in ZFS.

use crate::{DatasetKind, Error, Property, Result};
use block::{ChecksumAlgo, Compression};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Properties a user may set; everything else is a read-only statistic.
pub const SETTABLE: &[&str] = &[
    "compression",
    "checksum",
    "readonly",
    "volsize",
    "quota",
    "refquota",
    "reservation",
    "refreservation",
    "recordsize",
    "atime",
    "xattr",
    "acltype",
    "snapdir",
    "mountpoint",
    "sharenfs",
    "sharesmb",
    "timemachine",
    "tm_max_size",
];
/// Filesystem properties fixed when the dataset is created (as zfs).
pub const CREATE_ONLY: &[&str] = &["casesensitivity", "normalization", "utf8only"];
/// Space limits (crate::space): a size, or `none` (refreservation also `auto`: the volume's size).
pub const LIMITS: &[&str] = &["quota", "refquota", "reservation", "refreservation"];
/// Properties children inherit from their parent when not set locally.
pub(crate) const INHERITABLE: &[&str] = &[
    "compression",
    "checksum",
    "readonly",
    "recordsize",
    "atime",
    "xattr",
    "acltype",
    "snapdir",
    "mountpoint",
    "sharenfs",
    "sharesmb",
    "timemachine",
    "tm_max_size",
];
/// Inheritable properties only filesystems show (`zfs get all` of a volume has none of them).
pub(crate) const FILESYSTEM_ONLY: &[&str] = &[
    "atime",
    "xattr",
    "acltype",
    "snapdir",
    "mountpoint",
    "sharenfs",
    "sharesmb",
    "timemachine",
    "tm_max_size",
];
/// Snapshot automation (`autosnap.rs`): a named policy, or a schedule with
/// the default retention grid. Engine properties until user properties
/// (`module:name`) exist; `autosnap::policy_props` is the one reader.
pub const SNAPSHOT_POLICY: &str = "snapshot:policy";
pub const SNAPSHOT_SCHEDULE: &str = "snapshot:schedule";
/// NBD access by client certificate (decision 0025): `CN[:ro],...`, or
/// `none`. A user property (inherited, `cistern inherit` clears it) whose
/// value is checked when set; [`parse_nbd_clients`] is the one reader.
pub const NBD_CLIENTS: &str = "nbd:clients";
/// The longest CN X.509 allows (ub-common-name) and the most entries.
const MAX_CN_LEN: usize = 64;
const MAX_NBD_CLIENTS: usize = 256;

/// One grant of `nbd:clients`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdClient {
    pub common_name: String,
    pub read_only: bool,
}

/// `nbd:clients`: None for `none` or unset (`-`: anyone may open the
/// export), else the certificate CNs that may, each `:ro` (read-only) or
/// `:rw` (the default).
pub fn parse_nbd_clients(value: &str) -> std::result::Result<Option<Vec<NbdClient>>, String> {
    let value = value.trim();
    if value == "none" || value == "-" {
        return Ok(None);
    }
    let mut out: Vec<NbdClient> = Vec::new();
    for entry in value.split(',') {
        let entry = entry.trim();
        let (cn, read_only) = match entry.rsplit_once(':') {
            Some((cn, "ro")) => (cn.trim(), true),
            Some((cn, "rw")) => (cn.trim(), false),
            _ => (entry, false),
        };
        if cn.is_empty() {
            return Err("empty client name (expected CN[:ro],CN[:ro],...)".into());
        }
        if cn.len() > MAX_CN_LEN {
            return Err(format!(
                "client name '{cn}' is longer than {MAX_CN_LEN} bytes"
            ));
        }
        if cn.chars().any(|c| c.is_control()) {
            return Err("client names cannot hold control characters".into());
        }
        if out.iter().any(|c| c.common_name == cn) {
            return Err(format!("client '{cn}' is listed twice"));
        }
        if out.len() == MAX_NBD_CLIENTS {
            return Err(format!("more than {MAX_NBD_CLIENTS} clients"));
        }
        out.push(NbdClient {
            common_name: cn.to_string(),
            read_only,
        });
    }
    Ok(Some(out))
}
pub const DEFAULT_VOLBLOCKSIZE: u32 = 16 << 10;

/// What the metadata store keeps per dataset (JSON in the DATASETS table).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DatasetRecord {
    pub id: u64,
    pub name: String,
    pub kind: DatasetKind,
    /// Volumes only.
    pub volsize: u64,
    pub volblocksize: u32,
    /// Locally set properties (name -> value as the user wrote it, normalized).
    pub local: BTreeMap<String, String>,
    pub created_txg: u64,
    /// Unix seconds.
    pub creation: u64,
    /// Sum of logical sizes of live blocks.
    pub logical_used: u64,
    /// Sum of allocated sizes of live blocks in the dataset's own block map.
    /// For a snapshot: what its dataset referenced at the snapshot.
    pub physical_used: u64,
    /// Clones: allocated/logical bytes of origin blocks the clone still sees
    /// (not yet overwritten). REFER = physical_used + inherited.
    #[serde(default)]
    pub inherited: u64,
    #[serde(default)]
    pub inherited_logical: u64,
    /// Allocated bytes kept only for snapshots: the sum of the dead lists.
    #[serde(default)]
    pub snapshot_used: u64,
    /// Allocated bytes of live blocks born after the newest snapshot (for a
    /// snapshot: born after the one before it) - zfs `written`.
    #[serde(default)]
    pub written: u64,
    /// Clones: the snapshot whose blocks this dataset starts from.
    #[serde(default)]
    pub origin: Option<Origin>,
    /// Snapshots: the dataset (block namespace) they belong to.
    #[serde(default)]
    pub snapshot_of: Option<u64>,
    /// Snapshots: user holds (`cistern hold TAG SNAP`); a held snapshot cannot be destroyed.
    #[serde(default)]
    pub holds: std::collections::BTreeSet<String>,
    /// Buckets and filesystems: the next object id to hand out (0: none
    /// handed out yet). Clones and snapshots carry their origin's.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_object: u64,
    /// Encrypted datasets (decision 0026); absent on plain ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crypt: Option<Box<crate::crypt::CryptRecord>>,
    /// A receive in progress into this dataset (decision 0033); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive: Option<Box<crate::send::ReceiveState>>,
    /// Bookmarks of this dataset by short name (decision 0040); absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bookmarks: BTreeMap<String, crate::send::bookmark::Bookmark>,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Where a clone's blocks come from until it overwrites them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    /// The origin dataset's id (its block namespace).
    pub dataset: u64,
    /// The origin snapshot's txg: the clone sees versions born at or before it.
    pub txg: u64,
    /// The origin snapshot's record id.
    pub snapshot: u64,
}

impl DatasetRecord {
    pub fn is_snapshot(&self) -> bool {
        self.kind == DatasetKind::Snapshot
    }

    /// The id of the block map this record reads: its own, or its dataset's for a snapshot.
    pub fn data_id(&self) -> u64 {
        self.snapshot_of.unwrap_or(self.id)
    }

    /// Refuses to destroy a snapshot that has user holds.
    pub fn check_not_held(&self) -> Result<()> {
        if self.holds.is_empty() {
            return Ok(());
        }
        Err(Error::Busy(format!(
            "snapshot '{}' is held ({}): release it first",
            self.name,
            self.holds.iter().cloned().collect::<Vec<_>>().join(", ")
        )))
    }

    /// The dataset part of a snapshot name (`tank/vm0` of `tank/vm0@a`).
    pub fn dataset_name(&self) -> &str {
        self.name.split_once('@').map_or(&self.name, |(d, _)| d)
    }
}

fn default_of(prop: &str) -> &'static str {
    match prop {
        "compression" => "lz4",
        "checksum" => "blake3",
        "readonly" => "off",
        "recordsize" => "128K",
        "atime" | "xattr" => "on",
        "acltype" => "off",
        "snapdir" => "hidden",
        // A user-space daemon mounts only where it is told to (decision 0020).
        "mountpoint" => "none",
        "sharenfs" | "sharesmb" | "timemachine" => "off",
        "tm_max_size" => "none",
        "casesensitivity" => "sensitive",
        "normalization" => "none",
        "utf8only" => "off",
        _ => "-",
    }
}

/// Refuses filesystem properties on a volume or bucket.
pub fn check_kind(prop: &str, kind: DatasetKind) -> Result<()> {
    if (FILESYSTEM_ONLY.contains(&prop) || CREATE_ONLY.contains(&prop))
        && kind != DatasetKind::Filesystem
    {
        return Err(Error::InvalidArgument(format!(
            "property '{prop}' is for filesystems only"
        )));
    }
    Ok(())
}

/// Checks and normalizes a value for a settable or create-time property.
pub fn normalize(prop: &str, value: &str) -> Result<String> {
    // The policy properties are user properties (`module:name`) whose values are checked.
    if crate::names::is_user_property(prop)
        && prop != SNAPSHOT_POLICY
        && prop != SNAPSHOT_SCHEDULE
        && prop != NBD_CLIENTS
    {
        crate::names::check_user_value(prop, value)?;
        return Ok(value.to_string());
    }
    let bad = |why: String| {
        Error::InvalidArgument(format!("bad value '{value}' for property {prop}: {why}"))
    };
    match prop {
        "compression" => value
            .parse::<Compression>()
            .map(|c| c.to_string())
            .map_err(|e| bad(e.to_string())),
        "checksum" => value
            .parse::<ChecksumAlgo>()
            .map(|c| c.to_string())
            .map_err(bad),
        "readonly" | "atime" | "timemachine" | "utf8only" => match value {
            "on" | "off" => Ok(value.to_string()),
            _ => Err(bad("expected on or off".into())),
        },
        // zfs's `sa` and `dir` both mean "xattrs on" here: they are always stored with the inode.
        "xattr" => match value {
            "on" | "sa" | "dir" => Ok("on".into()),
            "off" => Ok(value.to_string()),
            _ => Err(bad("expected on, sa, dir or off".into())),
        },
        "acltype" => match value {
            "off" | "noacl" => Ok("off".into()),
            "posix" | "posixacl" => Ok("posix".into()),
            _ => Err(bad("expected off or posix".into())),
        },
        "snapdir" => match value {
            "hidden" | "visible" => Ok(value.to_string()),
            _ => Err(bad("expected hidden or visible".into())),
        },
        "casesensitivity" => match value {
            "sensitive" | "insensitive" | "mixed" => Ok(value.to_string()),
            _ => Err(bad("expected sensitive, insensitive or mixed".into())),
        },
        "normalization" => match value {
            "none" | "formC" | "formD" | "formKC" | "formKD" => Ok(value.to_string()),
            _ => Err(bad("expected none, formC, formD, formKC or formKD".into())),
        },
        "mountpoint" => match value {
            "none" | "legacy" => Ok(value.to_string()),
            v if v.starts_with('/') && !v.contains('\0') && v.len() <= 1024 => {
                let trimmed = v.trim_end_matches('/');
                Ok(if trimmed.is_empty() { "/" } else { trimmed }.to_string())
            }
            _ => Err(bad("expected an absolute path, none or legacy".into())),
        },
        // `on`, `off`, or share options (NFS: `rw=HOSTS,ro=HOSTS,root_squash`; SMB: ignored
        // beyond on/off); checked when the share is made so a typo is reported there.
        "sharenfs" | "sharesmb" => {
            if value.is_empty() || value.len() > 1024 || value.chars().any(|c| c.is_control()) {
                Err(bad("expected on, off or share options".into()))
            } else {
                Ok(value.to_string())
            }
        }
        "tm_max_size" if value == "none" || value == "0" => Ok("none".into()),
        "tm_max_size" => {
            let n = parse_size(value).map_err(|e| bad(e.reason.into()))?;
            Ok(format_size(n))
        }
        "recordsize" => {
            let n = parse_size(value).map_err(|e| bad(e.reason.into()))?;
            validate_recordsize(n).map(|n| format_size(n as u64))
        }
        p if LIMITS.contains(&p) && (value == "none" || value == "0") => Ok("none".into()),
        "refreservation" if value == "auto" => Ok("auto".into()),
        "volsize" | "volblocksize" | "quota" | "refquota" | "reservation" | "refreservation" => {
            let n = parse_size(value).map_err(|e| bad(e.reason.into()))?;
            Ok(n.to_string())
        }
        SNAPSHOT_POLICY => {
            // Whether the name exists is the daemon's config's business
            // (`cistern policy show` reports an unknown one).
            let ok = value == "none"
                || (value
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic())
                    && value.len() <= 100
                    && value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c)));
            if ok {
                Ok(value.to_string())
            } else {
                Err(bad("expected a policy name or none".into()))
            }
        }
        NBD_CLIENTS => match parse_nbd_clients(value).map_err(bad)? {
            None => Ok("none".into()),
            Some(list) => Ok(list
                .iter()
                .map(|c| {
                    if c.read_only {
                        format!("{}:ro", c.common_name)
                    } else {
                        c.common_name.clone()
                    }
                })
                .collect::<Vec<_>>()
                .join(",")),
        },
        SNAPSHOT_SCHEDULE if value == "none" => Ok(value.to_string()),
        SNAPSHOT_SCHEDULE => policy::Schedule::parse(value)
            .map(|s| s.to_string())
            .map_err(|e| bad(e.to_string())),
        _ => Err(Error::InvalidArgument(format!(
            "unknown or read-only property '{prop}'"
        ))),
    }
}

/// ZFS's range: a power of two from 512 bytes to 1M.
pub fn validate_recordsize(n: u64) -> Result<u32> {
    if !(512..=1 << 20).contains(&n) || !n.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "recordsize {n} must be a power of two from 512 to 1M"
        )));
    }
    Ok(n as u32)
}

pub fn validate_volblocksize(n: u64) -> Result<u32> {
    if !(4096..=131072).contains(&n) || !n.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "volblocksize {n} must be a power of two from 4K to 128K"
        )));
    }
    Ok(n as u32)
}

// The size parser lives in the lowest crate that reads sizes from the config
// (`vdev`, for `[bucket]`); re-exported here for the object layer and above.
pub use vdev::size::{de_size, parse_size, SizeError};

/// ZFS-style human size: 512, 4K, 1.50G, 10G.
pub fn format_size(n: u64) -> String {
    const UNITS: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n}B")
    } else if v >= 100.0 || (v - v.round()).abs() < 0.005 {
        format!("{:.0}{}", v, UNITS[u])
    } else if v >= 10.0 {
        format!("{:.1}{}", v, UNITS[u])
    } else {
        format!("{:.2}{}", v, UNITS[u])
    }
}

/// Unix seconds as `zfs get creation` shows them: "Sat Nov 21 05:57 2026" (UTC).
pub fn format_time(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = secs / 86400;
    let (hh, mm) = ((secs % 86400) / 3600, (secs % 3600) / 60);
    let (year, month, day) = policy::time::civil_from_days(days as i64);
    format!(
        "{} {} {:2} {hh:02}:{mm:02} {year}",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        day
    )
}

/// Writes the name rules (`CREATE_ONLY`) a new filesystem gets from `from`
/// (its parent, or a clone's origin) into its own properties, unless it sets
/// them itself: its names are made under them, so they must not change
/// when it is renamed under another parent, and a clone's are its origin's.
pub(crate) fn pin_create_only(from: &Lineage, local: &mut BTreeMap<String, String>) {
    for prop in CREATE_ONLY {
        let (value, source) = from.resolve(prop);
        if source != "default" {
            local.entry(prop.to_string()).or_insert(value);
        }
    }
}

/// The chain from a dataset up to its pool's root, nearest first.
pub struct Lineage<'a> {
    pub chain: Vec<&'a DatasetRecord>,
}

impl Lineage<'_> {
    /// Effective value and its source for an inheritable property.
    pub fn resolve(&self, prop: &str) -> (String, String) {
        for (i, rec) in self.chain.iter().enumerate() {
            if let Some(v) = rec.local.get(prop) {
                let source = if i == 0 {
                    "local".to_string()
                } else {
                    format!("inherited from {}", rec.name)
                };
                return (v.clone(), source);
            }
        }
        (default_of(prop).to_string(), "default".to_string())
    }

    pub fn compression(&self) -> Compression {
        self.resolve("compression")
            .0
            .parse()
            .unwrap_or(Compression::Lz4)
    }

    pub fn checksum(&self) -> ChecksumAlgo {
        self.resolve("checksum")
            .0
            .parse()
            .unwrap_or(ChecksumAlgo::Blake3)
    }

    pub fn readonly(&self) -> bool {
        self.resolve("readonly").0 == "on"
    }

    /// Where the filesystem is mounted: `mountpoint` set here, or an
    /// ancestor's with the rest of the name appended (as zfs); `None` for
    /// `none`/`legacy`.
    pub fn mountpoint(&self) -> Option<std::path::PathBuf> {
        for rec in &self.chain {
            if let Some(v) = rec.local.get("mountpoint") {
                if !v.starts_with('/') {
                    return None;
                }
                let here = self.chain.first()?.dataset_name();
                let suffix = here.strip_prefix(rec.dataset_name()).unwrap_or("");
                let mut p = std::path::PathBuf::from(v);
                for part in suffix.split('/').filter(|s| !s.is_empty()) {
                    p.push(part);
                }
                return Some(p);
            }
        }
        None
    }

    /// Block size of new objects (buckets, filesystems).
    pub fn recordsize(&self) -> u32 {
        parse_size(&self.resolve("recordsize").0)
            .ok()
            .and_then(|n| validate_recordsize(n).ok())
            .unwrap_or(128 << 10)
    }
}

impl Lineage<'_> {
    /// User properties (`module:name`) set here or on an ancestor, by name,
    /// with their source (`local`, `inherited from X`).
    pub fn user_properties(&self) -> Vec<Property> {
        let names: std::collections::BTreeSet<&String> = self
            .chain
            .iter()
            .flat_map(|r| r.local.keys())
            .filter(|k| crate::names::is_user_property(k))
            .collect();
        names
            .into_iter()
            .map(|n| {
                let (value, source) = self.resolve(n);
                Property {
                    name: n.clone(),
                    parsable: value.clone(),
                    value,
                    source,
                }
            })
            .collect()
    }
}

/// Space figures of a dataset including its children.
#[derive(Debug, Clone, Copy, Default)]
pub struct Space {
    pub used: u64,
    pub logical_used: u64,
    pub referenced: u64,
    pub logical_referenced: u64,
    pub available: u64,
    /// Held only by snapshots (`usedbysnapshots`).
    pub snapshots: u64,
    /// Written since the newest snapshot (for a snapshot: since the one before).
    pub written: u64,
    pub compressratio: f64,
    /// usedbydataset, usedbychildren, usedbyrefreservation (crate::space).
    pub usedby: crate::space::Figures,
}

pub fn ratio(logical: u64, physical: u64) -> f64 {
    if physical == 0 {
        1.0
    } else {
        ((logical as f64 / physical as f64) * 100.0).floor() / 100.0
    }
}

/// All properties in `get all` order.
pub fn properties(rec: &DatasetRecord, lineage: &Lineage<'_>, space: Space) -> Vec<Property> {
    let stat = |name: &str, value: String, parsable: String| Property {
        name: name.into(),
        value,
        parsable,
        source: "-".into(),
    };
    let bytes = |name: &str, n: u64| stat(name, format_size(n), n.to_string());
    let mut out = vec![
        {
            let kind = match rec.kind {
                DatasetKind::Volume => "volume",
                DatasetKind::Filesystem => "filesystem",
                DatasetKind::Snapshot => "snapshot",
                DatasetKind::Bucket => "bucket",
            };
            stat("type", kind.into(), kind.into())
        },
        stat(
            "creation",
            format_time(rec.creation),
            rec.creation.to_string(),
        ),
        bytes("used", space.used),
        bytes("referenced", space.referenced),
        {
            let r = space.compressratio;
            stat("compressratio", format!("{r:.2}x"), format!("{r:.2}"))
        },
    ];
    if !rec.is_snapshot() {
        // A snapshot has no space of its own to offer (zfs shows "-").
        out.insert(3, bytes("available", space.available));
        out.push(bytes("usedbysnapshots", space.snapshots));
        out.push(bytes("usedbydataset", space.usedby.dataset));
        out.push(bytes("usedbychildren", space.usedby.children));
        out.push(bytes("usedbyrefreservation", space.usedby.refreservation));
        for prop in LIMITS {
            let n = crate::space::limit(rec, prop);
            out.push(Property {
                name: (*prop).into(),
                value: if n == 0 {
                    "none".into()
                } else {
                    format_size(n)
                },
                parsable: n.to_string(),
                source: if n == 0 { "default" } else { "local" }.into(),
            });
        }
    }
    out.push(bytes("written", space.written));
    if rec.volblocksize != 0 {
        out.push(Property {
            name: "volsize".into(),
            value: format_size(rec.volsize),
            parsable: rec.volsize.to_string(),
            source: "local".into(),
        });
        out.push(Property {
            name: "volblocksize".into(),
            value: format_size(rec.volblocksize as u64),
            parsable: rec.volblocksize.to_string(),
            source: if rec.volblocksize == DEFAULT_VOLBLOCKSIZE {
                "default".into()
            } else {
                "local".into()
            },
        });
    }
    for prop in INHERITABLE {
        // A volume's block size is volblocksize (zfs shows no recordsize there).
        let volume = rec.volblocksize != 0;
        if (*prop == "recordsize" || FILESYSTEM_ONLY.contains(prop)) && volume {
            continue;
        }
        if FILESYSTEM_ONLY.contains(prop) && rec.kind != DatasetKind::Filesystem {
            continue;
        }
        let (value, source) = match *prop {
            "readonly" if rec.is_snapshot() => ("on".to_string(), "-".to_string()),
            "mountpoint" => {
                let (v, source) = lineage.resolve(prop);
                let shown = lineage
                    .mountpoint()
                    .map_or(v, |m| m.to_string_lossy().into_owned());
                (shown, source)
            }
            _ => lineage.resolve(prop),
        };
        out.push(Property {
            name: (*prop).into(),
            parsable: value.clone(),
            value,
            source,
        });
    }
    if rec.kind == DatasetKind::Filesystem {
        for prop in CREATE_ONLY {
            let (value, source) = lineage.resolve(prop);
            out.push(Property {
                name: (*prop).into(),
                parsable: value.clone(),
                value,
                source: if source == "default" {
                    source
                } else {
                    "-".into()
                },
            });
        }
    }
    out.push(bytes("logicalused", space.logical_used));
    out.push(bytes("logicalreferenced", space.logical_referenced));
    out.push(stat(
        "createtxg",
        rec.created_txg.to_string(),
        rec.created_txg.to_string(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print_like_zfs() {
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("16K"), Ok(16384));
        assert_eq!(parse_size("16k"), Ok(16384));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        for bad in ["", "G", "1X", "-1G", "1.2.3K", "99999999999999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(format_size(512), "512B");
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(16384), "16K");
        assert_eq!(format_size(3 << 29), "1.50G");
        assert_eq!(format_size(10 << 30), "10G");
    }

    #[test]
    fn creation_times_read_like_zfs() {
        assert_eq!(format_time(0), "Thu Jan  1 00:00 1970");
        assert_eq!(format_time(1_795_240_643), "Sat Nov 21 05:57 2026");
    }

    #[test]
    fn nbd_clients_are_checked() {
        assert_eq!(
            normalize(NBD_CLIENTS, " alice , bob:ro,carol:rw ").unwrap(),
            "alice,bob:ro,carol"
        );
        assert_eq!(normalize(NBD_CLIENTS, "none").unwrap(), "none");
        assert_eq!(
            parse_nbd_clients("host:1:ro").unwrap().unwrap(),
            vec![NbdClient {
                common_name: "host:1".into(),
                read_only: true
            }]
        );
        for bad in ["", "a,,b", "a,a:ro", ":ro", &"x".repeat(65), "a\tb"] {
            assert!(normalize(NBD_CLIENTS, bad).is_err(), "{bad:?}");
        }
        assert!(parse_nbd_clients("-").unwrap().is_none());
    }

    #[test]
    fn records_without_user_properties_load() {
        // A record as builds before user properties wrote it.
        let old = r#"{"id":3,"name":"tank/v","kind":"volume","volsize":67108864,"volblocksize":16384,
            "local":{"compression":"zstd"},"created_txg":5,"creation":1795240643,
            "logical_used":0,"physical_used":0}"#;
        let rec: DatasetRecord = serde_json::from_str(old).unwrap();
        let root = DatasetRecord {
            name: "tank".into(),
            local: [("com.example:note".to_string(), "hi".to_string())].into(),
            ..Default::default()
        };
        let lineage = Lineage {
            chain: vec![&rec, &root],
        };
        assert_eq!(lineage.resolve("compression").0, "zstd");
        let user = lineage.user_properties();
        assert_eq!(user.len(), 1);
        assert_eq!(
            (user[0].value.as_str(), user[0].source.as_str()),
            ("hi", "inherited from tank")
        );
        // And one with a user property reads back the same.
        let json = serde_json::to_string(&root).unwrap();
        assert_eq!(serde_json::from_str::<DatasetRecord>(&json).unwrap(), root);
    }

    #[test]
    fn property_values_are_checked() {
        assert_eq!(normalize("compression", "zstd-3").unwrap(), "zstd");
        assert_eq!(normalize("compression", "on").unwrap(), "lz4");
        assert!(normalize("compression", "zstd-42").is_err());
        assert!(normalize("readonly", "yes").is_err());
        assert!(normalize("used", "1G").is_err());
        assert_eq!(normalize("quota", "1G").unwrap(), (1u64 << 30).to_string());
        assert_eq!(normalize("refreservation", "0").unwrap(), "none");
        assert_eq!(normalize("refreservation", "auto").unwrap(), "auto");
        assert!(normalize("quota", "auto").is_err());
        assert!(validate_volblocksize(3000).is_err());
        assert!(validate_volblocksize(256 << 10).is_err());
        assert_eq!(validate_volblocksize(8192).unwrap(), 8192);
    }
}
