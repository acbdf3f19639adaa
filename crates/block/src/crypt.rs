//! Encryption at rest (decision 0026), as ZFS native encryption.
//!
//! Each encryption root has a random 256-bit *master key*; it encrypts every
//! block (after compression, before the checksum: the checksum is over the
//! ciphertext, so scrub and resilver need no key) with AES-256-GCM, a random
//! 96-bit nonce and the 128-bit tag kept in the block pointer. The associated
//! data binds a block to where it belongs (object, block, birth txg, sizes,
//! compression), so a block moved to another place or txg fails to open.
//! The master key is stored only *wrapped* (AES-256-GCM) by the user's
//! wrapping key: a passphrase through PBKDF2-HMAC-SHA512 with a stored salt
//! and iteration count (ZFS's `pbkdf2iters`), or 32 bytes given as hex or
//! raw. `change-key` rewraps the master key; no data is rewritten.
//! Key bytes are zeroized when dropped and never printed (`Debug` is opaque).

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, KeyInit, Nonce, Tag};
use rand::TryRngCore;
use std::fmt;
use zeroize::Zeroizing;

pub const KEY_LEN: usize = 32;
pub const NONCE_LEN: usize = 12;
pub const TAG_LEN: usize = 16;
pub const SALT_LEN: usize = 16;
/// nonce | wrapped master key | tag.
pub const WRAPPED_LEN: usize = NONCE_LEN + KEY_LEN + TAG_LEN;
/// ZFS's default and minimum `pbkdf2iters`.
pub const DEFAULT_PBKDF2_ITERS: u32 = 350_000;
pub const MIN_PBKDF2_ITERS: u32 = 100_000;

/// The cipher recorded in a block pointer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CryptAlgo {
    Aes256Gcm = 1,
}

impl CryptAlgo {
    pub fn from_code(code: u8) -> Option<Self> {
        (code == 1).then_some(CryptAlgo::Aes256Gcm)
    }
}

impl fmt::Display for CryptAlgo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("aes-256-gcm")
    }
}

/// Nonce and tag of an encrypted block: what its pointer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCrypt {
    pub algo: CryptAlgo,
    pub nonce: [u8; NONCE_LEN],
    pub tag: [u8; TAG_LEN],
}

/// Where a block belongs: the associated data of its AEAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockId {
    pub object: u64,
    pub block: u64,
    pub birth: u64,
    pub lsize: u32,
    pub psize: u32,
    pub compression: u8,
}

impl BlockId {
    fn aad(&self) -> [u8; 45] {
        let mut a = [0u8; 45];
        a[..4].copy_from_slice(b"cbp2");
        a[4..12].copy_from_slice(&self.object.to_le_bytes());
        a[12..20].copy_from_slice(&self.block.to_le_bytes());
        a[20..28].copy_from_slice(&self.birth.to_le_bytes());
        a[28..32].copy_from_slice(&self.lsize.to_le_bytes());
        a[32..36].copy_from_slice(&self.psize.to_le_bytes());
        a[36] = self.compression;
        a[37..45].copy_from_slice(b"cistern\0");
        a
    }
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CryptError {
    #[error("authentication failed (wrong key, or the bytes were altered)")]
    Authentication,
    #[error("{0}")]
    BadKey(String),
    #[error("no random numbers from the operating system: {0}")]
    Random(String),
}

/// Fills `buf` from the operating system's generator (keys, salts, nonces).
pub fn random_bytes(buf: &mut [u8]) -> Result<(), CryptError> {
    rand::rngs::OsRng
        .try_fill_bytes(buf)
        .map_err(|e| CryptError::Random(e.to_string()))
}

fn random_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    // Thread-local CSPRNG seeded from the OS: no system call per block.
    rand::Rng::fill(&mut rand::rng(), &mut n[..]);
    n
}

/// An encryption root's master key (the data key of every block under it).
pub struct MasterKey {
    raw: Zeroizing<[u8; KEY_LEN]>,
    /// The expanded key schedule; aes-gcm's `zeroize` feature wipes it on drop.
    cipher: Aes256Gcm,
    /// Key for names (keyed hashes), derived so it is never the AEAD key.
    name_key: Zeroizing<[u8; 32]>,
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

impl MasterKey {
    pub fn generate() -> Result<MasterKey, CryptError> {
        let mut raw = Zeroizing::new([0u8; KEY_LEN]);
        random_bytes(&mut raw[..])?;
        Ok(MasterKey::from_bytes(&raw))
    }

    pub fn from_bytes(raw: &[u8; KEY_LEN]) -> MasterKey {
        MasterKey {
            raw: Zeroizing::new(*raw),
            cipher: Aes256Gcm::new(raw.into()),
            name_key: Zeroizing::new(blake3::derive_key("cistern 2026 name hash key", raw)),
        }
    }

    /// Encrypts a block's stored bytes in place; returns what its pointer keeps.
    pub fn seal_block(&self, id: &BlockId, data: &mut [u8]) -> BlockCrypt {
        let nonce = random_nonce();
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &id.aad(), data)
            // Only fails for inputs longer than 64 GiB.
            .expect("a block is far below the AES-GCM length limit");
        BlockCrypt {
            algo: CryptAlgo::Aes256Gcm,
            nonce,
            tag: tag.into(),
        }
    }

    /// Decrypts a block's verified stored bytes in place.
    pub fn open_block(
        &self,
        id: &BlockId,
        crypt: &BlockCrypt,
        data: &mut [u8],
    ) -> Result<(), CryptError> {
        self.cipher
            .decrypt_in_place_detached(
                Nonce::from_slice(&crypt.nonce),
                &id.aad(),
                data,
                Tag::from_slice(&crypt.tag),
            )
            .map_err(|_| CryptError::Authentication)
    }

    /// Seals a small record (intent log payloads, names): nonce | ciphertext | tag.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let nonce = random_nonce();
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self
            .cipher
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), aad, &mut out[NONCE_LEN..])
            .expect("a record is far below the AES-GCM length limit");
        out.extend_from_slice(&tag);
        out
    }

    /// Opens what [`MasterKey::seal`] made with the same `aad`.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, CryptError> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(CryptError::Authentication);
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let (body, tag) = rest.split_at(rest.len() - TAG_LEN);
        let mut out = body.to_vec();
        self.cipher
            .decrypt_in_place_detached(
                Nonce::from_slice(nonce),
                aad,
                &mut out,
                Tag::from_slice(tag),
            )
            .map_err(|_| CryptError::Authentication)?;
        Ok(out)
    }

    /// A keyed hash (blake3 keyed mode) of a name: equal names, equal
    /// hashes; without the key nothing about the name.
    pub fn name_hash(&self, context: &[u8], name: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.name_key);
        h.update(&(context.len() as u64).to_le_bytes());
        h.update(context);
        h.update(name);
        *h.finalize().as_bytes()
    }
}

/// How the user's key is given (`keyformat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFormat {
    Passphrase,
    Hex,
    Raw,
}

impl std::str::FromStr for KeyFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "passphrase" => Ok(KeyFormat::Passphrase),
            "hex" => Ok(KeyFormat::Hex),
            "raw" => Ok(KeyFormat::Raw),
            _ => Err(format!(
                "bad keyformat '{s}': expected passphrase, hex or raw"
            )),
        }
    }
}

impl fmt::Display for KeyFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyFormat::Passphrase => "passphrase",
            KeyFormat::Hex => "hex",
            KeyFormat::Raw => "raw",
        })
    }
}

/// The key that wraps a master key, derived from what the user gave.
pub struct WrappingKey(Zeroizing<[u8; KEY_LEN]>);

impl fmt::Debug for WrappingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WrappingKey(..)")
    }
}

impl WrappingKey {
    /// From the user's key material in `format` (ZFS's rules: a passphrase
    /// of 8..=512 bytes; 64 hex digits; 32 raw bytes). A trailing newline of
    /// a passphrase or hex key (a key file, a prompt) is not part of it.
    pub fn derive(
        format: KeyFormat,
        material: &[u8],
        salt: &[u8; SALT_LEN],
        iters: u32,
    ) -> Result<WrappingKey, CryptError> {
        let mut key = Zeroizing::new([0u8; KEY_LEN]);
        let trimmed = |m: &[u8]| -> usize {
            let mut n = m.len();
            while n > 0 && matches!(m[n - 1], b'\n' | b'\r') {
                n -= 1;
            }
            n
        };
        match format {
            KeyFormat::Passphrase => {
                let m = &material[..trimmed(material)];
                if m.len() < 8 || m.len() > 512 {
                    return Err(CryptError::BadKey(
                        "passphrase must be between 8 and 512 bytes long".into(),
                    ));
                }
                if iters < MIN_PBKDF2_ITERS {
                    return Err(CryptError::BadKey(format!(
                        "pbkdf2iters must be at least {MIN_PBKDF2_ITERS}"
                    )));
                }
                pbkdf2::pbkdf2_hmac::<sha2::Sha512>(m, salt, iters, &mut key[..]);
            }
            KeyFormat::Hex => {
                let m = &material[..trimmed(material)];
                if m.len() != 2 * KEY_LEN {
                    return Err(CryptError::BadKey(
                        "a hex key must be 64 hexadecimal digits (32 bytes)".into(),
                    ));
                }
                for (i, pair) in m.chunks(2).enumerate() {
                    let hex = |c: u8| (c as char).to_digit(16);
                    match (hex(pair[0]), hex(pair[1])) {
                        (Some(h), Some(l)) => key[i] = (h * 16 + l) as u8,
                        _ => {
                            return Err(CryptError::BadKey(
                                "a hex key must be 64 hexadecimal digits (32 bytes)".into(),
                            ))
                        }
                    }
                }
            }
            KeyFormat::Raw => {
                if material.len() != KEY_LEN {
                    return Err(CryptError::BadKey(format!(
                        "a raw key must be exactly {KEY_LEN} bytes (got {})",
                        material.len()
                    )));
                }
                key.copy_from_slice(material);
            }
        }
        Ok(WrappingKey(key))
    }

    /// The master key sealed under this key; `aad` names the encryption root.
    pub fn wrap(&self, master: &MasterKey, aad: &[u8]) -> Vec<u8> {
        let w = MasterKey::from_bytes(&self.0);
        w.seal(aad, &master.raw[..])
    }

    /// The master key, if this is the key it was wrapped with.
    pub fn unwrap(&self, wrapped: &[u8], aad: &[u8]) -> Result<MasterKey, CryptError> {
        if wrapped.len() != WRAPPED_LEN {
            return Err(CryptError::Authentication);
        }
        let w = MasterKey::from_bytes(&self.0);
        let raw = Zeroizing::new(w.open(aad, wrapped)?);
        let mut k = Zeroizing::new([0u8; KEY_LEN]);
        k.copy_from_slice(&raw);
        Ok(MasterKey::from_bytes(&k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(birth: u64) -> BlockId {
        BlockId {
            object: 1,
            block: 7,
            birth,
            lsize: 4096,
            psize: 4096,
            compression: 0,
        }
    }

    #[test]
    fn blocks_round_trip_and_are_bound_to_their_place() {
        let k = MasterKey::generate().unwrap();
        let plain = b"a recognizable pattern ".repeat(100);
        let mut data = plain.clone();
        let c = k.seal_block(&id(5), &mut data);
        assert_ne!(data, plain);
        let mut moved = data.clone();
        assert_eq!(
            k.open_block(&id(6), &c, &mut moved),
            Err(CryptError::Authentication)
        );
        let mut flipped = data.clone();
        flipped[3] ^= 1;
        assert!(k.open_block(&id(5), &c, &mut flipped).is_err());
        let other = MasterKey::generate().unwrap();
        let mut d2 = data.clone();
        assert!(other.open_block(&id(5), &c, &mut d2).is_err());
        k.open_block(&id(5), &c, &mut data).unwrap();
        assert_eq!(data, plain);
    }

    #[test]
    fn wrapped_keys_open_only_with_the_right_passphrase() {
        let master = MasterKey::generate().unwrap();
        let salt = [3u8; SALT_LEN];
        let w =
            WrappingKey::derive(KeyFormat::Passphrase, b"correct horse\n", &salt, 100_000).unwrap();
        let wrapped = w.wrap(&master, b"root 5");
        assert_eq!(wrapped.len(), WRAPPED_LEN);
        let again =
            WrappingKey::derive(KeyFormat::Passphrase, b"correct horse", &salt, 100_000).unwrap();
        let back = again.unwrap(&wrapped, b"root 5").unwrap();
        assert_eq!(*back.raw, *master.raw);
        let wrong =
            WrappingKey::derive(KeyFormat::Passphrase, b"wrong horse", &salt, 100_000).unwrap();
        assert_eq!(
            wrong.unwrap(&wrapped, b"root 5").err(),
            Some(CryptError::Authentication)
        );
        assert!(again.unwrap(&wrapped, b"root 6").is_err());
        assert!(WrappingKey::derive(KeyFormat::Passphrase, b"short", &salt, 100_000).is_err());
        assert!(WrappingKey::derive(KeyFormat::Hex, b"zz", &salt, 0).is_err());
        assert!(WrappingKey::derive(KeyFormat::Hex, &[b'a'; 64], &salt, 0).is_ok());
        assert!(WrappingKey::derive(KeyFormat::Raw, &[1; 31], &salt, 0).is_err());
        assert_eq!(format!("{master:?}"), "MasterKey(..)");
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// `cargo test --release -p block -- --ignored --nocapture seal_speed`
    #[test]
    #[ignore]
    fn seal_speed() {
        let k = MasterKey::generate().unwrap();
        let mut data = vec![7u8; 16 << 10];
        let id = BlockId {
            object: 1,
            block: 1,
            birth: 1,
            lsize: 16384,
            psize: 16384,
            compression: 0,
        };
        let t = std::time::Instant::now();
        let n = 16384;
        for _ in 0..n {
            let c = k.seal_block(&id, &mut data);
            k.open_block(&id, &c, &mut data).unwrap();
        }
        let s = t.elapsed().as_secs_f64();
        println!(
            "seal+open: {:.0} MB/s each way",
            (n * 16384) as f64 / s / 1e6
        );
    }
}
