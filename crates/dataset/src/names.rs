//! Names as ZFS spells them: pools, datasets, snapshots (zfs_namecheck.c)
//! and properties (native ones from the zfs(8)/zfsprops(7) table, user
//! properties `module:name`).

use crate::{Error, Result};

/// Longest dataset or snapshot name, as ZFS_MAX_DATASET_NAME_LEN (256 with the NUL).
pub const MAX_NAME_LEN: usize = 255;
/// Longest user property name and value (ZAP_MAXNAMELEN, ZAP_MAXVALUELEN).
const MAX_USER_PROP_NAME: usize = 255;
const MAX_USER_PROP_VALUE: usize = 8192;

/// zfs_namecheck.c `valid_char`: letters, digits, `-_.:` and space.
fn valid_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_.: ".contains(c)
}

/// One component of a name: a pool, a dataset path element or a snapshot.
/// Only a pool must start with a letter; `tank/vol@20131124_1344` is valid.
pub(crate) fn check_component(kind: &str, s: &str) -> Result<()> {
    let bad = |why: String| Error::InvalidArgument(format!("invalid {kind} name '{s}': {why}"));
    if s.is_empty() {
        return Err(bad("empty component in name".into()));
    }
    if let Some(c) = s.chars().find(|c| !valid_char(*c)) {
        return Err(bad(format!("invalid character '{c}' in name")));
    }
    if s.len() > MAX_NAME_LEN {
        return Err(bad("name is too long".into()));
    }
    if kind == "pool" {
        if !s.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Err(bad("pool name must begin with a letter".into()));
        }
        if [
            "mirror", "raidz", "raidz1", "raidz2", "raidz3", "draid", "spare", "log", "cache",
        ]
        .contains(&s)
        {
            return Err(bad("name is reserved".into()));
        }
    } else if s == "." {
        return Err(bad("self reference, '.' is found in name".into()));
    } else if s == ".." {
        return Err(bad("parent reference, '..' is found in name".into()));
    }
    Ok(())
}

/// What `zpool create` refuses beyond [`check_component`] (zpool_name_valid
/// at create: names starting like a vdev keyword, disk-like `c0...`).
pub(crate) fn check_new_pool_name(s: &str) -> Result<()> {
    check_component("pool", s)?;
    let b = s.as_bytes();
    if ["mirror", "raidz", "draid", "spare"]
        .iter()
        .any(|p| s.starts_with(p))
    {
        return Err(Error::InvalidArgument(format!(
            "invalid pool name '{s}': name is reserved (it starts like a vdev keyword)"
        )));
    }
    if b.len() > 1 && b[0] == b'c' && b[1].is_ascii_digit() {
        return Err(Error::InvalidArgument(format!(
            "invalid pool name '{s}': pool name is reserved (it looks like a disk name)"
        )));
    }
    Ok(())
}

/// `pool[/a/b][@snap]` -> (pool, rest of the dataset path).
pub(crate) fn split_dataset(name: &str) -> Result<(&str, Option<&str>)> {
    if name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidArgument(format!(
            "invalid dataset name '{name}': name is too long"
        )));
    }
    let dataset = match name.split_once('@') {
        Some((ds, snap)) => {
            if snap.contains('@') {
                return Err(Error::InvalidArgument(format!(
                    "invalid dataset name '{name}': multiple '@' delimiters in name"
                )));
            }
            check_component("snapshot", snap)?;
            ds
        }
        None => name,
    };
    match dataset.split_once('/') {
        None => {
            check_component("pool", dataset)?;
            Ok((dataset, None))
        }
        Some((pool, rest)) => {
            check_component("pool", pool)?;
            for part in rest.split('/') {
                check_component("dataset", part)?;
            }
            Ok((pool, Some(rest)))
        }
    }
}

/// Native properties zfs(8) knows: a column or `get` of one of these is
/// valid even where a dataset lacks it (shown as `-`); anything else
/// without a colon is a typo.
pub const NATIVE_PROPERTIES: &[&str] = &[
    "name",
    "type",
    "creation",
    "used",
    "available",
    "referenced",
    "compressratio",
    "refcompressratio",
    "mounted",
    "origin",
    "clones",
    "quota",
    "reservation",
    "refquota",
    "refreservation",
    "volsize",
    "volblocksize",
    "recordsize",
    "mountpoint",
    "sharenfs",
    "sharesmb",
    "timemachine",
    "tm_max_size",
    "checksum",
    "compression",
    "atime",
    "relatime",
    "devices",
    "exec",
    "setuid",
    "readonly",
    "zoned",
    "snapdir",
    "aclmode",
    "aclinherit",
    "acltype",
    "canmount",
    "xattr",
    "copies",
    "version",
    "utf8only",
    "normalization",
    "casesensitivity",
    "vscan",
    "nbmand",
    "primarycache",
    "secondarycache",
    "usedbysnapshots",
    "usedbydataset",
    "usedbychildren",
    "usedbyrefreservation",
    "logbias",
    "dedup",
    "mlslabel",
    "sync",
    "dnodesize",
    "written",
    "logicalused",
    "logicalreferenced",
    "volmode",
    "filesystem_limit",
    "snapshot_limit",
    "filesystem_count",
    "snapshot_count",
    "snapdev",
    "redundant_metadata",
    "encryption",
    "keylocation",
    "keyformat",
    "pbkdf2iters",
    "encryptionroot",
    "keystatus",
    "special_small_blocks",
    "objsetid",
    "createtxg",
    "guid",
    "userrefs",
    "defer_destroy",
    "receive_resume_token",
    "context",
    "fscontext",
    "defcontext",
    "rootcontext",
];

/// A user property: lower-case letters, digits, `:-._`, at least one colon
/// (zfs_prop_user), not starting with `-`.
pub fn is_user_property(name: &str) -> bool {
    name.contains(':')
        && !name.starts_with('-')
        && name.len() <= MAX_USER_PROP_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || ":-._".contains(c))
}

/// A property name `get`, `list -o`, `set` or `inherit` may use.
pub fn check_property_name(name: &str) -> Result<()> {
    if NATIVE_PROPERTIES.contains(&name) || is_user_property(name) {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("invalid property '{name}'")))
}

/// A user property's value: any text up to 8 KiB.
pub(crate) fn check_user_value(name: &str, value: &str) -> Result<()> {
    if value.len() > MAX_USER_PROP_VALUE {
        return Err(Error::InvalidArgument(format!(
            "property '{name}': value is longer than {MAX_USER_PROP_VALUE} bytes"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dataset_and_snapshot_names_follow_zfs() {
        for ok in [
            "tank/vol@20131124_1344",
            "tank/2024-backups",
            "tank/a.b:c_d-e",
            "tank/with space@auto 1",
            "tank@snap",
            "t",
        ] {
            assert!(split_dataset(ok).is_ok(), "{ok}");
        }
        for (bad, why) in [
            ("tank/a!", "invalid character '!'"),
            ("tank//a", "empty component"),
            ("tank/a/", "empty component"),
            ("tank/v@", "empty component"),
            ("tank/v@a@b", "multiple '@'"),
            ("tank/../x", "parent reference"),
            ("tank/./x", "self reference"),
            ("1tank/v", "must begin with a letter"),
            ("mirror/v", "reserved"),
            ("tank/v#bm", "invalid character '#'"),
        ] {
            let e = split_dataset(bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
        let long = format!("tank/{}", "a".repeat(251));
        assert!(split_dataset(&long)
            .unwrap_err()
            .to_string()
            .contains("too long"));
        assert!(split_dataset(&long[..255]).is_ok());
    }

    #[test]
    fn new_pool_names_avoid_vdev_keywords_and_disk_names() {
        assert!(check_new_pool_name("tank").is_ok());
        assert!(check_new_pool_name("data0").is_ok());
        for bad in ["mirror2", "raidzpool", "spares", "c0t0d0", "log", "0tank"] {
            assert!(check_new_pool_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn property_names() {
        assert!(check_property_name("used").is_ok());
        assert!(check_property_name("origin").is_ok());
        assert!(check_property_name("com.example:note").is_ok());
        assert!(check_property_name("bogus").is_err());
        assert!(check_property_name("Com.example:Note").is_err());
        assert!(check_property_name("-x:y").is_err());
        assert!(!is_user_property("nocolon"));
        assert!(check_user_value("a:b", &"x".repeat(8193)).is_err());
    }
}
