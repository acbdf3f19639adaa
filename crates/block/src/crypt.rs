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
//!
//! The AES-256-GCM implementation is ring's (assembly with AES-NI, CLMUL and
//! VAES where the CPU has them; decision 0037). GCM is a standard, so the
//! ciphertexts and tags are those of any AES-256-GCM, the one of decision
//! 0026 (RustCrypto `aes-gcm`) included: the tests open its blocks.

use rand::TryRngCore;
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM};
use std::fmt;
use std::mem::MaybeUninit;
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

/// ring's AES-256-GCM key (the expanded AES schedule and the GHASH table),
/// wiped when dropped: ring does not zeroize its keys. It owns no heap
/// memory and has no `Drop` (ring 0.17), so overwriting its bytes in place
/// wipes all of it; `MaybeUninit` makes any bytes there valid.
struct Cipher(MaybeUninit<LessSafeKey>);

impl Cipher {
    fn new(raw: &[u8; KEY_LEN]) -> Cipher {
        // Only fails for a key of the wrong length; 32 bytes is AES-256's.
        let key = UnboundKey::new(&AES_256_GCM, raw).expect("a 32-byte key is an AES-256 key");
        Cipher(MaybeUninit::new(LessSafeKey::new(key)))
    }

    fn key(&self) -> &LessSafeKey {
        // SAFETY: initialized in `new`; only `drop` overwrites it.
        unsafe { self.0.assume_init_ref() }
    }

    /// Encrypts `data` in place; returns the tag.
    fn seal(&self, nonce: &[u8; NONCE_LEN], aad: &[u8], data: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .key()
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(*nonce), Aad::from(aad), data)
            // Only fails for inputs longer than 64 GiB.
            .expect("a block is far below the AES-GCM length limit");
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(tag.as_ref());
        t
    }

    /// Decrypts `data` in place if `tag` authenticates it (and `aad`).
    fn open(
        &self,
        nonce: &[u8; NONCE_LEN],
        aad: &[u8],
        tag: &[u8; TAG_LEN],
        data: &mut [u8],
    ) -> Result<(), CryptError> {
        self.key()
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(*nonce),
                Aad::from(aad),
                Tag::from(*tag),
                data,
                0..,
            )
            .map(|_| ())
            .map_err(|_| CryptError::Authentication)
    }
}

impl Drop for Cipher {
    fn drop(&mut self) {
        let p = self.0.as_mut_ptr().cast::<u8>();
        for i in 0..std::mem::size_of::<LessSafeKey>() {
            // SAFETY: within the bytes of `self.0`, which is never read again.
            unsafe { std::ptr::write_volatile(p.add(i), 0) };
        }
        std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
    }
}

/// An encryption root's master key (the data key of every block under it).
pub struct MasterKey {
    raw: Zeroizing<[u8; KEY_LEN]>,
    /// The expanded key schedule, wiped on drop.
    cipher: Cipher,
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
            cipher: Cipher::new(raw),
            name_key: Zeroizing::new(blake3::derive_key("cistern 2026 name hash key", raw)),
        }
    }

    /// Encrypts a block's stored bytes in place; returns what its pointer keeps.
    pub fn seal_block(&self, id: &BlockId, data: &mut [u8]) -> BlockCrypt {
        let nonce = random_nonce();
        let tag = self.cipher.seal(&nonce, &id.aad(), data);
        BlockCrypt {
            algo: CryptAlgo::Aes256Gcm,
            nonce,
            tag,
        }
    }

    /// Decrypts a block's verified stored bytes in place.
    pub fn open_block(
        &self,
        id: &BlockId,
        crypt: &BlockCrypt,
        data: &mut [u8],
    ) -> Result<(), CryptError> {
        self.cipher.open(&crypt.nonce, &id.aad(), &crypt.tag, data)
    }

    /// Seals a small record (intent log payloads, names): nonce | ciphertext | tag.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> Vec<u8> {
        let nonce = random_nonce();
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = self.cipher.seal(&nonce, aad, &mut out[NONCE_LEN..]);
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
        let nonce: &[u8; NONCE_LEN] = nonce.try_into().map_err(|_| CryptError::Authentication)?;
        let tag: &[u8; TAG_LEN] = tag.try_into().map_err(|_| CryptError::Authentication)?;
        let mut out = body.to_vec();
        if let Err(e) = self.cipher.open(nonce, aad, tag, &mut out) {
            // Unauthenticated plaintext is never handed out nor left behind.
            zeroize::Zeroize::zeroize(&mut out);
            return Err(e);
        }
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

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The GCM specification's AES-256 test case 16 (McGrew and Viega,
    /// "The Galois/Counter Mode of Operation", also in NIST's vectors):
    /// 60 bytes of plaintext, 20 bytes of associated data.
    #[test]
    fn known_answer_gcm_spec_test_case_16() {
        let key: [u8; KEY_LEN] =
            unhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
                .try_into()
                .unwrap();
        let nonce: [u8; NONCE_LEN] = unhex("cafebabefacedbaddecaf888").try_into().unwrap();
        let plain = unhex(concat!(
            "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72",
            "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b39"
        ));
        let aad = unhex("feedfacedeadbeeffeedfacedeadbeefabaddad2");
        let cipher_text = unhex(concat!(
            "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa",
            "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662"
        ));
        let tag: [u8; TAG_LEN] = unhex("76fc6ece0f4e1768cddf8853bb2d551b")
            .try_into()
            .unwrap();
        let c = Cipher::new(&key);
        let mut data = plain.clone();
        assert_eq!(c.seal(&nonce, &aad, &mut data), tag);
        assert_eq!(data, cipher_text);
        c.open(&nonce, &aad, &tag, &mut data).unwrap();
        assert_eq!(data, plain);
        let mut bad = tag;
        bad[0] ^= 1;
        assert!(c
            .open(&nonce, &aad, &bad, &mut cipher_text.clone())
            .is_err());
    }

    /// Blocks, log records and wrapped keys written by the cipher of
    /// decision 0026 (RustCrypto `aes-gcm` 0.10) open with this one, and
    /// the other way round: pools written by earlier builds stay readable.
    #[test]
    fn interchangeable_with_the_aes_gcm_crate() {
        use aes_gcm::aead::AeadInPlace;
        use aes_gcm::{Aes256Gcm, KeyInit};
        let k = MasterKey::generate().unwrap();
        let old = Aes256Gcm::new((&*k.raw).into());
        let b = id(9);
        for len in [0usize, 1, 15, 16, 17, 4096, 16384 + 5] {
            let plain: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            // Old writer, new reader.
            let nonce = random_nonce();
            let mut data = plain.clone();
            let tag = old
                .encrypt_in_place_detached((&nonce).into(), &b.aad(), &mut data)
                .unwrap();
            let c = BlockCrypt {
                algo: CryptAlgo::Aes256Gcm,
                nonce,
                tag: tag.into(),
            };
            k.open_block(&b, &c, &mut data).unwrap();
            assert_eq!(data, plain);
            // New writer, old reader: the same bytes.
            let c = k.seal_block(&b, &mut data);
            let mut again = plain.clone();
            let tag = old
                .encrypt_in_place_detached((&c.nonce).into(), &b.aad(), &mut again)
                .unwrap();
            assert_eq!(again, data);
            assert_eq!(<[u8; TAG_LEN]>::from(tag), c.tag);
            old.decrypt_in_place_detached((&c.nonce).into(), &b.aad(), &mut data, &tag)
                .unwrap();
            assert_eq!(data, plain);
        }
        // A record (nonce | ciphertext | tag) sealed by the old code.
        let nonce = random_nonce();
        let mut body = b"log record payload".to_vec();
        let tag = old
            .encrypt_in_place_detached((&nonce).into(), b"aad", &mut body)
            .unwrap();
        let sealed = [&nonce[..], &body, &tag].concat();
        assert_eq!(k.open(b"aad", &sealed).unwrap(), b"log record payload");
        assert!(k.open(b"other", &sealed).is_err());
        // A master key wrapped by the old code (WrappingKey::wrap is a seal).
        let w = WrappingKey::derive(KeyFormat::Raw, &[4u8; KEY_LEN], &[0; SALT_LEN], 0).unwrap();
        let wold = Aes256Gcm::new((&[4u8; KEY_LEN]).into());
        let nonce = random_nonce();
        let mut body = k.raw.to_vec();
        let tag = wold
            .encrypt_in_place_detached((&nonce).into(), b"root 3", &mut body)
            .unwrap();
        let wrapped = [&nonce[..], &body, &tag].concat();
        assert_eq!(*w.unwrap(&wrapped, b"root 3").unwrap().raw, *k.raw);
    }

    /// Dropping the cipher overwrites its key schedule.
    #[test]
    fn cipher_is_wiped_on_drop() {
        let mut slot = std::mem::MaybeUninit::new(Cipher::new(&[0x5a; KEY_LEN]));
        let bytes = |s: &std::mem::MaybeUninit<Cipher>| {
            // SAFETY: every byte of the slot was written (by `new`, then by `drop`).
            unsafe {
                std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of::<Cipher>())
            }
            .to_vec()
        };
        assert!(bytes(&slot).iter().any(|&b| b != 0));
        // SAFETY: initialized above and not used as a `Cipher` after this.
        unsafe { std::ptr::drop_in_place(slot.as_mut_ptr()) };
        assert!(bytes(&slot).iter().all(|&b| b == 0));
    }
}

#[cfg(test)]
mod speed {
    use super::*;

    /// The AEAD alone, this cipher (ring) against decision 0026's (RustCrypto
    /// `aes-gcm`), on 16 KiB blocks:
    /// `cargo test --release -p block -- --ignored --nocapture seal_speed`
    #[test]
    #[ignore]
    fn seal_speed() {
        use aes_gcm::aead::AeadInPlace;
        use aes_gcm::{Aes256Gcm, KeyInit};
        let k = MasterKey::generate().unwrap();
        let old = Aes256Gcm::new((&*k.raw).into());
        let mut data = vec![7u8; 16 << 10];
        let id = BlockId {
            object: 1,
            block: 1,
            birth: 1,
            lsize: 16384,
            psize: 16384,
            compression: 0,
        };
        let n = 16384;
        let mb_s = |s: f64| (n * 16384) as f64 / s / 1e6;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for _ in 0..n {
                let c = k.seal_block(&id, &mut data);
                k.open_block(&id, &c, &mut data).unwrap();
            }
            let ring = mb_s(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            for _ in 0..n {
                let nonce = random_nonce();
                let tag = old
                    .encrypt_in_place_detached((&nonce).into(), &id.aad(), &mut data)
                    .unwrap();
                old.decrypt_in_place_detached((&nonce).into(), &id.aad(), &mut data, &tag)
                    .unwrap();
            }
            let rc = mb_s(t.elapsed().as_secs_f64());
            println!(
                "seal+open of 16 KiB blocks, MB/s each way: ring {ring:.0}, aes-gcm 0.10 {rc:.0} ({:.1}x)",
                ring / rc
            );
        }
    }
}
