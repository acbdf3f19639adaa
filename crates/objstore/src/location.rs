//! Where a bucket pool lives: `s3://bucket/prefix` (credentials, region and
//! endpoint from the usual AWS environment variables or the config) or
//! `file:///dir` (a local directory: the same protocol, for tests and labs).

use crate::LogError;
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::ObjectStore;
use std::sync::Arc;

#[derive(Debug, Clone, Default)]
pub struct S3Settings {
    /// e.g. `http://127.0.0.1:7070` for versitygw or MinIO; `None` for AWS.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("pool location {0:?}: expected s3://BUCKET[/PREFIX] or file:///DIR")]
    Scheme(String),
    #[error("pool location {0:?}: no bucket name")]
    NoBucket(String),
    #[error("pool location {url:?}: {source}")]
    Store {
        url: String,
        source: object_store::Error,
    },
    #[error("pool location {url:?}: cannot create the directory: {source}")]
    Dir { url: String, source: std::io::Error },
}

impl From<LocationError> for LogError {
    fn from(e: LocationError) -> LogError {
        LogError::Location(e.to_string())
    }
}

/// Opens the store named by `url` and returns it with the pool's prefix in it.
pub fn open(url: &str, s3: &S3Settings) -> Result<(Arc<dyn ObjectStore>, Path), LocationError> {
    if let Some(dir) = url.strip_prefix("file://") {
        if !dir.starts_with('/') {
            return Err(LocationError::Scheme(url.to_string()));
        }
        std::fs::create_dir_all(dir).map_err(|source| LocationError::Dir {
            url: url.to_string(),
            source,
        })?;
        let fs = LocalFileSystem::new_with_prefix(dir).map_err(|source| LocationError::Store {
            url: url.to_string(),
            source,
        })?;
        return Ok((Arc::new(fs), Path::from("")));
    }
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| LocationError::Scheme(url.to_string()))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(LocationError::NoBucket(url.to_string()));
    }
    // Create-if-absent is the fence: ask for it explicitly (If-None-Match: *).
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_conditional_put(S3ConditionalPut::ETagMatch);
    if let Some(ep) = &s3.endpoint {
        b = b
            .with_endpoint(ep)
            .with_allow_http(ep.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    if let Some(r) = &s3.region {
        b = b.with_region(r);
    }
    if let Some(k) = &s3.access_key_id {
        b = b.with_access_key_id(k);
    }
    if let Some(k) = &s3.secret_access_key {
        b = b.with_secret_access_key(k);
    }
    let store = b.build().map_err(|source| LocationError::Store {
        url: url.to_string(),
        source,
    })?;
    Ok((Arc::new(store), Path::from(prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_parse_or_say_what_is_wrong() {
        let s = S3Settings {
            endpoint: Some("http://127.0.0.1:1".into()),
            region: Some("us-east-1".into()),
            ..Default::default()
        };
        let (_, p) = open("s3://bkt/pools/tank", &s).expect("s3");
        assert_eq!(p.as_ref(), "pools/tank");
        let (_, p) = open("s3://bkt", &s).expect("s3 without prefix");
        assert_eq!(p.as_ref(), "");
        assert!(matches!(
            open("s3:///x", &s),
            Err(LocationError::NoBucket(_))
        ));
        assert!(matches!(open("gs://x", &s), Err(LocationError::Scheme(_))));
        assert!(matches!(
            open("file://relative", &s),
            Err(LocationError::Scheme(_))
        ));
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("file://{}/pool", dir.path().display());
        open(&url, &s).expect("file");
        assert!(dir.path().join("pool").is_dir());
    }
}
