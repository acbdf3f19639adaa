//! What the S3 layer keeps in a bucket's objects: the per-version record in
//! each object's attribute payload, the bucket's settings in ROOT_DIR's
//! payload, and how names in the fixed directories are spelled
//! (docs/on-disk-format.md, "S3 layout").

use dataset::objects::FIRST_LAYER_OBJECT;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Noncurrent versions: `key \0 <inverted seq, 16 hex>` so the newest sorts first.
pub const VERSIONS_DIR: u64 = FIRST_LAYER_OBJECT;
/// Multipart uploads in progress: `key \0 <upload id>` -> a Dir whose entries are its parts.
pub const UPLOADS_DIR: u64 = FIRST_LAYER_OBJECT + 1;
/// Multipart objects on their way out: `<obj id, 16 hex>` -> the Dir; its
/// parts are freed once nothing else names it (crash-safe removal).
pub const TRASH_DIR: u64 = FIRST_LAYER_OBJECT + 2;

/// Format version of [`ObjectRecord`] and [`BucketSettings`].
pub const RECORD_VERSION: u32 = 1;

/// Name separator between a key and a sequence in VERSIONS_DIR / UPLOADS_DIR:
/// the smallest byte, so all entries of one key are contiguous and keys keep
/// their order. Keys may not contain it.
pub const SEP: char = '\0';

/// Content headers stored with an object and returned on GET/HEAD.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContentHeaders {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_encoding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_disposition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_control: Option<String>,
    /// `Expires`, seconds since the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<i64>,
}

/// Checksums (base64, as the x-amz-checksum-* headers carry them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checksums {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha1: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// "COMPOSITE" for a multipart object's checksum of part checksums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Checksums {
    pub fn is_empty(&self) -> bool {
        self.crc32.is_none()
            && self.crc32c.is_none()
            && self.sha1.is_none()
            && self.sha256.is_none()
    }
}

/// What an object's payload holds: one version of a key, a delete marker, a
/// part of an upload, or an upload in progress (a Dir whose entries are parts).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRecord {
    pub v: u32,
    /// The key this version belongs to (uploads: the key it will become).
    #[serde(default)]
    pub key: String,
    /// Orders the versions of a key (ns, unique per process and increasing);
    /// also names an upload.
    #[serde(default)]
    pub seq: u64,
    /// None: the null version (unversioned or suspended bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    #[serde(default)]
    pub delete_marker: bool,
    /// Quoted-less hex MD5, or `md5-of-part-md5s-N` for multipart.
    #[serde(default)]
    pub etag: String,
    /// Bytes of the object (a multipart object: the sum of its parts).
    #[serde(default)]
    pub size: u64,
    /// Nanoseconds since the epoch (S3 Last-Modified).
    #[serde(default)]
    pub mtime_ns: u64,
    #[serde(default)]
    pub headers: ContentHeaders,
    /// User metadata (x-amz-meta-*), names lowercase without the prefix.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub meta: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Checksums::is_empty")]
    pub checksums: Checksums,
    /// Requested checksum algorithm of an upload (its parts must carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum_algorithm: Option<String>,
    /// Object tags, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<(String, String)>,
    /// A multipart object (the upload's Dir): number of parts; 0 for a plain object.
    #[serde(default)]
    pub parts: u32,
    /// An upload not completed yet.
    #[serde(default)]
    pub upload: bool,
    /// The upload a multipart object was completed from (a repeated
    /// CompleteMultipartUpload answers as the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upload_id: Option<String>,
}

impl ObjectRecord {
    pub fn encode(&self) -> Vec<u8> {
        // A record of our own types always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(payload: &[u8]) -> Option<Self> {
        serde_json::from_slice(payload).ok()
    }

    pub fn version_str(&self) -> String {
        self.version_id.clone().unwrap_or_else(|| "null".into())
    }
}

/// An AbortIncompleteMultipartUpload lifecycle rule (the part of lifecycle
/// we act on); other rule kinds are stored and returned, not applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LifecycleRule {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub prefix: String,
    pub enabled: bool,
    #[serde(default)]
    pub abort_incomplete_days: Option<u32>,
    #[serde(default)]
    pub expiration_days: Option<u32>,
}

/// Bucket-wide settings, in ROOT_DIR's payload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketSettings {
    pub v: u32,
    /// None: never enabled; Some("Enabled" | "Suspended").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versioning: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lifecycle: Vec<LifecycleRule>,
}

impl BucketSettings {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// An empty payload (a new bucket) is the default settings.
    pub fn decode(payload: &[u8]) -> Self {
        if payload.is_empty() {
            return Self::default();
        }
        serde_json::from_slice(payload).unwrap_or_default()
    }

    pub fn versioning_enabled(&self) -> bool {
        self.versioning.as_deref() == Some("Enabled")
    }
}

/// `key \0 <!seq as 16 hex>`: newest version of a key first.
pub fn version_name(key: &str, seq: u64) -> String {
    format!("{key}{SEP}{:016x}", !seq)
}

/// (key, seq) back from a VERSIONS_DIR name.
pub fn parse_version_name(name: &str) -> Option<(&str, u64)> {
    let (key, inv) = name.rsplit_once(SEP)?;
    let inv = u64::from_str_radix(inv, 16).ok()?;
    Some((key, !inv))
}

/// A version id for a sequence: 16 hex digits (opaque to clients).
pub fn version_id(seq: u64) -> String {
    format!("{seq:016x}")
}

pub fn parse_version_id(id: &str) -> Option<u64> {
    if id.len() != 16 {
        return None;
    }
    u64::from_str_radix(id, 16).ok()
}

/// `key \0 <upload id>` in UPLOADS_DIR.
pub fn upload_name(key: &str, upload_id: &str) -> String {
    format!("{key}{SEP}{upload_id}")
}

pub fn parse_upload_name(name: &str) -> Option<(&str, &str)> {
    name.rsplit_once(SEP)
}

/// Parts of an upload are named by their number, zero-padded so that
/// names sort in part order.
pub fn part_name(n: i32) -> String {
    format!("{n:05}")
}

pub fn trash_name(obj: u64) -> String {
    format!("{obj:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_sort_newest_first_and_by_key() {
        let a1 = version_name("a", 1);
        let a2 = version_name("a", 2);
        let ab = version_name("ab", 0);
        assert!(a2 < a1, "newer sorts first");
        assert!(a1 < ab, "key order kept");
        assert_eq!(parse_version_name(&a1), Some(("a", 1)));
        assert_eq!(parse_version_id(&version_id(77)), Some(77));
        assert_eq!(parse_version_id("null"), None);
    }

    #[test]
    fn records_round_trip_and_old_payloads_decode() {
        let mut r = ObjectRecord {
            v: RECORD_VERSION,
            key: "k".into(),
            etag: "abc".into(),
            size: 5,
            ..Default::default()
        };
        r.meta.insert("x".into(), "y".into());
        r.tags.push(("t".into(), "v".into()));
        assert_eq!(ObjectRecord::decode(&r.encode()), Some(r));
        // Fields added later default.
        let old = br#"{"v":1,"key":"k","etag":"e","size":1}"#;
        assert_eq!(ObjectRecord::decode(old).map(|r| r.size), Some(1));
        assert_eq!(BucketSettings::decode(b""), BucketSettings::default());
    }

    #[test]
    fn part_names_sort_in_part_order() {
        assert!(part_name(2) < part_name(10));
        assert!(part_name(999) < part_name(10000));
    }
}
