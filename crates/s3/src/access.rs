//! PLACEHOLDER access control (the real one comes from branch `s3access`):
//! one configured key may do everything, anonymous requests are refused.
//! Only the interface the S3 layer calls lives here.

use s3s::auth::{S3Auth, SecretKey};
use s3s::{s3_error, S3Result};

/// What an operation needs on a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Access keys and their grants.
pub struct Users {
    keys: Vec<(String, String)>,
}

impl Users {
    /// One key that may read and write every bucket.
    pub fn single(access_key: &str, secret_key: &str) -> Self {
        Self {
            keys: vec![(access_key.to_string(), secret_key.to_string())],
        }
    }

    pub fn check(
        &self,
        access_key: Option<&str>,
        bucket: &str,
        want: Access,
    ) -> Result<(), s3s::S3Error> {
        let _ = (bucket, want);
        match access_key {
            Some(k) if self.keys.iter().any(|(a, _)| a == k) => Ok(()),
            Some(_) => Err(s3_error!(AccessDenied, "access denied")),
            None => Err(s3_error!(AccessDenied, "anonymous access is refused")),
        }
    }

    pub fn visible(&self, access_key: Option<&str>, bucket: &str) -> bool {
        self.check(access_key, bucket, Access::Read).is_ok()
    }
}

#[async_trait::async_trait]
impl S3Auth for Users {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        match self.keys.iter().find(|(a, _)| a == access_key) {
            Some((_, s)) => Ok(SecretKey::from(s.as_str())),
            None => Err(s3_error!(InvalidAccessKeyId)),
        }
    }
}
