//! The `s3://bucket[/prefix]` target: objects are named `PREFIX` + an
//! index (ten digits). A write PUTs the run's next new key (0, 1, 2, ...
//! shared by all workers: S3 PUT benchmarks create objects, and a faster
//! server must not be doing more overwrites than a slower one), a read GETs
//! a random key of the region (block i = key i), the latency probe is a
//! HEAD. Each worker has its own client and keep-alive connection. Objects
//! stay in the bucket after a run (a read run after a write run finds them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};

use crate::s3_client::{S3Client, S3Config, S3Options};
use crate::target::Target;

/// Keys of a run when `--objects` is not given.
pub const DEFAULT_OBJECTS: u64 = 1000;
/// Key of the object `bench latency` HEADs.
pub const PROBE_KEY: &str = "cistern-bench-latency";
/// Clients that populate objects before read runs and listings.
pub const POPULATE_WORKERS: usize = 16;

/// A bucket, a key prefix and how to reach them.
#[derive(Debug, Clone)]
pub struct S3Target {
    pub bucket: String,
    /// Empty, or ending with `/`.
    pub prefix: String,
    pub config: Arc<S3Config>,
    /// The index of the next key written (shared by the workers' handles).
    next_write: Arc<AtomicU64>,
}

impl PartialEq for S3Target {
    fn eq(&self, o: &Self) -> bool {
        (&self.bucket, &self.prefix, &self.config) == (&o.bucket, &o.prefix, &o.config)
    }
}

impl Eq for S3Target {}

impl S3Target {
    /// `s3://bucket[/prefix]` with the connection settings of `opts`.
    pub fn parse(s: &str, opts: &S3Options) -> anyhow::Result<Self> {
        let rest = s
            .strip_prefix("s3://")
            .with_context(|| format!("{s}: expected s3://bucket[/prefix]"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        // S3's bucket naming rules, in short: 3..63 of a-z 0-9 . -
        let ok = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && bucket.as_bytes()[0].is_ascii_alphanumeric();
        if !ok {
            bail!("{s}: {bucket:?} is not a valid bucket name (3-63 characters: a-z 0-9 . -)");
        }
        let prefix = prefix.trim_start_matches('/');
        let prefix = if prefix.is_empty() || prefix.ends_with('/') {
            prefix.to_string()
        } else {
            format!("{prefix}/")
        };
        let config = opts.resolve().with_context(|| s.to_string())?;
        Ok(Self {
            bucket: bucket.to_string(),
            prefix,
            config: Arc::new(config),
            next_write: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn url(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    pub fn label(&self) -> String {
        format!("{}/{}", self.bucket, self.prefix)
            .trim_end_matches('/')
            .to_string()
    }

    /// The key of block `index`.
    pub fn key(&self, index: u64) -> String {
        format!("{}{index:010}", self.prefix)
    }

    pub fn client(&self) -> S3Client {
        S3Client::new(self.config.clone())
    }

    /// A client whose connection is open and whose bucket exists.
    pub fn connect(&self) -> anyhow::Result<S3Client> {
        let mut c = self.client();
        if !c.head_bucket(&self.bucket)? {
            bail!(
                "s3://{}: no such bucket at {} (create it, or pass --create-bucket)",
                self.bucket,
                self.config.endpoint
            );
        }
        Ok(c)
    }

    /// Every object under the prefix (ListObjectsV2, 1000 a page): key -> size.
    pub fn list_all(&self, c: &mut S3Client) -> anyhow::Result<HashMap<String, u64>> {
        let mut all = HashMap::new();
        let mut token: Option<String> = None;
        loop {
            let page = c.list_objects_v2(&self.bucket, &self.prefix, token.as_deref(), 1000)?;
            all.extend(page.objects);
            match page.next {
                Some(t) if token.as_deref() != Some(t.as_str()) => token = Some(t),
                Some(_) => bail!("{}: the listing does not advance", self.url()),
                None => return Ok(all),
            }
        }
    }

    /// PUTs `keys` (each `size` bytes of pseudo-random data) with
    /// `workers` clients in parallel.
    pub fn populate(&self, keys: &[String], size: usize, workers: usize) -> anyhow::Result<()> {
        use rand::{RngCore, SeedableRng};
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let workers = workers.clamp(1, keys.len().max(1));
        std::thread::scope(|s| {
            let joins: Vec<_> = (0..workers)
                .map(|w| {
                    let (next, failed) = (&next, &failed);
                    s.spawn(move || -> anyhow::Result<()> {
                        let mut c = self.client();
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(w as u64);
                        let mut data = vec![0u8; size];
                        rng.fill_bytes(&mut data);
                        while !failed.load(Ordering::Relaxed) {
                            if crate::interrupt::requested() {
                                bail!("interrupted");
                            }
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(k) = keys.get(i) else { break };
                            if size >= 8 {
                                data[..8].copy_from_slice(&(i as u64).to_le_bytes());
                            }
                            if let Err(e) = c.put_object(&self.bucket, k, &data) {
                                failed.store(true, Ordering::Relaxed);
                                return Err(e.into());
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            let mut first = Ok(());
            for j in joins {
                let r = j
                    .join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a populating thread panicked")));
                if first.is_ok() {
                    first = r;
                }
            }
            first
        })
    }

    /// Checks the prefix for a run over `objects` keys of `block_size`
    /// bytes: a write run refuses a prefix holding objects unless `force`;
    /// a read run PUTs the keys that are missing first. Returns notes.
    pub fn prepare(
        &self,
        objects: u64,
        write: bool,
        read: bool,
        force: bool,
        block_size: u64,
    ) -> anyhow::Result<Vec<String>> {
        let mut c = self.connect()?;
        let mut notes = Vec::new();
        if write && !force {
            let page = c.list_objects_v2(&self.bucket, &self.prefix, None, 1)?;
            if let Some((k, _)) = page.objects.first() {
                bail!(
                    "{} holds objects (s3://{}/{k}, ...); refusing to write there without --force \
                     (or use another prefix)",
                    self.url(),
                    self.bucket
                );
            }
        }
        if read {
            let have = self.list_all(&mut c)?;
            let mut missing = Vec::new();
            for i in 0..objects {
                let k = self.key(i);
                match have.get(&k) {
                    Some(&n) if n == block_size => {}
                    Some(&n) if !force => bail!(
                        "s3://{}/{k} is {n} bytes, not {block_size}: use another prefix, or \
                         --force to overwrite",
                        self.bucket
                    ),
                    _ => missing.push(k),
                }
            }
            if !missing.is_empty() {
                self.populate(&missing, block_size as usize, POPULATE_WORKERS)?;
                notes.push(format!(
                    "put {} objects of {} under {} so reads hit real objects",
                    missing.len(),
                    crate::util::fmt_bytes(block_size),
                    self.url()
                ));
            }
        }
        if write {
            notes.push(format!(
                "objects written stay in the bucket under {} (keys {}..)",
                self.url(),
                self.key(0)
            ));
        }
        Ok(notes)
    }

    /// Makes sure the latency probe (`PREFIX` + [`PROBE_KEY`]) exists;
    /// returns its key and whether it was created (to remove it after).
    pub fn prepare_probe(&self, size: usize) -> anyhow::Result<(String, bool)> {
        let mut c = self.connect()?;
        let key = format!("{}{PROBE_KEY}", self.prefix);
        if c.head_object(&self.bucket, &key)?.is_some() {
            return Ok((key, false));
        }
        c.put_object(&self.bucket, &key, &vec![0x5a; size])?;
        Ok((key, true))
    }

    pub fn open(&self) -> anyhow::Result<Box<dyn Target>> {
        Ok(Box::new(S3Worker {
            client: self.connect()?,
            bucket: self.bucket.clone(),
            target: self.clone(),
        }))
    }
}

struct S3Worker {
    client: S3Client,
    bucket: String,
    target: S3Target,
}

impl S3Worker {
    fn read_key(&self, offset: u64, len: usize) -> String {
        self.target.key(offset / (len.max(1) as u64))
    }
}

impl Target for S3Worker {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        let key = self.read_key(offset, buf.len());
        let n = self.client.get_object(&self.bucket, &key, buf)?;
        if n != buf.len() {
            bail!(
                "GET s3://{}/{key}: {n} bytes, expected {}",
                self.bucket,
                buf.len()
            );
        }
        Ok(())
    }

    /// A PUT of the run's next new key (`offset` is not used; see the
    /// module doc). S3 acknowledges a PUT once it is stored: every write is
    /// synchronous.
    fn write_sync(&mut self, _offset: u64, data: &[u8]) -> anyhow::Result<()> {
        let key = self
            .target
            .key(self.target.next_write.fetch_add(1, Ordering::Relaxed));
        Ok(self.client.put_object(&self.bucket, &key, data)?)
    }

    /// HEAD of the latency probe; `buf.len()` is its size.
    fn round_trip(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        let key = format!("{}{PROBE_KEY}", self.target.prefix);
        match self.client.head_object(&self.bucket, &key)? {
            Some(n) if n == buf.len() as u64 => Ok(()),
            Some(n) => bail!(
                "HEAD s3://{}/{key}: {n} bytes, expected {}",
                self.bucket,
                buf.len()
            ),
            None => bail!("HEAD s3://{}/{key}: no such key", self.bucket),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> S3Options {
        S3Options {
            endpoint: Some("http://127.0.0.1:9".into()),
            access_key: Some("a".into()),
            secret_key: Some("s".into()),
            region: None,
            sign_payload: false,
        }
    }

    #[test]
    fn parses_buckets_and_prefixes() {
        let t = S3Target::parse("s3://bench", &opts()).unwrap();
        assert_eq!((t.bucket.as_str(), t.prefix.as_str()), ("bench", ""));
        assert_eq!(t.key(7), "0000000007");
        let t = S3Target::parse("s3://bench/4k", &opts()).unwrap();
        assert_eq!(t.prefix, "4k/");
        assert_eq!(t.key(12), "4k/0000000012");
        assert_eq!(t.url(), "s3://bench/4k/");
        assert_eq!(t.label(), "bench/4k");
        assert_eq!(
            S3Target::parse("s3://bench/a/b/", &opts()).unwrap().prefix,
            "a/b/"
        );
        for bad in ["s3://", "s3://Bench", "s3://ab", "s3://-ab"] {
            let e = S3Target::parse(bad, &opts()).unwrap_err().to_string();
            assert!(e.contains("not a valid bucket name"), "{bad}: {e}");
        }
        let no_endpoint = S3Options {
            endpoint: None,
            ..opts()
        };
        if std::env::var_os("AWS_ENDPOINT_URL").is_none()
            && std::env::var_os("AWS_ENDPOINT_URL_S3").is_none()
        {
            let e = S3Target::parse("s3://bench", &no_endpoint).unwrap_err();
            assert!(format!("{e:#}").contains("AWS_ENDPOINT_URL"), "{e:#}");
        }
    }

    #[test]
    fn unreachable_endpoint_is_a_clear_error() {
        // Port 9 (discard) is closed on loopback here.
        let t = S3Target::parse("s3://bench", &opts()).unwrap();
        let e = t.prepare(10, true, false, false, 4096).unwrap_err();
        assert!(format!("{e:#}").contains("s3://bench"), "{e:#}");
    }
}
