//! What a filesystem keeps in an object's payload (ZFS: the znode's system
//! attributes): mode, owner, device number, atime, the symlink target and
//! the extended attributes. Sizes, link counts, mtime/ctime/crtime and the
//! generation are the object layer's own attributes.
//!
//! Encoding, version 1 (little endian; `bytes` = u32 length + bytes):
//! `u8 1 | u32 mode | u32 uid | u32 gid | u64 rdev | u64 atime_ns |
//!  bytes symlink_target | u32 n | n x (bytes name, bytes value)`.
//! An empty payload (the root directory before it is first changed) reads as
//! mode 0755 directory, owner 0:0.

use crate::Errno;
use std::collections::BTreeMap;

const VERSION: u8 = 1;

/// The POSIX part of an inode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Inode {
    /// Type and permission bits, as `st_mode`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub atime_ns: u64,
    /// Symbolic links: where they point.
    pub target: Vec<u8>,
    /// Extended attributes (POSIX ACLs are `system.posix_acl_*` among them).
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Inode {
    pub fn encode(&self) -> Vec<u8> {
        let xlen: usize = self.xattrs.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
        let mut b = Vec::with_capacity(41 + self.target.len() + xlen);
        b.push(VERSION);
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.rdev.to_le_bytes());
        b.extend_from_slice(&self.atime_ns.to_le_bytes());
        put_bytes(&mut b, &self.target);
        b.extend_from_slice(&(self.xattrs.len() as u32).to_le_bytes());
        for (k, v) in &self.xattrs {
            put_bytes(&mut b, k);
            put_bytes(&mut b, v);
        }
        b
    }

    /// `dir`: what an empty payload stands for (the root directory).
    pub fn decode(b: &[u8], dir: bool) -> Result<Inode, Errno> {
        if b.is_empty() {
            return Ok(Inode {
                mode: if dir {
                    libc::S_IFDIR | 0o755
                } else {
                    libc::S_IFREG | 0o644
                },
                ..Default::default()
            });
        }
        let mut d = Dec(b);
        let v = d.u8()?;
        if v != VERSION {
            tracing::error!(
                version = v,
                "inode payload version not understood by this build"
            );
            return Err(Errno::corrupt());
        }
        let mut ino = Inode {
            mode: d.u32()?,
            uid: d.u32()?,
            gid: d.u32()?,
            rdev: d.u64()?,
            atime_ns: d.u64()?,
            target: d.bytes()?.to_vec(),
            xattrs: BTreeMap::new(),
        };
        let n = d.u32()?;
        for _ in 0..n {
            let k = d.bytes()?.to_vec();
            let v = d.bytes()?.to_vec();
            ino.xattrs.insert(k, v);
        }
        Ok(ino)
    }
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    b.extend_from_slice(v);
}

struct Dec<'a>(&'a [u8]);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Errno> {
        if self.0.len() < n {
            tracing::error!("inode payload truncated");
            return Err(Errno::corrupt());
        }
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, Errno> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, Errno> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, Errno> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], Errno> {
        let n = self.u32()? as usize;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_truncation() {
        let mut i = Inode {
            mode: libc::S_IFLNK | 0o777,
            uid: 1000,
            gid: 100,
            rdev: 0x0801,
            atime_ns: 42,
            target: b"../x".to_vec(),
            xattrs: BTreeMap::new(),
        };
        i.xattrs.insert(b"user.a".to_vec(), vec![1, 2, 3]);
        let b = i.encode();
        assert_eq!(Inode::decode(&b, false).unwrap(), i);
        for n in 1..b.len() {
            assert!(Inode::decode(&b[..n], false).is_err(), "prefix {n}");
        }
        assert_eq!(
            Inode::decode(&[], true).unwrap().mode,
            libc::S_IFDIR | 0o755
        );
    }
}
