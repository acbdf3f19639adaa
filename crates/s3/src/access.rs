//! Who may use the S3 endpoint: access keys (one per user), their secrets,
//! and read or read-write grants per bucket.
//!
//! - [`Users`] is the table the daemon keeps in `STATE_DIR/s3-users.json`
//!   (0600, replaced atomically: temp file, fsync, rename, fsync of the
//!   directory). SigV4 signs with the secret itself, so the server must be
//!   able to recover it: secrets are encrypted (ChaCha20-Poly1305, the user
//!   name and access key as associated data) with a random key in
//!   `STATE_DIR/s3-users.key` (0600), never hashed, and never sent back by
//!   the API after `user add` (decision 0019).
//! - s3s verifies signatures (SigV4 header and presigned, expiry, clock
//!   skew) with the secret [`Users`] gives it as [`S3Auth`]; [`SigV4Only`]
//!   then refuses requests signed the old (V2) way.
//! - The S3 layer asks [`Users::check`] before every bucket operation and
//!   [`Users::visible`] to filter ListBuckets.
//!
//! A grant names a bucket or `*` (every bucket); the grant on the bucket's
//! own name wins over `*`, so `*=rw` plus `logs=ro` makes `logs` read-only.
//! A snapshot bucket (`photos--snap--daily`) is readable with a grant on
//! `photos`. Anonymous requests are refused unless the config grants them
//! (`[s3] anonymous = "public=ro"`).

use crate::store::SNAP_SEP;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use parking_lot::RwLock;
use rand::TryRngCore;
use s3s::auth::{S3Auth, SecretKey};
use s3s::{s3_error, S3Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// The users table in the state directory.
pub const USERS_FILE: &str = "s3-users.json";
/// The key that encrypts the secrets in [`USERS_FILE`].
pub const KEY_FILE: &str = "s3-users.key";
/// Version of [`USERS_FILE`]'s layout this build reads and writes.
pub const FORMAT: u32 = 1;
const KEY_LEN: usize = 32;
const NONCE_LEN: usize = 12;
const ACCESS_KEY_PREFIX: &str = "CIST";
const ACCESS_KEY_LEN: usize = 20;
const SECRET_LEN: usize = 40;
const MAX_NAME: usize = 64;

/// What an operation needs on a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Access {
    /// `ro`: list and read objects.
    #[serde(rename = "ro")]
    Read,
    /// `rw`: also write and delete objects, create and delete the bucket.
    #[serde(rename = "rw")]
    Write,
}

impl Access {
    /// Whether a grant of `self` allows `want`.
    pub fn allows(self, want: Access) -> bool {
        self >= want
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "ro",
            Access::Write => "rw",
        }
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Access {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "ro" => Ok(Access::Read),
            "rw" => Ok(Access::Write),
            _ => Err(Error::Invalid(format!(
                "'{s}' is not an access mode: use ro (read) or rw (read-write)"
            ))),
        }
    }
}

/// One grant as the API and `user list` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// A bucket name, or `*` for every bucket.
    pub bucket: String,
    pub access: Access,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.bucket, self.access)
    }
}

impl FromStr for Grant {
    type Err = Error;
    /// `BUCKET=ro` or `BUCKET=rw`.
    fn from_str(s: &str) -> Result<Self, Error> {
        let Some((bucket, access)) = s.split_once('=') else {
            return Err(Error::Invalid(format!(
                "'{s}' is not a grant: use BUCKET=ro or BUCKET=rw (BUCKET * for all)"
            )));
        };
        let bucket = bucket.trim();
        check_bucket(bucket)?;
        Ok(Grant {
            bucket: bucket.to_string(),
            access: access.trim().parse()?,
        })
    }
}

/// Grants by bucket (`*` = every bucket).
pub type Grants = BTreeMap<String, Access>;

/// Parses the config's `anonymous` setting: `off` (or empty), `ro`/`rw`
/// (every bucket), or grants `public=ro,drop=rw`.
pub fn parse_anonymous(s: &str) -> Result<Grants, Error> {
    let s = s.trim();
    let mut g = Grants::new();
    match s {
        "" | "off" | "none" => {}
        "ro" | "rw" => {
            g.insert("*".into(), s.parse()?);
        }
        _ => {
            for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let grant: Grant = part.parse()?;
                g.insert(grant.bucket, grant.access);
            }
        }
    }
    Ok(g)
}

/// A user as the API and `user list` show it (never the secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserInfo {
    pub name: String,
    pub access_key: String,
    /// Unix seconds.
    pub created: u64,
    pub grants: Vec<Grant>,
}

/// What `user add` answers, once: the only time the secret leaves the daemon.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewUser {
    pub name: String,
    pub access_key: String,
    pub secret_key: String,
    pub grants: Vec<Grant>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("user '{0}' does not exist")]
    NoSuchUser(String),
    #[error("user '{0}' already exists")]
    UserExists(String),
    #[error("user '{user}' has no grant on bucket '{bucket}'")]
    NoSuchGrant { user: String, bucket: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {msg}", path.display())]
    Corrupt { path: PathBuf, msg: String },
}

impl Error {
    /// The management API's error kind (as `dataset::Error`'s variants).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::NoSuchUser(_) | Error::NoSuchGrant { .. } => "NotFound",
            Error::UserExists(_) => "AlreadyExists",
            Error::Invalid(_) => "InvalidArgument",
            Error::Io { .. } => "Io",
            Error::Corrupt { .. } => "Corrupt",
        }
    }

    fn io(path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// A user name: letters, digits, `_`, `-`, `.`, `@`; not starting with `-`.
fn check_user_name(name: &str) -> Result<(), Error> {
    if name.is_empty() {
        return Err(Error::Invalid("user name is empty".into()));
    }
    if name.len() > MAX_NAME {
        return Err(Error::Invalid(format!(
            "user name '{name}' is longer than {MAX_NAME} characters"
        )));
    }
    if name.starts_with('-') {
        return Err(Error::Invalid(format!(
            "user name '{name}' starts with '-'"
        )));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-.@".contains(*c)))
    {
        return Err(Error::Invalid(format!(
            "user name '{name}' has the character '{c}': use letters, digits, _ - . @"
        )));
    }
    Ok(())
}

/// An S3 bucket name (3-63 of a-z 0-9 . -, starting and ending with a
/// letter or digit) or `*`.
fn check_bucket(b: &str) -> Result<(), Error> {
    if b == "*" {
        return Ok(());
    }
    check_bucket_name(b)
}

/// An S3 bucket name: 3-63 of a-z 0-9 . -, starting and ending with a
/// letter or digit (what `cistern create -t bucket` accepts as the last
/// component, so that S3 clients can reach it).
pub fn check_bucket_name(b: &str) -> Result<(), Error> {
    let bad = |why: &str| Err(Error::Invalid(format!("'{b}' is not a bucket name: {why}")));
    if b.contains('/') || b.contains('@') {
        return bad(
            "give the S3 name (the dataset's last component, e.g. 'bucket0' for tank/bucket0)",
        );
    }
    if !(3..=63).contains(&b.len()) {
        return bad("it must be 3 to 63 characters long");
    }
    if let Some(c) = b
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '.' || *c == '-'))
    {
        return bad(&format!("'{c}' is not allowed (use a-z 0-9 . -)"));
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge(b.chars().next()) || !edge(b.chars().last()) {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

/// The grant `grants` give on `bucket`: its own name first, then `*`; a
/// snapshot bucket takes its bucket's grant, read-only.
fn granted(grants: &Grants, bucket: &str) -> Option<Access> {
    if let Some(a) = grants.get(bucket) {
        return Some(*a);
    }
    if let Some((base, _)) = bucket.split_once(SNAP_SEP) {
        return granted(grants, base).map(|_| Access::Read);
    }
    grants.get("*").copied()
}

/// One user as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredUser {
    name: String,
    access_key: String,
    /// base64 of nonce (12 bytes) || ChaCha20-Poly1305 ciphertext and tag.
    secret: String,
    created: u64,
    #[serde(default)]
    grants: Grants,
}

impl StoredUser {
    fn info(&self) -> UserInfo {
        UserInfo {
            name: self.name.clone(),
            access_key: self.access_key.clone(),
            created: self.created,
            grants: grant_list(&self.grants),
        }
    }

    /// Binds the ciphertext to its row: a secret moved to another user
    /// does not decrypt.
    fn aad(name: &str, access_key: &str) -> Vec<u8> {
        format!("cistern-s3-secret\0{name}\0{access_key}").into_bytes()
    }
}

fn grant_list(g: &Grants) -> Vec<Grant> {
    g.iter()
        .map(|(bucket, access)| Grant {
            bucket: bucket.clone(),
            access: *access,
        })
        .collect()
}

/// The file's layout (FORMAT 1).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct UsersFile {
    format: u32,
    users: Vec<StoredUser>,
}

/// Access keys, their (encrypted) secrets and grants; shared by the S3
/// endpoint and the management API. Changes are saved before they apply.
pub struct Users {
    /// None: kept in memory only ([`Users::single`]).
    path: Option<PathBuf>,
    cipher: ChaCha20Poly1305,
    /// By user name.
    table: RwLock<BTreeMap<String, StoredUser>>,
    /// What unsigned requests may do (config; empty = refused).
    anonymous: Grants,
}

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Users")
            .field("path", &self.path)
            .field("users", &self.table.read().len())
            .field("anonymous", &self.anonymous)
            .finish()
    }
}

fn random_bytes<const N: usize>() -> Result<[u8; N], Error> {
    let mut b = [0u8; N];
    rand::rngs::OsRng.try_fill_bytes(&mut b).map_err(|e| {
        Error::io(
            Path::new("/dev/urandom"),
            std::io::Error::other(e.to_string()),
        )
    })?;
    Ok(b)
}

/// `n` characters from `alphabet`, uniformly (rejection sampling).
fn random_string(alphabet: &[u8], n: usize) -> Result<String, Error> {
    let limit = 256 - 256 % alphabet.len();
    let mut out = String::with_capacity(n);
    while out.len() < n {
        for b in random_bytes::<64>()? {
            if (b as usize) < limit && out.len() < n {
                out.push(alphabet[b as usize % alphabet.len()] as char);
            }
        }
    }
    Ok(out)
}

const UPPER_DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn fsync_dir(dir: &Path) -> Result<(), Error> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// Replaces `path` with `bytes`: a 0600 temp file beside it, fsync,
/// rename, fsync of the directory. A crash leaves the old or the new file.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        // A leftover temp file keeps its old mode through open().
        f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        f.write_all(bytes)?;
        f.sync_all()
    };
    write().map_err(|e| Error::io(&tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))?;
    fsync_dir(dir)
}

/// Reads the key file, or makes one when there is none yet and no users
/// file either (a users file without its key cannot be read).
fn load_or_make_key(dir: &Path, users_exist: bool) -> Result<[u8; KEY_LEN], Error> {
    let path = dir.join(KEY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let key: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| Error::Corrupt {
                path: path.clone(),
                msg: format!("the key is {} bytes, not {KEY_LEN}", bytes.len()),
            })?;
            if let Ok(m) = std::fs::metadata(&path) {
                if m.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(path = %path.display(), "S3 secret key file is readable by others: chmod 600 it");
                }
            }
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if users_exist {
                return Err(Error::Corrupt {
                    path,
                    msg: format!(
                        "missing: the secrets in {USERS_FILE} cannot be decrypted without it \
                         (restore it, or move {USERS_FILE} away and add the users again)"
                    ),
                });
            }
            let key = random_bytes::<KEY_LEN>()?;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| Error::io(&path, e))?;
            f.write_all(&key)
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::io(&path, e))?;
            fsync_dir(dir)?;
            Ok(key)
        }
        Err(e) => Err(Error::io(&path, e)),
    }
}

impl Users {
    /// Opens (or starts) the table in `state_dir`; every secret is
    /// decrypted once here, so a wrong or damaged key fails now.
    pub fn open(state_dir: &Path) -> Result<Users, Error> {
        let path = state_dir.join(USERS_FILE);
        let text = match std::fs::read(&path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(Error::io(&path, e)),
        };
        let key = load_or_make_key(state_dir, text.is_some())?;
        let users = Users {
            path: Some(path.clone()),
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            table: RwLock::new(BTreeMap::new()),
            anonymous: Grants::new(),
        };
        let Some(text) = text else {
            return Ok(users);
        };
        let corrupt = |msg: String| Error::Corrupt {
            path: path.clone(),
            msg,
        };
        let file: UsersFile = serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
        if file.format != FORMAT {
            return Err(corrupt(format!(
                "format {} is not the one this build reads ({FORMAT})",
                file.format
            )));
        }
        let mut table = BTreeMap::new();
        for u in file.users {
            users.decrypt(&u).map_err(|_| {
                corrupt(format!(
                    "the secret of user '{}' does not decrypt with {KEY_FILE}",
                    u.name
                ))
            })?;
            if table
                .values()
                .any(|o: &StoredUser| o.access_key == u.access_key)
            {
                return Err(corrupt(format!(
                    "access key {} appears twice",
                    u.access_key
                )));
            }
            if table.insert(u.name.clone(), u.clone()).is_some() {
                return Err(corrupt(format!("user '{}' appears twice", u.name)));
            }
        }
        *users.table.write() = table;
        Ok(users)
    }

    /// One key that may read and write every bucket, kept in memory only
    /// (tests, embedding; changes are not saved anywhere).
    pub fn single(access_key: &str, secret_key: &str) -> Users {
        // A fresh key per table: nothing encrypted with it outlives it.
        let key = random_bytes::<KEY_LEN>().unwrap_or_else(|_| {
            let mut k = [0u8; KEY_LEN];
            rand::Rng::fill(&mut rand::rng(), &mut k[..]);
            k
        });
        let users = Users {
            path: None,
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key)),
            table: RwLock::new(BTreeMap::new()),
            anonymous: Grants::new(),
        };
        let name = "admin";
        // Encryption with a valid key and nonce cannot fail.
        let secret = users
            .encrypt(name, access_key, secret_key)
            .unwrap_or_default();
        let mut grants = Grants::new();
        grants.insert("*".into(), Access::Write);
        users.table.write().insert(
            name.into(),
            StoredUser {
                name: name.into(),
                access_key: access_key.into(),
                secret,
                created: now_secs(),
                grants,
            },
        );
        users
    }

    /// What unsigned requests may do (from the config; see [`parse_anonymous`]).
    pub fn with_anonymous(mut self, grants: Grants) -> Users {
        self.anonymous = grants;
        self
    }

    /// Whether the config lets unsigned requests in at all.
    pub fn anonymous_allowed(&self) -> bool {
        !self.anonymous.is_empty()
    }

    fn encrypt(&self, name: &str, access_key: &str, secret: &str) -> Result<String, Error> {
        let nonce = random_bytes::<NONCE_LEN>()?;
        let aad = StoredUser::aad(name, access_key);
        let ct = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| Error::Invalid("cannot encrypt the secret".into()))?;
        let mut blob = nonce.to_vec();
        blob.extend_from_slice(&ct);
        Ok(base64::engine::general_purpose::STANDARD.encode(blob))
    }

    fn decrypt(&self, u: &StoredUser) -> Result<String, ()> {
        let blob = base64::engine::general_purpose::STANDARD
            .decode(&u.secret)
            .map_err(|_| ())?;
        if blob.len() < NONCE_LEN {
            return Err(());
        }
        let (nonce, ct) = blob.split_at(NONCE_LEN);
        let aad = StoredUser::aad(&u.name, &u.access_key);
        let plain = self
            .cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad: &aad })
            .map_err(|_| ())?;
        String::from_utf8(plain).map_err(|_| ())
    }

    /// Applies `f` to a copy of the table, saves it, then makes it current;
    /// on any error nothing changes. Writers are serialized by the lock.
    fn change<T>(
        &self,
        f: impl FnOnce(&mut BTreeMap<String, StoredUser>) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut table = self.table.write();
        let mut next = table.clone();
        let out = f(&mut next)?;
        let Some(path) = &self.path else {
            *table = next;
            return Ok(out);
        };
        let file = UsersFile {
            format: FORMAT,
            users: next.values().cloned().collect(),
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| Error::Corrupt {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        write_atomic(path, &bytes)?;
        *table = next;
        Ok(out)
    }

    /// Makes a user with a new access key and secret; the answer is the
    /// only time the secret is given out.
    pub fn add(&self, name: &str, grants: &[Grant]) -> Result<NewUser, Error> {
        check_user_name(name)?;
        let mut g = Grants::new();
        for grant in grants {
            check_bucket(&grant.bucket)?;
            g.insert(grant.bucket.clone(), grant.access);
        }
        let secret = random_string(ALNUM, SECRET_LEN)?;
        self.change(|t| {
            if t.contains_key(name) {
                return Err(Error::UserExists(name.into()));
            }
            let access_key = loop {
                let k = format!(
                    "{ACCESS_KEY_PREFIX}{}",
                    random_string(UPPER_DIGITS, ACCESS_KEY_LEN - ACCESS_KEY_PREFIX.len())?
                );
                if !t.values().any(|u| u.access_key == k) {
                    break k;
                }
            };
            let stored = StoredUser {
                name: name.into(),
                secret: self.encrypt(name, &access_key, &secret)?,
                access_key: access_key.clone(),
                created: now_secs(),
                grants: g.clone(),
            };
            t.insert(name.into(), stored);
            Ok(NewUser {
                name: name.into(),
                access_key,
                secret_key: secret.clone(),
                grants: grant_list(&g),
            })
        })
    }

    /// Every user, by name.
    pub fn list(&self) -> Vec<UserInfo> {
        self.table.read().values().map(StoredUser::info).collect()
    }

    pub fn get(&self, name: &str) -> Result<UserInfo, Error> {
        self.table
            .read()
            .get(name)
            .map(StoredUser::info)
            .ok_or_else(|| Error::NoSuchUser(name.into()))
    }

    /// Removes a user: its key stops working at once.
    pub fn remove(&self, name: &str) -> Result<(), Error> {
        self.change(|t| match t.remove(name) {
            Some(_) => Ok(()),
            None => Err(Error::NoSuchUser(name.into())),
        })
    }

    /// Grants (or changes) `access` on `bucket` (`*`: every bucket).
    pub fn grant(&self, name: &str, bucket: &str, access: Access) -> Result<UserInfo, Error> {
        check_bucket(bucket)?;
        self.change(|t| {
            let u = t
                .get_mut(name)
                .ok_or_else(|| Error::NoSuchUser(name.into()))?;
            u.grants.insert(bucket.into(), access);
            Ok(u.info())
        })
    }

    /// Takes the grant on `bucket` away.
    pub fn revoke(&self, name: &str, bucket: &str) -> Result<UserInfo, Error> {
        check_bucket(bucket)?;
        self.change(|t| {
            let u = t
                .get_mut(name)
                .ok_or_else(|| Error::NoSuchUser(name.into()))?;
            if u.grants.remove(bucket).is_none() {
                return Err(Error::NoSuchGrant {
                    user: name.into(),
                    bucket: bucket.into(),
                });
            }
            Ok(u.info())
        })
    }

    /// The grant of a signed request's key (or of anonymous ones) on `bucket`.
    fn granted(&self, access_key: Option<&str>, bucket: &str) -> Option<Access> {
        match access_key {
            None => granted(&self.anonymous, bucket),
            Some(k) => {
                let t = self.table.read();
                let u = t.values().find(|u| u.access_key == k)?;
                granted(&u.grants, bucket)
            }
        }
    }

    /// May the request signed with `access_key` (None: unsigned) do `want`
    /// on `bucket`? AccessDenied (403) if not, as S3 answers.
    pub fn check(
        &self,
        access_key: Option<&str>,
        bucket: &str,
        want: Access,
    ) -> Result<(), s3s::S3Error> {
        match self.granted(access_key, bucket) {
            Some(a) if a.allows(want) => Ok(()),
            _ if access_key.is_none() => Err(s3_error!(
                AccessDenied,
                "Access Denied: anonymous access is refused (sign the request with a key from `cistern user add`)"
            )),
            Some(_) => Err(s3_error!(
                AccessDenied,
                "Access Denied: the key has read-only access to bucket '{bucket}'"
            )),
            None => Err(s3_error!(
                AccessDenied,
                "Access Denied: the key has no grant on bucket '{bucket}'"
            )),
        }
    }

    /// Whether ListBuckets shows `bucket` to `access_key`: any grant on it.
    pub fn visible(&self, access_key: Option<&str>, bucket: &str) -> bool {
        self.granted(access_key, bucket).is_some()
    }

    fn secret_of(&self, access_key: &str) -> S3Result<SecretKey> {
        let t = self.table.read();
        let Some(u) = t.values().find(|u| u.access_key == access_key) else {
            return Err(s3_error!(
                InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records."
            ));
        };
        match self.decrypt(u) {
            Ok(s) => Ok(SecretKey::from(s)),
            Err(()) => {
                tracing::error!(user = %u.name, "S3 secret does not decrypt");
                Err(s3_error!(
                    InternalError,
                    "cannot read the secret of this key"
                ))
            }
        }
    }
}

/// s3s asks for the secret of a request's access key and checks the
/// signature with it; an unknown key is InvalidAccessKeyId.
#[async_trait::async_trait]
impl S3Auth for Users {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<SecretKey> {
        self.secret_of(access_key)
    }
}

/// Refuses requests s3s authenticated with Signature Version 2 (the
/// `AWS KEY:SIG` header or `AWSAccessKeyId=` presigned URLs), as S3 regions
/// since 2014 do; everything else passes on to the per-bucket
/// [`Users::check`] of each operation (unsigned requests included).
pub struct SigV4Only;

impl SigV4Only {
    fn is_v2(headers: &http::HeaderMap, query: Option<&str>) -> bool {
        let header_v2 = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("AWS "));
        let query_v2 = query.is_some_and(|q| {
            q.split('&')
                .any(|p| p.starts_with("AWSAccessKeyId=") || p.starts_with("Signature="))
        });
        header_v2 || query_v2
    }
}

#[async_trait::async_trait]
impl s3s::access::S3Access for SigV4Only {
    async fn check(&self, cx: &mut s3s::access::S3AccessContext<'_>) -> S3Result<()> {
        if Self::is_v2(cx.headers(), cx.uri().query()) {
            return Err(s3_error!(
                InvalidRequest,
                "The authorization mechanism you have provided is not supported. Please use AWS4-HMAC-SHA256."
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(s: &str) -> Grant {
        s.parse().unwrap()
    }

    #[test]
    fn secrets_are_encrypted_at_rest_and_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        let nu = users.add("alice", &[g("photos=rw")]).unwrap();
        assert_eq!(nu.access_key.len(), ACCESS_KEY_LEN);
        assert!(nu.access_key.starts_with(ACCESS_KEY_PREFIX));
        assert_eq!(nu.secret_key.len(), SECRET_LEN);
        let text = std::fs::read_to_string(dir.path().join(USERS_FILE)).unwrap();
        assert!(text.contains(&nu.access_key));
        assert!(!text.contains(&nu.secret_key), "secret stored in the clear");
        for f in [USERS_FILE, KEY_FILE] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        drop(users);
        // Reopened: the same secret comes back for s3s.
        let users = Users::open(dir.path()).unwrap();
        assert_eq!(
            users.secret_of(&nu.access_key).unwrap().expose(),
            nu.secret_key
        );
        let e = users.secret_of("CISTNOSUCHKEY0000000").unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::InvalidAccessKeyId);
        // Two users never share a key or a secret.
        let other = users.add("bob", &[]).unwrap();
        assert_ne!(other.access_key, nu.access_key);
        assert_ne!(other.secret_key, nu.secret_key);
    }

    #[test]
    fn a_wrong_or_missing_key_file_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        Users::open(dir.path()).unwrap().add("alice", &[]).unwrap();
        std::fs::write(dir.path().join(KEY_FILE), [7u8; KEY_LEN]).unwrap();
        let e = Users::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("alice") && e.contains("decrypt"), "{e}");
        std::fs::write(dir.path().join(KEY_FILE), [7u8; 5]).unwrap();
        let e = Users::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("5 bytes"), "{e}");
        std::fs::remove_file(dir.path().join(KEY_FILE)).unwrap();
        let e = Users::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains(KEY_FILE) && e.contains("missing"), "{e}");
        // The users file was never touched by the failed opens.
        assert!(std::fs::read_to_string(dir.path().join(USERS_FILE))
            .unwrap()
            .contains("alice"));
    }

    #[test]
    fn a_secret_moved_to_another_user_does_not_decrypt() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        users.add("alice", &[]).unwrap();
        users.add("bob", &[]).unwrap();
        let path = dir.path().join(USERS_FILE);
        let mut f: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let s0 = f["users"][0]["secret"].clone();
        f["users"][1]["secret"] = s0;
        std::fs::write(&path, serde_json::to_vec(&f).unwrap()).unwrap();
        let e = Users::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("bob"), "{e}");
    }

    #[test]
    fn saves_are_atomic_and_a_failed_save_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        users.add("alice", &[g("a1b=ro")]).unwrap();
        let before = std::fs::read(dir.path().join(USERS_FILE)).unwrap();
        // A crash between writing the temp file and the rename leaves a
        // stray temp file: the table is the last complete one.
        let tmp = dir.path().join(format!("{USERS_FILE}.tmp"));
        std::fs::write(&tmp, b"{half a fi").unwrap();
        assert_eq!(Users::open(dir.path()).unwrap().list().len(), 1);
        // A temp path that cannot be written fails the change: memory and
        // file stay as they were.
        std::fs::remove_file(&tmp).unwrap();
        std::fs::create_dir(&tmp).unwrap();
        assert!(matches!(users.add("bob", &[]), Err(Error::Io { .. })));
        assert!(matches!(
            users.grant("alice", "zzz", Access::Write),
            Err(Error::Io { .. })
        ));
        assert_eq!(users.list().len(), 1);
        assert_eq!(users.get("alice").unwrap().grants, vec![g("a1b=ro")]);
        assert_eq!(std::fs::read(dir.path().join(USERS_FILE)).unwrap(), before);
        std::fs::remove_dir(&tmp).unwrap();
        // A leftover world-readable temp file is made private again.
        std::fs::write(&tmp, b"").unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        users.add("bob", &[]).unwrap();
        let mode = std::fs::metadata(dir.path().join(USERS_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(Users::open(dir.path()).unwrap().list().len(), 2);
    }

    #[test]
    fn grants_decide_check_and_visible() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        let a = users
            .add("alice", &[g("photos=rw"), g("logs=ro")])
            .unwrap()
            .access_key;
        let b = users
            .add("bob", &[g("*=rw"), g("logs=ro")])
            .unwrap()
            .access_key;
        fn k(s: &str) -> Option<&str> {
            Some(s)
        }
        let denied = |r: Result<(), s3s::S3Error>| {
            let e = r.unwrap_err();
            assert_eq!(*e.code(), s3s::S3ErrorCode::AccessDenied);
            e.message().unwrap_or_default().to_string()
        };
        assert!(users.check(k(&a), "photos", Access::Write).is_ok());
        assert!(users.check(k(&a), "logs", Access::Read).is_ok());
        assert!(denied(users.check(k(&a), "logs", Access::Write)).contains("read-only"));
        assert!(denied(users.check(k(&a), "other", Access::Read)).contains("no grant"));
        // `*` gives every bucket; the bucket's own grant wins over it.
        assert!(users.check(k(&b), "other", Access::Write).is_ok());
        denied(users.check(k(&b), "logs", Access::Write));
        // Snapshot buckets: readable with a grant on their bucket, never writable.
        assert!(users
            .check(k(&a), "photos--snap--daily", Access::Read)
            .is_ok());
        denied(users.check(k(&a), "photos--snap--daily", Access::Write));
        denied(users.check(k(&a), "other--snap--daily", Access::Read));
        assert!(users.visible(k(&a), "photos") && users.visible(k(&a), "logs"));
        assert!(!users.visible(k(&a), "other"));
        assert!(users.visible(k(&b), "anything"));
        // Grants change at once and survive a restart.
        users.grant("alice", "other", Access::Read).unwrap();
        assert!(users.visible(k(&a), "other"));
        users.grant("alice", "logs", Access::Write).unwrap();
        assert!(users.check(k(&a), "logs", Access::Write).is_ok());
        let info = users.revoke("alice", "photos").unwrap();
        assert_eq!(info.grants, vec![g("logs=rw"), g("other=ro")]);
        denied(users.check(k(&a), "photos", Access::Read));
        let reopened = Users::open(dir.path()).unwrap();
        assert_eq!(reopened.get("alice").unwrap(), users.get("alice").unwrap());
        assert!(matches!(
            users.revoke("alice", "photos"),
            Err(Error::NoSuchGrant { .. })
        ));
        assert!(matches!(
            users.grant("carol", "x1x", Access::Read),
            Err(Error::NoSuchUser(_))
        ));
        // A removed user's key stops working at once.
        users.remove("alice").unwrap();
        denied(users.check(k(&a), "logs", Access::Read));
        assert!(!users.visible(k(&a), "logs"));
        assert!(users.secret_of(&a).is_err());
        assert!(matches!(users.remove("alice"), Err(Error::NoSuchUser(_))));
        assert!(matches!(users.add("bob", &[]), Err(Error::UserExists(_))));
    }

    #[test]
    fn a_single_key_table_may_do_everything_and_saves_nothing() {
        let users = Users::single("AKEXAMPLE", "secret1");
        assert_eq!(users.secret_of("AKEXAMPLE").unwrap().expose(), "secret1");
        assert!(users.check(Some("AKEXAMPLE"), "any", Access::Write).is_ok());
        assert!(users.check(None, "any", Access::Read).is_err());
        users.add("bob", &[]).unwrap();
        assert_eq!(users.list().len(), 2);
    }

    #[test]
    fn anonymous_is_refused_unless_configured() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        assert!(!users.anonymous_allowed());
        let e = users.check(None, "photos", Access::Read).unwrap_err();
        assert_eq!(*e.code(), s3s::S3ErrorCode::AccessDenied);
        assert!(e.message().unwrap_or_default().contains("anonymous"));
        assert!(!users.visible(None, "photos"));
        let users = users.with_anonymous(parse_anonymous("public=ro, drop=rw").unwrap());
        assert!(users.anonymous_allowed());
        assert!(users.check(None, "public", Access::Read).is_ok());
        assert!(users.check(None, "public", Access::Write).is_err());
        assert!(users.check(None, "drop", Access::Write).is_ok());
        assert!(users.check(None, "photos", Access::Read).is_err());
        assert!(users.visible(None, "public") && !users.visible(None, "photos"));
        assert_eq!(parse_anonymous("off").unwrap(), Grants::new());
        assert_eq!(parse_anonymous("").unwrap(), Grants::new());
        assert_eq!(parse_anonymous("ro").unwrap().get("*"), Some(&Access::Read));
        assert!(parse_anonymous("public=yes").is_err());
        assert!(parse_anonymous("yes").is_err());
    }

    #[test]
    fn bad_names_and_grants_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let users = Users::open(dir.path()).unwrap();
        for (name, why) in [
            ("", "empty"),
            ("-x", "starts with '-'"),
            ("a b", "' '"),
            ("a/b", "'/'"),
        ] {
            let e = users.add(name, &[]).unwrap_err().to_string();
            assert!(e.contains(why), "{name}: {e}");
        }
        assert!(users.add(&"x".repeat(65), &[]).is_err());
        for (grant, why) in [
            ("photos", "BUCKET=ro"),
            ("photos=rwx", "access mode"),
            ("tank/photos=rw", "S3 name"),
            ("ab=rw", "3 to 63"),
            ("Photos=rw", "'P'"),
            ("-photos=rw", "start and end"),
        ] {
            let e = grant.parse::<Grant>().unwrap_err().to_string();
            assert!(e.contains(why), "{grant}: {e}");
        }
        assert!(matches!(
            users.add(
                "ok",
                &[Grant {
                    bucket: "A".into(),
                    access: Access::Read
                }]
            ),
            Err(Error::Invalid(_))
        ));
        assert!(users.list().is_empty());
        assert_eq!(g("*=ro").bucket, "*");
    }

    #[test]
    fn a_newer_format_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        Users::open(dir.path()).unwrap().add("alice", &[]).unwrap();
        let path = dir.path().join(USERS_FILE);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"format\": 1", "\"format\": 2");
        std::fs::write(&path, text).unwrap();
        let e = Users::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("format 2"), "{e}");
        std::fs::write(&path, "not json").unwrap();
        assert!(matches!(
            Users::open(dir.path()),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn sig_v2_is_refused() {
        let mut h = http::HeaderMap::new();
        assert!(!SigV4Only::is_v2(&h, Some("list-type=2&prefix=a")));
        assert!(SigV4Only::is_v2(
            &h,
            Some("AWSAccessKeyId=K&Expires=1&Signature=x")
        ));
        assert!(!SigV4Only::is_v2(
            &h,
            Some("X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=x")
        ));
        h.insert(http::header::AUTHORIZATION, "AWS K:sig".parse().unwrap());
        assert!(SigV4Only::is_v2(&h, None));
        h.insert(
            http::header::AUTHORIZATION,
            "AWS4-HMAC-SHA256 Credential=K/20260101/us-east-1/s3/aws4_request"
                .parse()
                .unwrap(),
        );
        assert!(!SigV4Only::is_v2(&h, None));
    }
}
