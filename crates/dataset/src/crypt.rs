//! Encryption at rest per dataset, as ZFS native encryption (decision 0026).
//!
//! An *encryption root* is a dataset created with `encryption=on`; it has a
//! random master key, kept in its record only wrapped by the user's key
//! (`keyformat`, `keylocation`, PBKDF2 salt and iterations). Its children and
//! clones are encrypted with the same master key (their record names the
//! root). Loaded keys live here, in memory only, zeroized when dropped.
//! Blocks (and embedded blocks, object attributes) are sealed in the txg
//! commit; intent-log payloads are sealed when logged.

use crate::props::DatasetRecord;
use crate::txg::ImportedPool;
use crate::{Error, Result};
use block::crypt::{KeyFormat, MasterKey, WrappingKey, SALT_LEN};
use meta::redb::{ReadableDatabase, ReadableTable};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use zeroize::Zeroizing;

/// Properties `create` takes for encryption; none are stored in `local`.
pub const CRYPT_PROPS: &[&str] = &["encryption", "keyformat", "keylocation", "pbkdf2iters"];
pub const ALGO: &str = "aes-256-gcm";

/// What a dataset record keeps about its encryption.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CryptRecord {
    /// The encryption root's record id (this dataset's own for a root).
    pub root: u64,
    pub algo: String,
    /// Encryption roots only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrap: Option<WrapRecord>,
    /// How its directory names are stored (decision 0035): 0 in the clear
    /// (datasets made before it; absent in their records), 1 sealed
    /// (`namerow::NAMES_SEALED`). A clone keeps its origin's: it reads
    /// the origin's rows.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub names: u8,
    /// Not an encryption root any more (`change-key -i`): its master key
    /// (`root` is still its own id) is wrapped by the master key of
    /// `wrapped_by.root`, whose encryption root loads it (decision 0035).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapped_by: Option<InheritedWrap>,
}

/// A master key wrapped by another dataset's master key (`change-key -i`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InheritedWrap {
    /// The key id (a `CryptRecord::root`) whose master key wraps this one.
    pub root: u64,
    /// The key id the associated data names (the dataset that ran
    /// `change-key -i`; kept when promote moves the key).
    pub aad_id: u64,
    /// hex: nonce | wrapped key | tag
    pub wrapped: String,
}

/// The encryption root whose user key opens key id `key`: itself, or up
/// the `wrapped_by` links (`change-key -i`).
pub(crate) fn user_root(datasets: &BTreeMap<String, DatasetRecord>, key: u64) -> u64 {
    let mut k = key;
    for _ in 0..crate::blockmap::MAX_CHAIN {
        let next = datasets
            .values()
            .find(|d| d.id == k)
            .and_then(|d| d.crypt.as_ref())
            .and_then(|c| c.wrapped_by.as_ref())
            .map(|w| w.root);
        match next {
            Some(n) if n != k => k = n,
            _ => break,
        }
    }
    k
}

/// Key ids (`CryptRecord::root` values) whose user key is `root`'s.
fn key_ids_of(datasets: &BTreeMap<String, DatasetRecord>, root: u64) -> Vec<u64> {
    let mut ids: Vec<u64> = datasets
        .values()
        .filter_map(|d| d.crypt.as_ref().map(|c| c.root))
        .filter(|k| user_root(datasets, *k) == root)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// The wrapping key a master key gives the keys it wraps (`change-key -i`):
/// derived (keyed blake3, its own context), never the master key itself.
fn inherited_wrapping_key(parent: &MasterKey) -> Result<WrappingKey> {
    let k = Zeroizing::new(parent.name_hash(b"cistern 2026 inherited wrapping key", &[]));
    WrappingKey::derive(KeyFormat::Raw, &k[..], &[0u8; SALT_LEN], 0)
        .map_err(|e| Error::Io(e.to_string()))
}

fn inherited_aad(key: u64) -> Vec<u8> {
    format!("cistern master key {key} wrapped by its parent's").into_bytes()
}

/// Loads the keys wrapped (transitively) by the loaded key `key`.
fn load_wrapped(p: &ImportedPool, key: u64, unloading: bool) -> Result<()> {
    let mut todo = vec![key];
    for _ in 0..4096 {
        let Some(k) = todo.pop() else { return Ok(()) };
        let Some(master) = p.keys.get(k) else {
            continue;
        };
        let wrapped: Vec<(u64, InheritedWrap)> = p
            .datasets
            .read()
            .values()
            .filter_map(|d| {
                let c = d.crypt.as_ref()?;
                let w = c.wrapped_by.as_ref()?;
                (w.root == k && c.root == d.id).then(|| (d.id, w.clone()))
            })
            .collect();
        let wk = inherited_wrapping_key(&master)?;
        for (id, w) in wrapped {
            let bytes =
                unhex(&w.wrapped).ok_or_else(|| Error::Corrupt("stored wrapped key".into()))?;
            let m = wk.unwrap(&bytes, &inherited_aad(w.aad_id)).map_err(|_| {
                Error::Corrupt(format!(
                    "dataset {id}: its inherited key fails authentication"
                ))
            })?;
            p.keys.keys.write().insert(
                id,
                Loaded {
                    key: Arc::new(m),
                    unloading,
                },
            );
            todo.push(id);
        }
    }
    Ok(())
}

fn is_zero(v: &u8) -> bool {
    *v == 0
}

/// The master key wrapped by the user's key, and how to derive that key.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrapRecord {
    pub keyformat: String,
    pub keylocation: String,
    /// hex
    pub salt: String,
    pub iters: u32,
    /// hex: nonce | wrapped key | tag
    pub wrapped: String,
    /// The record id the wrap's associated data names, when it is not the
    /// record holding it: a wrap moved to a promoted clone (decision 0035).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aad_root: Option<u64>,
}

impl std::fmt::Debug for WrapRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WrapRecord({}, {})", self.keyformat, self.keylocation)
    }
}

/// Key material as the user gave it (a passphrase, hex digits or raw bytes,
/// hex-encoded on the wire); never printed, zeroized when dropped.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct KeyMaterial(Zeroizing<String>);

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyMaterial(..)")
    }
}

impl KeyMaterial {
    /// From the bytes read (a prompt, a file).
    pub fn from_bytes(b: &[u8]) -> KeyMaterial {
        let mut s = Zeroizing::new(String::with_capacity(b.len() * 2));
        for x in b {
            s.push(char::from_digit((x >> 4) as u32, 16).unwrap_or('0'));
            s.push(char::from_digit((x & 15) as u32, 16).unwrap_or('0'));
        }
        KeyMaterial(s)
    }

    fn bytes(&self) -> Result<Zeroizing<Vec<u8>>> {
        unhex(&self.0).ok_or_else(|| Error::InvalidArgument("key material is not hex".into()))
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    if s.len() % 2 != 0 {
        return None;
    }
    let mut out = Zeroizing::new(Vec::with_capacity(s.len() / 2));
    for pair in s.as_bytes().chunks(2) {
        let h = (pair[0] as char).to_digit(16)?;
        let l = (pair[1] as char).to_digit(16)?;
        out.push((h * 16 + l) as u8);
    }
    Some(out)
}

/// Loaded master keys of a pool's encryption roots, by root id.
#[derive(Default)]
pub struct KeyStore {
    keys: RwLock<HashMap<u64, Loaded>>,
}

struct Loaded {
    key: Arc<MasterKey>,
    /// Being unloaded: new writes refused, the txg commit still seals with it.
    unloading: bool,
}

impl KeyStore {
    pub(crate) fn get(&self, root: u64) -> Option<Arc<MasterKey>> {
        self.keys.read().get(&root).map(|l| l.key.clone())
    }
    fn writable(&self, root: u64) -> bool {
        self.keys.read().get(&root).is_some_and(|l| !l.unloading)
    }
}

impl KeyStore {
    /// Before a promote that may move encryption root `from` to `to`: the
    /// loaded key answers under both ids (readers see either record state).
    pub(crate) fn share(&self, from: u64, to: u64) {
        let mut keys = self.keys.write();
        if let Some(k) = keys.get(&from).map(|l| (l.key.clone(), l.unloading)) {
            keys.entry(to).or_insert(Loaded {
                key: k.0,
                unloading: k.1,
            });
        }
    }

    /// After it: drops the ids no record names as its root any more.
    pub(crate) fn retain_roots(&self, datasets: &BTreeMap<String, DatasetRecord>) {
        self.keys.write().retain(|id, _| {
            datasets
                .values()
                .any(|r| r.crypt.as_ref().is_some_and(|c| c.root == *id))
        });
    }
}

/// `promote`: when the origin is the encryption root the clone inherits
/// from, the root (its wrapped key) moves to the clone and every dataset of
/// that root names the clone, as zfs does; otherwise destroying the demoted
/// origin would take away the key the clone's blocks need. The wrap keeps
/// naming the origin's id in its associated data (`aad_root`), so no user
/// key is needed and no data is rewritten.
pub(crate) fn promote_root(recs: &mut BTreeMap<u64, DatasetRecord>, origin: u64, clone: u64) {
    let is_root = recs
        .get(&origin)
        .and_then(|r| r.crypt.as_ref())
        .is_some_and(|c| c.root == origin && (c.wrap.is_some() || c.wrapped_by.is_some()));
    let inherits = recs
        .get(&clone)
        .and_then(|r| r.crypt.as_ref())
        .is_some_and(|c| c.root == origin);
    if !is_root || !inherits {
        return;
    }
    let Some((mut wrap, by)) = recs
        .get_mut(&origin)
        .and_then(|r| r.crypt.as_mut())
        .map(|c| (c.wrap.take(), c.wrapped_by.take()))
    else {
        return;
    };
    if let Some(w) = wrap.as_mut() {
        w.aad_root.get_or_insert(origin);
    }
    if let Some(c) = recs.get_mut(&clone).and_then(|r| r.crypt.as_mut()) {
        c.wrap = wrap;
        c.wrapped_by = by;
    }
    for r in recs.values_mut() {
        if let Some(c) = r.crypt.as_mut() {
            if c.root == origin {
                c.root = clone;
            }
            if let Some(w) = c.wrapped_by.as_mut().filter(|w| w.root == origin) {
                w.root = clone;
            }
        }
    }
}

/// `destroy`: an encryption root goes only with every dataset using its
/// key (`ids`: what is destroyed), or those left could never be opened.
pub(crate) fn check_destroy(datasets: &BTreeMap<String, DatasetRecord>, ids: &[u64]) -> Result<()> {
    let uses = |c: &CryptRecord, id: u64| {
        (c.root != id && ids.contains(&c.root))
            || c.wrapped_by.as_ref().is_some_and(|w| ids.contains(&w.root))
    };
    if let Some(user) = datasets
        .values()
        .find(|d| !ids.contains(&d.id) && d.crypt.as_ref().is_some_and(|c| uses(c, d.id)))
    {
        let c = user.crypt.as_ref();
        let key = c
            .and_then(|c| c.wrapped_by.as_ref().map(|w| w.root))
            .filter(|k| ids.contains(k))
            .or(c.map(|c| c.root))
            .unwrap_or(0);
        let root = root_name(datasets, key);
        return Err(Error::Busy(format!(
            "cannot destroy '{root}': it is the encryption root of '{}', whose blocks need its key; destroy that too or `cistern promote` it first",
            user.name
        )));
    }
    Ok(())
}

/// `cistern set` of an encryption property (`None`: not one). As zfs:
/// `keylocation` on an encryption root (checked, not read: `load-key`
/// reads it); `keyformat` and `pbkdf2iters` only through `change-key`
/// (they change the wrapping key); `encryption` only at create.
pub(crate) fn set_property(
    p: &ImportedPool,
    name: &str,
    prop: &str,
    value: &str,
) -> Option<Result<()>> {
    let cannot = |why: String| {
        Some(Err(Error::InvalidArgument(format!(
            "cannot set property for '{name}': {why}"
        ))))
    };
    match prop {
        "keylocation" => {}
        "keyformat" | "pbkdf2iters" => {
            return cannot(format!(
                "'{prop}' can only be changed with `cistern change-key -o {prop}=...`"
            ))
        }
        "encryption" => {
            return cannot("'encryption' can only be set when the dataset is created".into())
        }
        _ => return None,
    }
    let done = (|| {
        check_keylocation(value)?;
        let mut rec = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
            let c = crypt_of(&datasets, rec.id).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "cannot set property for '{name}': encryption is not enabled"
                ))
            })?;
            if c.root != rec.id || c.wrap.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "cannot set property for '{name}': keylocation can only be set on the encryption root ('{}')",
                    root_name(&datasets, user_root(&datasets, c.root))
                )));
            }
            rec.clone()
        };
        if let Some(w) = rec.crypt.as_mut().and_then(|c| c.wrap.as_mut()) {
            w.keylocation = value.to_string();
        }
        p.store_dataset(&rec)?;
        tracing::info!(dataset = name, keylocation = value, "keylocation set");
        Ok(())
    })();
    Some(done)
}

/// The encryption of dataset `id` (a snapshot: its dataset's).
pub(crate) fn crypt_of(datasets: &BTreeMap<String, DatasetRecord>, id: u64) -> Option<CryptRecord> {
    let rec = datasets.values().find(|d| d.id == id)?;
    let data = rec.data_id();
    if data == rec.id {
        return rec.crypt.as_deref().cloned();
    }
    datasets
        .values()
        .find(|d| d.id == data)
        .and_then(|d| d.crypt.as_deref().cloned())
}

/// Dataset `id` is not encrypted or its key is loaded.
pub(crate) fn key_loaded(
    p: &ImportedPool,
    datasets: &BTreeMap<String, DatasetRecord>,
    id: u64,
) -> bool {
    crypt_of(datasets, id).is_none_or(|c| p.keys.get(c.root).is_some())
}

/// The keys a txg commit seals each encrypted dataset's blocks with (`None`: not loaded).
pub(crate) fn commit_keys(p: &ImportedPool) -> HashMap<u64, Option<Arc<MasterKey>>> {
    let datasets = p.datasets.read();
    datasets
        .values()
        .filter_map(|r| {
            let c = crypt_of(&datasets, r.id)?;
            Some((r.id, p.keys.get(c.root)))
        })
        .collect()
}

fn root_name_of(datasets: &BTreeMap<String, DatasetRecord>, root: u64) -> String {
    root_name(datasets, root)
}

fn root_name(datasets: &BTreeMap<String, DatasetRecord>, root: u64) -> String {
    datasets
        .values()
        .find(|d| d.id == root)
        .map(|d| d.name.clone())
        .unwrap_or_else(|| format!("dataset {root}"))
}

fn unavailable(datasets: &BTreeMap<String, DatasetRecord>, c: &CryptRecord) -> Error {
    let root = root_name(datasets, c.root);
    Error::KeyUnavailable(format!(
        "encryption key for '{root}' is not loaded: run `cistern load-key {root}`"
    ))
}

impl ImportedPool {
    /// The key that opens dataset `id`'s blocks: `None` if it is not
    /// encrypted, an error naming its encryption root if the key is not loaded.
    pub(crate) fn key_of(&self, id: u64) -> Result<Option<Arc<MasterKey>>> {
        let datasets = self.datasets.read();
        match crypt_of(&datasets, id) {
            None => Ok(None),
            Some(c) => match self.keys.get(c.root) {
                Some(k) => Ok(Some(k)),
                None => Err(unavailable(&datasets, &c)),
            },
        }
    }

    /// The encryption root of dataset `id`, checking its key is loaded for writes.
    pub(crate) fn crypt_root(&self, id: u64) -> Result<Option<u64>> {
        let datasets = self.datasets.read();
        match crypt_of(&datasets, id) {
            None => Ok(None),
            Some(c) if self.keys.writable(c.root) => Ok(Some(c.root)),
            Some(c) => Err(unavailable(&datasets, &c)),
        }
    }

    /// Under the open txg's lock: the key of `root` is still loaded for writes.
    pub(crate) fn check_writable(&self, id: u64, root: Option<u64>) -> Result<()> {
        match root {
            Some(r) if !self.keys.writable(r) => Err(Error::KeyUnavailable(format!(
                "dataset {id}: its encryption key is being unloaded"
            ))),
            _ => Ok(()),
        }
    }

    /// The key that seals dataset `ds`'s intent-log payloads, if it is
    /// encrypted and loaded. Taken BEFORE the open txg's lock: the lock order
    /// is datasets, then open (`ObjectSet::allocate` holds the first while
    /// taking the second), so reading the datasets under `open` deadlocks
    /// once the txg sync waits to write them.
    pub(crate) fn log_key(&self, ds: u64) -> Option<Arc<MasterKey>> {
        self.key_of(ds).ok().flatten()
    }

    /// Seals an intent-log payload with `key` (from [`ImportedPool::log_key`]):
    /// sealed when logged, opened at replay; bound to the dataset, kind and offset.
    pub(crate) fn seal_log(
        key: Option<&MasterKey>,
        ds: u64,
        kind: u8,
        offset: u64,
        payload: &[u8],
    ) -> Option<Vec<u8>> {
        Some(key?.seal(&log_aad(ds, kind, offset), payload))
    }

    /// Appends a volume write to the intent log, its payload sealed when the
    /// dataset is encrypted (as [`ImportedPool::seal_log`]), and only if the
    /// log keeps the record: bulk writes the txg carries are not sealed twice
    /// (decision 0037).
    pub(crate) fn log_write(
        &self,
        key: Option<&MasterKey>,
        ds: u64,
        offset: u64,
        payload: &[u8],
    ) -> u64 {
        let kind = intent_log::RecordKind::Write;
        let len = payload.len() as u64;
        match key {
            None => self.log.append(kind, ds, offset, len, payload),
            Some(key) => {
                let aad = log_aad(ds, kind as u8, offset);
                let sealed_len = payload.len() + block::crypt::NONCE_LEN + block::crypt::TAG_LEN;
                self.log
                    .append_with(kind, ds, offset, len, sealed_len, |f| {
                        f(&key.seal(&aad, payload))
                    })
            }
        }
    }

    /// Opens a logged payload at replay: unchanged for a plain dataset.
    pub(crate) fn open_log(
        &self,
        ds: u64,
        kind: u8,
        offset: u64,
        payload: &[u8],
    ) -> Result<Option<Vec<u8>>> {
        match self.key_of(ds)? {
            None => Ok(None),
            Some(k) => k
                .open(&log_aad(ds, kind, offset), payload)
                .map(Some)
                .map_err(|_| {
                    Error::Corrupt(format!(
                        "intent log record of dataset {ds} fails authentication"
                    ))
                }),
        }
    }

    /// Loads keys whose `keylocation` is a file (as `zfs load-key -a` at
    /// boot), so the intent log of those datasets replays at import. Keys
    /// that fail are logged and left unloaded.
    pub(crate) fn load_file_keys(&self) {
        let roots: Vec<(String, WrapRecord, u64)> = self
            .datasets
            .read()
            .values()
            .filter_map(|r| {
                let c = r.crypt.as_ref()?;
                let w = c.wrap.as_ref()?;
                w.keylocation
                    .starts_with("file://")
                    .then(|| (r.name.clone(), w.clone(), r.id))
            })
            .collect();
        for (name, w, id) in roots {
            match read_key_file(&w.keylocation).and_then(|m| unwrap_master(&name, id, &w, &m)) {
                Ok(k) => {
                    self.keys.keys.write().insert(
                        id,
                        Loaded {
                            key: Arc::new(k),
                            unloading: false,
                        },
                    );
                    if let Err(e) = load_wrapped(self, id, false) {
                        tracing::warn!(dataset = %name, "inherited keys not loaded: {e}");
                    }
                    tracing::info!(dataset = %name, "encryption key loaded from its keylocation");
                }
                Err(e) => {
                    tracing::warn!(dataset = %name, "encryption key not loaded at import: {e}")
                }
            }
        }
    }
}

/// Intent-log records of encrypted datasets whose key was not loaded at
/// import, by (dataset, seq): kind | offset | length | sealed payload.
const LOG_STASH: meta::redb::TableDefinition<(u64, u64), &[u8]> =
    meta::redb::TableDefinition::new("crypt_log_stash");

impl ImportedPool {
    /// A log record of dataset `ds` that cannot be opened now.
    pub(crate) fn log_needs_key(&self, ds: u64) -> bool {
        let datasets = self.datasets.read();
        crypt_of(&datasets, ds).is_some_and(|c| self.keys.get(c.root).is_none())
    }
}

/// Keeps `recs` in the metadata store (durable before the import's txg trims the log).
pub(crate) fn stash_records(p: &ImportedPool, recs: &[intent_log::LogRecord]) -> Result<()> {
    if recs.is_empty() {
        return Ok(());
    }
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(crate::txg::meta_err)?;
    {
        let mut t = tx.open_table(LOG_STASH).map_err(crate::txg::meta_err)?;
        for r in recs {
            let mut v = Vec::with_capacity(17 + r.payload.len());
            v.push(r.kind as u8);
            v.extend_from_slice(&r.offset.to_le_bytes());
            v.extend_from_slice(&r.length.to_le_bytes());
            v.extend_from_slice(&r.payload);
            t.insert((r.dataset, r.seq), v.as_slice())
                .map_err(crate::txg::meta_err)?;
        }
    }
    tx.commit().map_err(crate::txg::meta_err)?;
    tracing::info!(
        records = recs.len(),
        "intent log records of encrypted datasets kept until their keys are loaded"
    );
    Ok(())
}

/// Replays the stashed records of `ids` (in log order), then commits and forgets them.
fn replay_stash(p: &ImportedPool, ids: &[u64]) -> Result<usize> {
    let mut recs = Vec::new();
    {
        let tx = p.db().begin_read().map_err(crate::txg::meta_err)?;
        let t = match tx.open_table(LOG_STASH) {
            Ok(t) => t,
            Err(meta::redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(crate::txg::meta_err(e)),
        };
        for &ds in ids {
            for row in t
                .range((ds, 0)..=(ds, u64::MAX))
                .map_err(crate::txg::meta_err)?
            {
                let (k, v) = row.map_err(crate::txg::meta_err)?;
                let (ds, seq) = k.value();
                let v = v.value();
                let kind = v
                    .first()
                    .and_then(|k| intent_log::RecordKind::from_u8(*k))
                    .filter(|_| v.len() >= 17)
                    .ok_or_else(|| Error::Corrupt(format!("stashed log record {ds}/{seq}")))?;
                let u64_at = |o: usize| {
                    let mut a = [0u8; 8];
                    a.copy_from_slice(&v[o..o + 8]);
                    u64::from_le_bytes(a)
                };
                recs.push(intent_log::LogRecord {
                    seq,
                    kind,
                    dataset: ds,
                    offset: u64_at(1),
                    length: u64_at(9),
                    payload: v[17..].to_vec(),
                });
            }
        }
    }
    if recs.is_empty() {
        return Ok(0);
    }
    recs.sort_by_key(|r| r.seq);
    let n = recs.len();
    let keys: Vec<(u64, u64)> = recs.iter().map(|r| (r.dataset, r.seq)).collect();
    for r in recs {
        p.replay(r)?;
    }
    p.sync_txg()?;
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(crate::txg::meta_err)?;
    {
        let mut t = tx.open_table(LOG_STASH).map_err(crate::txg::meta_err)?;
        for k in keys {
            t.remove(k).map_err(crate::txg::meta_err)?;
        }
    }
    tx.commit().map_err(crate::txg::meta_err)?;
    Ok(n)
}

/// At import: stashed records of datasets whose keys loaded from their
/// keylocation (none of them was written since: a dataset with stashed
/// records takes writes only once they are replayed).
pub(crate) fn replay_loaded_stash(p: &ImportedPool) -> Result<()> {
    let ids: Vec<u64> = {
        let datasets = p.datasets.read();
        datasets
            .values()
            .filter(|r| crypt_of(&datasets, r.id).is_some_and(|c| p.keys.get(c.root).is_some()))
            .map(|r| r.id)
            .collect()
    };
    if !ids.is_empty() {
        let n = replay_stash(p, &ids)?;
        if n > 0 {
            tracing::info!(
                records = n,
                "kept intent log records of encrypted datasets replayed"
            );
        }
    }
    Ok(())
}

fn log_aad(ds: u64, kind: u8, offset: u64) -> [u8; 21] {
    let mut a = [0u8; 21];
    a[..4].copy_from_slice(b"clog");
    a[4..12].copy_from_slice(&ds.to_le_bytes());
    a[12] = kind;
    a[13..21].copy_from_slice(&offset.to_le_bytes());
    a
}

fn wrap_aad(root: u64) -> Vec<u8> {
    format!("cistern wrapped master key of root {root}").into_bytes()
}

fn read_key_file(location: &str) -> Result<KeyMaterial> {
    let path = location.strip_prefix("file://").ok_or_else(|| {
        Error::InvalidArgument(format!(
            "keylocation '{location}': the key must be given (prompt)"
        ))
    })?;
    let meta = std::fs::metadata(path)
        .map_err(|e| Error::InvalidArgument(format!("cannot read key file '{path}': {e}")))?;
    if meta.len() > 4096 {
        return Err(Error::InvalidArgument(format!(
            "key file '{path}' is larger than 4096 bytes"
        )));
    }
    let b = Zeroizing::new(
        std::fs::read(path)
            .map_err(|e| Error::InvalidArgument(format!("cannot read key file '{path}': {e}")))?,
    );
    Ok(KeyMaterial::from_bytes(&b))
}

fn check_keylocation(v: &str) -> Result<()> {
    if v == "prompt" || v.strip_prefix("file:///").is_some() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "bad keylocation '{v}': expected prompt or file:///absolute/path"
        )))
    }
}

fn derive(w: &WrapRecord, material: &KeyMaterial) -> Result<WrappingKey> {
    let format: KeyFormat = w.keyformat.parse().map_err(Error::InvalidArgument)?;
    let salt_v = unhex(&w.salt).filter(|s| s.len() == SALT_LEN);
    let salt_v = salt_v.ok_or_else(|| Error::Corrupt("stored key salt".into()))?;
    let mut salt = [0u8; SALT_LEN];
    salt.copy_from_slice(&salt_v);
    WrappingKey::derive(format, &material.bytes()?, &salt, w.iters)
        .map_err(|e| Error::InvalidArgument(e.to_string()))
}

fn unwrap_master(name: &str, root: u64, w: &WrapRecord, m: &KeyMaterial) -> Result<MasterKey> {
    let wk = derive(w, m)?;
    let wrapped = unhex(&w.wrapped).ok_or_else(|| Error::Corrupt("stored wrapped key".into()))?;
    wk.unwrap(&wrapped, &wrap_aad(w.aad_root.unwrap_or(root)))
        .map_err(|_| Error::KeyUnavailable(format!("incorrect key provided for '{name}'")))
}

/// A new wrap of `master` for root `root` under the key given in `format`.
fn new_wrap(
    root: u64,
    master: &MasterKey,
    format: &str,
    location: &str,
    iters: u32,
    material: &KeyMaterial,
) -> Result<WrapRecord> {
    let mut salt = [0u8; SALT_LEN];
    block::crypt::random_bytes(&mut salt).map_err(|e| Error::Io(e.to_string()))?;
    let mut w = WrapRecord {
        keyformat: format.to_string(),
        keylocation: location.to_string(),
        salt: hex(&salt),
        iters,
        wrapped: String::new(),
        aad_root: None,
    };
    let wk = derive(&w, material)?;
    w.wrapped = hex(&wk.wrap(master, &wrap_aad(root)));
    Ok(w)
}

/// The encryption options of `create`/`change-key`, taken out of the properties.
pub(crate) struct CryptOptions {
    encryption: Option<String>,
    keyformat: Option<String>,
    keylocation: Option<String>,
    iters: Option<u32>,
}

pub(crate) fn take_options(
    props: &[(String, String)],
) -> Result<(CryptOptions, Vec<(String, String)>)> {
    let mut o = CryptOptions {
        encryption: None,
        keyformat: None,
        keylocation: None,
        iters: None,
    };
    let mut rest = Vec::new();
    for (k, v) in props {
        match k.as_str() {
            "encryption" => {
                o.encryption = Some(match v.as_str() {
                    "on" | ALGO => ALGO.to_string(),
                    "off" => "off".to_string(),
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "bad encryption '{v}': expected on, off or {ALGO}"
                        )))
                    }
                })
            }
            "keyformat" => {
                v.parse::<KeyFormat>().map_err(Error::InvalidArgument)?;
                o.keyformat = Some(v.clone());
            }
            "keylocation" => {
                check_keylocation(v)?;
                o.keylocation = Some(v.clone());
            }
            "pbkdf2iters" => {
                let n: u32 = v
                    .parse()
                    .ok()
                    .filter(|n| *n >= block::crypt::MIN_PBKDF2_ITERS)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "bad pbkdf2iters '{v}': at least {}",
                            block::crypt::MIN_PBKDF2_ITERS
                        ))
                    })?;
                o.iters = Some(n);
            }
            _ => rest.push((k.clone(), v.clone())),
        }
    }
    Ok((o, rest))
}

/// The encryption a new dataset `name` gets: a new encryption root when
/// asked (`encryption=on`, or a key format given), else its parent's.
/// The caller fills in the root id of a new root ([`finish_root`]).
pub(crate) fn for_create(
    p: &ImportedPool,
    datasets: &BTreeMap<String, DatasetRecord>,
    name: &str,
    o: &CryptOptions,
    material: Option<&KeyMaterial>,
) -> Result<Option<(CryptRecord, Option<PendingRoot>)>> {
    let parent = name
        .rsplit_once('/')
        .and_then(|(parent, _)| datasets.get(parent));
    let inherited = parent.and_then(|r| crypt_of(datasets, r.id));
    let wants = match o.encryption.as_deref() {
        Some("off") => {
            if inherited.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "cannot create '{name}': encryption=off under an encrypted parent (as zfs)"
                )));
            }
            if o.keyformat.is_some() || o.keylocation.is_some() {
                return Err(Error::InvalidArgument(format!(
                    "cannot create '{name}': keyformat and keylocation need encryption"
                )));
            }
            return Ok(None);
        }
        Some(_) => true,
        None => o.keyformat.is_some(),
    };
    if !wants {
        if o.keylocation.is_some() || o.iters.is_some() {
            return Err(Error::InvalidArgument(format!(
                "cannot create '{name}': keylocation and pbkdf2iters need a new encryption root (-o encryption=on -o keyformat=...)"
            )));
        }
        // Children share their parent's encryption root (and its key).
        if let Some(c) = inherited {
            if p.keys.get(c.root).is_none() {
                return Err(unavailable(datasets, &c));
            }
            return Ok(Some((
                CryptRecord {
                    root: c.root,
                    algo: c.algo,
                    wrap: None,
                    // Its own rows: the current layout, whatever the parent's.
                    names: crate::namerow::NAMES_SEALED,
                    wrapped_by: None,
                },
                None,
            )));
        }
        return Ok(None);
    }
    let keyformat = o.keyformat.clone().ok_or_else(|| {
        Error::InvalidArgument(format!(
            "cannot create '{name}': Keyformat required for new encryption root (-o keyformat=passphrase|hex|raw)"
        ))
    })?;
    let keylocation = o.keylocation.clone().unwrap_or_else(|| "prompt".into());
    let material = match material {
        Some(m) if keylocation == "prompt" => m.clone(),
        Some(_) => {
            return Err(Error::InvalidArgument(format!(
                "cannot create '{name}': a key was given but keylocation is {keylocation}"
            )))
        }
        None if keylocation == "prompt" => {
            return Err(Error::InvalidArgument(format!(
                "cannot create '{name}': keylocation=prompt: give the key on standard input"
            )))
        }
        None => read_key_file(&keylocation)?,
    };
    let master = MasterKey::generate().map_err(|e| Error::Io(e.to_string()))?;
    let iters = o.iters.unwrap_or(if keyformat == "passphrase" {
        block::crypt::DEFAULT_PBKDF2_ITERS
    } else {
        0
    });
    Ok(Some((
        CryptRecord {
            root: 0,
            algo: o.encryption.clone().unwrap_or_else(|| ALGO.into()),
            wrap: None,
            names: crate::namerow::NAMES_SEALED,
            wrapped_by: None,
        },
        Some(PendingRoot {
            master: Arc::new(master),
            keyformat,
            keylocation,
            iters,
            material,
        }),
    )))
}

/// The encryption of a dataset being created (a new root: its pending key).
pub(crate) type NewCrypt = Option<(CryptRecord, Option<PendingRoot>)>;

/// A new encryption root before its record id is known.
pub(crate) struct PendingRoot {
    master: Arc<MasterKey>,
    keyformat: String,
    keylocation: String,
    iters: u32,
    material: KeyMaterial,
}

/// Completes a new encryption root once its record id is known: wraps
/// the key for that id and loads it.
pub(crate) fn finish_root(id: u64, c: &mut CryptRecord, r: &PendingRoot) -> Result<()> {
    let w = new_wrap(
        id,
        &r.master,
        &r.keyformat,
        &r.keylocation,
        r.iters,
        &r.material,
    )?;
    c.root = id;
    c.wrap = Some(w);
    Ok(())
}

/// Loads a new root's key once its record is stored.
pub(crate) fn load_new_root(p: &ImportedPool, id: u64, r: PendingRoot) {
    p.keys.keys.write().insert(
        id,
        Loaded {
            key: r.master,
            unloading: false,
        },
    );
}

/// Records metadata format 5 (`meta::META_FORMAT_SEALED_NAMES`, which
/// implies 4, `META_FORMAT_ENCRYPTION`) before the pool's first encrypted
/// dataset with sealed names exists: builds before encryption, or before
/// sealed names (decision 0035), refuse the pool by name.
fn mark_encryption_active(p: &ImportedPool) -> Result<()> {
    use meta::schema::{POOL_RECORDS, RECORD_FORMAT};
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(crate::txg::meta_err)?;
    {
        let mut r = tx.open_table(POOL_RECORDS).map_err(crate::txg::meta_err)?;
        let now = r
            .get(RECORD_FORMAT)
            .map_err(crate::txg::meta_err)?
            .map_or(0, |v| v.value());
        if now >= meta::META_FORMAT_SEALED_NAMES {
            return Ok(());
        }
        r.insert(RECORD_FORMAT, meta::META_FORMAT_SEALED_NAMES)
            .map_err(crate::txg::meta_err)?;
    }
    tx.commit().map_err(crate::txg::meta_err)?;
    tracing::info!(pool = %p.pool.name, "metadata format 5: encryption with sealed names in use (builds before it refuse this pool)");
    Ok(())
}

/// Sets up the encryption of a new dataset record (`create`); returns the
/// properties left for the caller. Call [`after_store`] once stored.
pub(crate) fn prepare_create(
    p: &ImportedPool,
    name: &str,
    props: &[(String, String)],
    material: Option<&KeyMaterial>,
) -> Result<(NewCrypt, Vec<(String, String)>)> {
    let (o, rest) = take_options(props)?;
    let c = for_create(p, &p.datasets.read(), name, &o, material)?;
    if matches!(&c, Some((r, _)) if r.names >= crate::namerow::NAMES_SEALED) {
        mark_encryption_active(p)?;
    }
    if c.is_none() && material.is_some() {
        return Err(Error::InvalidArgument(format!(
            "cannot create '{name}': a key was given but the dataset is not encrypted"
        )));
    }
    Ok((c, rest))
}

/// The crypt record of a new dataset with id `id` (wraps a new root's key for it).
pub(crate) fn record_for(id: u64, c: &mut NewCrypt) -> Result<Option<Box<CryptRecord>>> {
    match c {
        None => Ok(None),
        Some((rec, pending)) => {
            if let Some(r) = pending {
                finish_root(id, rec, r)?;
            }
            Ok(Some(Box::new(rec.clone())))
        }
    }
}

pub(crate) fn after_store(p: &ImportedPool, id: u64, c: NewCrypt) {
    if let Some((_, Some(r))) = c {
        load_new_root(p, id, r);
    }
}

/// Key properties shown by `get` (never key material).
pub(crate) fn properties(
    p: &ImportedPool,
    datasets: &BTreeMap<String, DatasetRecord>,
    rec: &DatasetRecord,
) -> Vec<crate::Property> {
    let prop = |name: &str, v: String, source: &str| crate::Property {
        name: name.into(),
        parsable: v.clone(),
        value: v,
        source: source.into(),
    };
    let Some(c) = crypt_of(datasets, rec.id) else {
        return vec![
            prop("encryption", "off".into(), "default"),
            prop("keylocation", "none".into(), "default"),
            prop("keyformat", "none".into(), "default"),
            prop("keystatus", "-".into(), "-"),
            prop("encryptionroot", "-".into(), "-"),
        ];
    };
    let user = user_root(datasets, c.root);
    let root = datasets.values().find(|d| d.id == user);
    let w = root
        .and_then(|r| r.crypt.as_ref())
        .and_then(|c| c.wrap.clone());
    let is_root = rec.data_id() == user && !rec.is_snapshot();
    let root_name = root_name(datasets, user);
    let src = if is_root {
        "local".to_string()
    } else {
        format!("inherited from {root_name}")
    };
    let status = if p.keys.get(c.root).is_some() {
        "available"
    } else {
        "unavailable"
    };
    vec![
        prop("encryption", c.algo.clone(), "-"),
        prop(
            "keylocation",
            if is_root {
                w.as_ref().map_or("none".into(), |w| w.keylocation.clone())
            } else {
                "none".into()
            },
            if is_root { "local" } else { "default" },
        ),
        prop(
            "keyformat",
            w.as_ref().map_or("none".into(), |w| w.keyformat.clone()),
            "-",
        ),
        prop("keystatus", status.into(), "-"),
        prop("encryptionroot", root_name, "-"),
        prop(
            "pbkdf2iters",
            w.as_ref().map_or(0, |w| w.iters).to_string(),
            if is_root { "local" } else { &src },
        ),
    ]
}

impl crate::Engine {
    /// The encryption root of `name`, and its wrap record.
    fn root_of(&self, name: &str) -> Result<(Arc<ImportedPool>, String, u64, WrapRecord)> {
        let (pool, _) = crate::names::split_dataset(name)?;
        let p = self.pool(pool)?;
        let datasets = p.datasets.read();
        let rec = datasets
            .get(name)
            .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
        let c = crypt_of(&datasets, rec.id).ok_or_else(|| {
            Error::InvalidArgument(format!("'{name}': encryption is not enabled"))
        })?;
        let user = user_root(&datasets, c.root);
        let root = datasets
            .values()
            .find(|d| d.id == user)
            .ok_or_else(|| Error::Corrupt(format!("'{name}': encryption root is gone")))?;
        let w = root
            .crypt
            .as_ref()
            .and_then(|c| c.wrap.clone())
            .ok_or_else(|| Error::Corrupt(format!("'{}': no wrapped key", root.name)))?;
        let root_name = root.name.clone();
        drop(datasets);
        Ok((p, root_name, user, w))
    }

    /// Names of encryption roots (`-a`).
    pub fn encryption_roots(&self) -> Vec<String> {
        let mut out = Vec::new();
        for p in self.inner.pools.read().values() {
            out.extend(
                p.datasets
                    .read()
                    .values()
                    .filter(|r| r.crypt.as_ref().is_some_and(|c| c.wrap.is_some()))
                    .map(|r| r.name.clone()),
            );
        }
        out.sort();
        out
    }

    /// `cistern load-key [-n] [-L LOCATION] DS`: the key of an encryption
    /// root (`material` for prompt; else read from the keylocation).
    /// `noop`: check the key only.
    pub fn load_key(
        &self,
        name: &str,
        location: Option<&str>,
        material: Option<&KeyMaterial>,
        noop: bool,
    ) -> Result<()> {
        let (p, root_name, root, w) = self.root_of(name)?;
        if root_name != name {
            return Err(Error::InvalidArgument(format!(
                "Keys must be loaded for encryption root of '{name}' ({root_name})"
            )));
        }
        if !noop && p.keys.get(root).is_some() {
            return Err(Error::AlreadyExists(format!("Key for '{name}' (loaded)")));
        }
        let location = location.unwrap_or(&w.keylocation);
        check_keylocation(location)?;
        let m = match material {
            Some(m) => m.clone(),
            None => read_key_file(location)?,
        };
        let key = unwrap_master(name, root, &w, &m)?;
        if noop {
            return Ok(());
        }
        // Closed to writes until what the log kept for these datasets is replayed.
        p.keys.keys.write().insert(
            root,
            Loaded {
                key: Arc::new(key),
                unloading: true,
            },
        );
        let (keys, ids) = {
            let datasets = p.datasets.read();
            let keys = key_ids_of(&datasets, root);
            let ids: Vec<u64> = datasets
                .values()
                .filter(|r| crypt_of(&datasets, r.id).is_some_and(|c| keys.contains(&c.root)))
                .map(|r| r.id)
                .collect();
            (keys, ids)
        };
        let caught_up = load_wrapped(&p, root, true)
            .and_then(|()| replay_stash(&p, &ids))
            .and_then(|n| {
                let drained = crate::objects::drain_unlinked_where(&p, |_, id| ids.contains(&id))?;
                if drained > 0 {
                    p.sync_txg()?;
                }
                Ok((n, drained))
            });
        match caught_up {
            Ok((n, drained)) => {
                for k in &keys {
                    if let Some(l) = p.keys.keys.write().get_mut(k) {
                        l.unloading = false;
                    }
                }
                tracing::info!(
                    dataset = name,
                    replayed = n,
                    drained,
                    "encryption key loaded"
                );
                Ok(())
            }
            Err(e) => {
                for k in &keys {
                    p.keys.keys.write().remove(k);
                }
                Err(e)
            }
        }
    }

    /// `cistern unload-key DS`: refused while a dataset under the root is
    /// served (exported to an NBD client, mounted); else its writes are
    /// committed and the key forgotten (zeroized).
    pub fn unload_key(&self, name: &str) -> Result<()> {
        let (p, root_name, root, _) = self.root_of(name)?;
        if root_name != name {
            return Err(Error::InvalidArgument(format!(
                "Keys must be unloaded for encryption root of '{name}' ({root_name})"
            )));
        }
        if p.keys.get(root).is_none() {
            return Err(Error::InvalidArgument(format!(
                "Key unload error: '{name}' key is not loaded"
            )));
        }
        // Keys it wraps (`change-key -i`) go with it.
        let keys = key_ids_of(&p.datasets.read(), root);
        let users: Vec<String> = {
            let datasets = p.datasets.read();
            datasets
                .values()
                .filter(|r| crypt_of(&datasets, r.id).is_some_and(|c| keys.contains(&c.root)))
                .map(|r| r.name.clone())
                .collect()
        };
        for ds in &users {
            if let Some(h) = self
                .holders(Some(ds))
                .into_iter()
                .find(|h| h.dataset == *ds)
            {
                return Err(Error::Busy(format!(
                    "Key unload error: '{ds}' is busy ({})",
                    h.client
                )));
            }
        }
        {
            // Under the open txg's lock: no write gets in after this.
            let _open = p.open.lock();
            for k in &keys {
                if let Some(l) = p.keys.keys.write().get_mut(k) {
                    l.unloading = true;
                }
            }
        }
        // Everything written before is sealed and committed with the key.
        if let Err(e) = p.sync_txg() {
            for k in &keys {
                if let Some(l) = p.keys.keys.write().get_mut(k) {
                    l.unloading = false;
                }
            }
            return Err(e);
        }
        for k in &keys {
            p.keys.keys.write().remove(k);
        }
        // Decompressed plaintext of these datasets leaves the cache too.
        let ids: Vec<u64> = {
            let datasets = p.datasets.read();
            datasets
                .values()
                .filter(|r| crypt_of(&datasets, r.id).is_some_and(|c| keys.contains(&c.root)))
                .map(|r| r.id)
                .collect()
        };
        for &id in &ids {
            p.cache.forget_dataset(id);
        }
        // And the opened names of its sealed directories (decision 0035).
        crate::namerow::forget(p.pool.guid, &ids);
        tracing::info!(dataset = name, "encryption key unloaded");
        Ok(())
    }

    /// `cistern change-key [-o keyformat=..] [-o keylocation=..] DS`: the
    /// master key rewrapped under a new user key; no data is rewritten.
    pub fn change_key(
        &self,
        name: &str,
        props: &[(String, String)],
        material: Option<&KeyMaterial>,
    ) -> Result<()> {
        let (o, rest) = take_options(props)?;
        if let Some((k, _)) = rest.first() {
            return Err(Error::InvalidArgument(format!(
                "change-key takes keyformat, keylocation and pbkdf2iters, not '{k}'"
            )));
        }
        if o.encryption.is_some() {
            return Err(Error::InvalidArgument(
                "change-key cannot change the encryption algorithm".into(),
            ));
        }
        let (p, root_name, root, w) = self.root_of(name)?;
        if root_name != name {
            return Err(Error::InvalidArgument(format!(
                "'{name}' is not an encryption root (its root is '{root_name}')"
            )));
        }
        let master = p.keys.get(root).ok_or_else(|| {
            Error::KeyUnavailable(format!("Key change error: Key must be loaded for '{name}'"))
        })?;
        let format = o.keyformat.unwrap_or(w.keyformat.clone());
        let location = o.keylocation.unwrap_or(w.keylocation.clone());
        let iters = o.iters.unwrap_or(if format == "passphrase" {
            w.iters.max(block::crypt::DEFAULT_PBKDF2_ITERS)
        } else {
            0
        });
        let m = match material {
            Some(m) => m.clone(),
            None => read_key_file(&location)?,
        };
        let neww = new_wrap(root, &master, &format, &location, iters, &m)?;
        let mut rec = p
            .datasets
            .read()
            .values()
            .find(|d| d.id == root)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
        if let Some(c) = rec.crypt.as_mut() {
            c.wrap = Some(neww);
        }
        p.store_dataset(&rec)?;
        tracing::info!(dataset = name, "encryption key changed");
        Ok(())
    }

    /// `cistern change-key -i DS`: the encryption root `DS` inherits its
    /// parent's key, as zfs: it stops being an encryption root, and its
    /// master key is wrapped by the master key of its parent's (so loading
    /// the parent's root loads it). No data is rewritten. Both keys must be
    /// loaded.
    pub fn change_key_inherit(&self, name: &str) -> Result<()> {
        let (p, root_name, root, _) = self.root_of(name)?;
        if root_name != name {
            return Err(Error::InvalidArgument(format!(
                "Key change error: '{name}' is not an encryption root (its root is '{root_name}')"
            )));
        }
        let (mut rec, parent_key) = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(name)
                .cloned()
                .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
            let parent = name
                .rsplit_once('/')
                .and_then(|(parent, _)| datasets.get(parent))
                .and_then(|r| crypt_of(&datasets, r.id));
            let Some(parent) = parent else {
                return Err(Error::InvalidArgument(format!(
                    "Key change error: Root dataset's key cannot be inherited: the parent of '{name}' is not encrypted"
                )));
            };
            if key_ids_of(&datasets, root).contains(&parent.root) {
                return Err(Error::InvalidArgument(format!(
                    "Key change error: the parent of '{name}' uses its key already"
                )));
            }
            (rec, parent.root)
        };
        let unloaded = |what: &str| {
            Error::KeyUnavailable(format!("Key change error: Key must be loaded for '{what}'"))
        };
        let own = p.keys.get(root).ok_or_else(|| unloaded(name))?;
        let pk = p.keys.get(parent_key).ok_or_else(|| {
            let datasets = p.datasets.read();
            unloaded(&root_name_of(&datasets, user_root(&datasets, parent_key)))
        })?;
        let wrapped = inherited_wrapping_key(&pk)?.wrap(&own, &inherited_aad(root));
        if let Some(c) = rec.crypt.as_mut() {
            c.wrap = None;
            c.wrapped_by = Some(InheritedWrap {
                root: parent_key,
                aad_id: root,
                wrapped: hex(&wrapped),
            });
        }
        p.store_dataset(&rec)?;
        tracing::info!(dataset = name, "encryption key inherited from the parent");
        Ok(())
    }
}
