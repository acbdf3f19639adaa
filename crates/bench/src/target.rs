//! What a benchmark reads and writes: a file or block device, an NBD export,
//! or an S3 bucket (`crate::s3`). A [`TargetSpec`] is parsed from the command
//! line, checked and prepared once ([`TargetSpec::prepare`]), then each
//! worker opens its own [`Target`] (its own file descriptor or connection).

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::nbd_client::{NbdClient, NbdUri};
use crate::s3::S3Target;
use crate::s3_client::S3Options;

/// Bytes inspected to decide whether a target holds data.
pub const PROBE_BYTES: u64 = 1 << 20;
/// Socket timeout of NBD connections.
pub const NBD_TIMEOUT: Duration = Duration::from_secs(30);

/// One worker's handle on a target. Offsets and lengths are multiples of
/// the block size and lie inside the prepared region.
pub trait Target: Send {
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()>;
    /// Writes `data` at `offset`, durable when this returns (fdatasync, FUA).
    fn write_sync(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()>;
    /// Writes `data` at `offset`, durable only after [`Target::sync`]
    /// (streaming writes); by default as durable as `write_sync`.
    fn write_at(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        self.write_sync(offset, data)
    }
    /// One request-reply round trip for `bench latency`: a read of
    /// `buf.len()` bytes at 0 (S3: a HEAD of the probe object).
    fn round_trip(&mut self, buf: &mut [u8]) -> anyhow::Result<()> {
        self.read_at(0, buf)
    }
    /// Makes earlier `write_at`s durable (fdatasync, FLUSH).
    fn sync(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Closes cleanly (NBD: DISC).
    fn close(self: Box<Self>) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A target named on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetSpec {
    /// A regular file (created if missing) or a block device.
    File(PathBuf),
    /// `nbd://host[:port]/export` or `nbd+unix:///export?socket=PATH`.
    Nbd(NbdUri),
    /// `s3://bucket[/prefix]`: objects of a bucket (one per block).
    S3(S3Target),
}

/// How worker handles are opened.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenFlags {
    /// O_DIRECT for files and devices (bypasses the page cache).
    pub direct: bool,
}

/// Memory aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    layout: std::alloc::Layout,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to 4096.
    pub fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096)
            .unwrap_or_else(|_| std::alloc::Layout::new::<u8>());
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        Self { ptr, len, layout }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in new().
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

impl TargetSpec {
    /// A target; an `s3://` one takes its endpoint and keys from the AWS
    /// environment variables.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Self::parse_with(s, &S3Options::from_env())
    }

    /// A target; an `s3://` one with the given connection settings.
    pub fn parse_with(s: &str, s3: &S3Options) -> anyhow::Result<Self> {
        if s.starts_with("nbd://") || s.starts_with("nbd+unix://") {
            return Ok(Self::Nbd(NbdUri::parse(s)?));
        }
        if s.starts_with("nbds://") || s.starts_with("nbds+unix://") {
            bail!("{s}: NBD over TLS is not supported by the bench client");
        }
        if s.starts_with("s3://") {
            return Ok(Self::S3(S3Target::parse(s, s3)?));
        }
        if s.contains("://") {
            bail!("{s}: unknown scheme (expected a path, nbd://host:port/export or s3://bucket)");
        }
        if s.is_empty() {
            bail!("empty target");
        }
        Ok(Self::File(PathBuf::from(s)))
    }

    /// A short label for file names: file stem, export name, bucket.
    pub fn label(&self) -> String {
        match self {
            Self::File(p) => p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "file".into()),
            Self::Nbd(u) if !u.export.is_empty() => format!("nbd-{}", u.export),
            Self::Nbd(_) => "nbd".into(),
            Self::S3(t) => t.label(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::File(p) => p.display().to_string(),
            Self::Nbd(u) => u.to_string(),
            Self::S3(t) => format!("{} at {}", t.url(), t.config.endpoint),
        }
    }

    /// Checks the target and makes it ready for a run over a region of
    /// `want_region` bytes (None: min(size, 1 GiB)). With `write`, refuses a
    /// target that holds data unless `force`. Creates a missing file (and
    /// fills it with data first if the run reads, so reads hit real blocks);
    /// the returned [`Prepared`] removes what was created when dropped.
    pub fn prepare(
        &self,
        want_region: Option<u64>,
        write: bool,
        read: bool,
        force: bool,
        block_size: u64,
    ) -> anyhow::Result<Prepared> {
        match self {
            Self::File(p) => prepare_file(p, want_region, write, read, force, block_size),
            Self::Nbd(u) => {
                let mut c = NbdClient::connect(u, NBD_TIMEOUT)
                    .with_context(|| format!("connecting to {u}"))?;
                let size = c.size();
                if write && c.read_only() {
                    bail!("{u}: the export is read-only");
                }
                if write && !force {
                    let n = size.min(PROBE_BYTES) as usize;
                    let mut buf = vec![0u8; n];
                    let mut off = 0;
                    while off < n {
                        let len = (n - off).min(64 << 10);
                        c.read(off as u64, &mut buf[off..off + len])
                            .with_context(|| format!("reading {u} to check it is empty"))?;
                        off += len;
                    }
                    if buf.iter().any(|&b| b != 0) {
                        bail!(
                            "{u} holds data (its first MiB is not all zeros); refusing to write \
                             to it without --force"
                        );
                    }
                }
                let _ = c.disconnect();
                let region = region_of(size, want_region, block_size)?;
                Ok(Prepared {
                    region,
                    target_size: size,
                    cleanup: Cleanup::None,
                    notes: Vec::new(),
                })
            }
            Self::S3(t) => {
                // A block is an object: the region is objects x block size.
                let objects = want_region.map_or(crate::s3::DEFAULT_OBJECTS, |r| r / block_size);
                if objects == 0 {
                    bail!("the region is smaller than one object ({block_size} bytes)");
                }
                let notes = t.prepare(objects, write, read, force, block_size)?;
                Ok(Prepared {
                    region: objects * block_size,
                    target_size: objects * block_size,
                    cleanup: Cleanup::None,
                    notes,
                })
            }
        }
    }

    /// Opens one worker's handle.
    pub fn open(&self, flags: OpenFlags, write: bool) -> anyhow::Result<Box<dyn Target>> {
        match self {
            Self::File(p) => {
                let mut o = OpenOptions::new();
                o.read(true).write(write);
                if flags.direct {
                    o.custom_flags(libc::O_DIRECT);
                }
                let file = o
                    .open(p)
                    .with_context(|| format!("opening {}", p.display()))?;
                Ok(Box::new(FileTarget {
                    file,
                    path: p.clone(),
                }))
            }
            Self::Nbd(u) => {
                let client = NbdClient::connect(u, NBD_TIMEOUT)
                    .with_context(|| format!("connecting to {u}"))?;
                Ok(Box::new(NbdTarget { client }))
            }
            Self::S3(t) => t.open(),
        }
    }
}

fn region_of(size: u64, want: Option<u64>, block_size: u64) -> anyhow::Result<u64> {
    let region = match want {
        Some(w) if w > size => bail!("--size {w} is larger than the target ({size} bytes)"),
        Some(w) => w,
        None => size.min(1 << 30),
    };
    let region = region / block_size * block_size;
    if region < block_size {
        bail!("the region ({region} bytes) is smaller than one block ({block_size} bytes)");
    }
    Ok(region)
}

/// Whether the file holds data: any non-zero byte in its first MiB, or in
/// the first MiB of the first allocated extent after that (SEEK_DATA).
fn file_holds_data(f: &mut File, size: u64) -> anyhow::Result<bool> {
    let mut buf = vec![0u8; PROBE_BYTES.min(size) as usize];
    f.read_exact_at(&mut buf, 0)?;
    if buf.iter().any(|&b| b != 0) {
        return Ok(true);
    }
    if size <= PROBE_BYTES {
        return Ok(false);
    }
    use std::os::fd::AsRawFd;
    // SAFETY: plain lseek on an fd we own.
    let data = unsafe { libc::lseek(f.as_raw_fd(), PROBE_BYTES as libc::off_t, libc::SEEK_DATA) };
    if data < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(false), // no data after the probe
            // SEEK_DATA unsupported: any allocated block beyond the probe counts.
            _ => Ok(f.metadata()?.blocks() * 512 > PROBE_BYTES),
        };
    }
    let at = data as u64;
    let mut buf = vec![0u8; PROBE_BYTES.min(size - at.min(size)) as usize];
    f.read_exact_at(&mut buf, at)?;
    Ok(buf.iter().any(|&b| b != 0))
}

fn prepare_file(
    p: &Path,
    want_region: Option<u64>,
    write: bool,
    read: bool,
    force: bool,
    block_size: u64,
) -> anyhow::Result<Prepared> {
    match std::fs::metadata(p) {
        Ok(md) => {
            let ft = md.file_type();
            let is_dev = ft.is_block_device();
            if !(ft.is_file() || is_dev) {
                bail!("{}: not a regular file or block device", p.display());
            }
            let mut f = OpenOptions::new()
                .read(true)
                .open(p)
                .with_context(|| format!("opening {}", p.display()))?;
            let size = if is_dev {
                f.seek(SeekFrom::End(0))
                    .with_context(|| format!("size of {}", p.display()))?
            } else {
                md.len()
            };
            if size == 0 && !is_dev {
                // An empty file: grow it for the run and shrink it back afterwards.
                let region = want_region.unwrap_or(1 << 30);
                let region = region_of(region, Some(region), block_size)?;
                let f = OpenOptions::new()
                    .write(true)
                    .open(p)
                    .with_context(|| format!("opening {}", p.display()))?;
                f.set_len(region)?;
                let mut prep = Prepared {
                    region,
                    target_size: region,
                    cleanup: Cleanup::Truncate(p.to_path_buf()),
                    notes: vec![format!(
                        "{} was empty: grown for the run, emptied afterwards",
                        p.display()
                    )],
                };
                if read {
                    fill(p, region, &mut prep)?;
                }
                return Ok(prep);
            }
            if write && !force && file_holds_data(&mut f, size)? {
                bail!(
                    "{} holds data; refusing to write to it without --force",
                    p.display()
                );
            }
            let region = region_of(size, want_region, block_size)?;
            let mut notes = Vec::new();
            if !is_dev && read && md.blocks() == 0 {
                notes.push("the file is sparse: reads of holes measure little".into());
            }
            Ok(Prepared {
                region,
                target_size: size,
                cleanup: Cleanup::None,
                notes,
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let region = want_region.unwrap_or(1 << 30);
            let region = region_of(region, Some(region), block_size)?;
            let f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(p)
                .with_context(|| format!("creating {}", p.display()))?;
            let mut prep = Prepared {
                region,
                target_size: region,
                cleanup: Cleanup::Remove(p.to_path_buf()),
                notes: vec![format!("created {} (removed afterwards)", p.display())],
            };
            f.set_len(region)
                .with_context(|| format!("sizing {}", p.display()))?;
            if read {
                fill(p, region, &mut prep)?;
            }
            Ok(prep)
        }
        Err(e) => Err(e).with_context(|| format!("{}", p.display())),
    }
}

/// Writes pseudo-random data over the region so reads hit allocated blocks.
fn fill(p: &Path, region: u64, prep: &mut Prepared) -> anyhow::Result<()> {
    use rand::{RngCore, SeedableRng};
    let f = OpenOptions::new()
        .write(true)
        .open(p)
        .with_context(|| format!("opening {}", p.display()))?;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0;
    while off < region {
        let n = (region - off).min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        f.write_all_at(&buf[..n], off)
            .with_context(|| format!("filling {}", p.display()))?;
        off += n as u64;
    }
    f.sync_data()?;
    prep.notes.push(format!(
        "filled {} with {} of data so reads hit real blocks",
        p.display(),
        crate::util::fmt_bytes(region)
    ));
    Ok(())
}

#[derive(Debug)]
enum Cleanup {
    None,
    Remove(PathBuf),
    Truncate(PathBuf),
}

/// A checked, ready target. Dropping it undoes what `prepare` created.
#[derive(Debug)]
pub struct Prepared {
    /// Bytes of the target the run uses, from offset 0, a multiple of the block size.
    pub region: u64,
    /// The whole target's size.
    pub target_size: u64,
    cleanup: Cleanup,
    /// Things the user should know (created, filled, sparse...).
    pub notes: Vec<String>,
}

impl Prepared {
    /// Undoes what `prepare` created, reporting errors (Drop ignores them).
    pub fn finish(mut self) -> anyhow::Result<()> {
        let c = std::mem::replace(&mut self.cleanup, Cleanup::None);
        run_cleanup(c)
    }
}

fn run_cleanup(c: Cleanup) -> anyhow::Result<()> {
    match c {
        Cleanup::None => Ok(()),
        Cleanup::Remove(p) => {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))
        }
        Cleanup::Truncate(p) => OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|f| f.set_len(0))
            .with_context(|| format!("emptying {}", p.display())),
    }
}

impl Drop for Prepared {
    fn drop(&mut self) {
        let c = std::mem::replace(&mut self.cleanup, Cleanup::None);
        let _ = run_cleanup(c);
    }
}

struct FileTarget {
    file: File,
    path: PathBuf,
}

impl Target for FileTarget {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        self.file
            .read_exact_at(buf, offset)
            .with_context(|| format!("read {} at {offset}", self.path.display()))
    }
    fn write_sync(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all_at(data, offset)
            .with_context(|| format!("write {} at {offset}", self.path.display()))?;
        self.file
            .sync_data()
            .with_context(|| format!("fdatasync {}", self.path.display()))
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        self.file
            .write_all_at(data, offset)
            .with_context(|| format!("write {} at {offset}", self.path.display()))
    }
    fn sync(&mut self) -> anyhow::Result<()> {
        self.file
            .sync_data()
            .with_context(|| format!("fdatasync {}", self.path.display()))
    }
}

struct NbdTarget {
    client: NbdClient,
}

impl Target for NbdTarget {
    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        Ok(self.client.read(offset, buf)?)
    }
    fn write_sync(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        if self.client.can_fua() {
            self.client.write(offset, data, true)?;
        } else {
            self.client.write(offset, data, false)?;
            self.client.flush()?;
        }
        Ok(())
    }
    fn write_at(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        Ok(self.client.write(offset, data, false)?)
    }
    fn sync(&mut self) -> anyhow::Result<()> {
        Ok(self.client.flush()?)
    }
    fn close(self: Box<Self>) -> anyhow::Result<()> {
        Ok(self.client.disconnect()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_targets() {
        assert!(matches!(
            TargetSpec::parse("/dev/sdb").unwrap(),
            TargetSpec::File(_)
        ));
        assert!(matches!(
            TargetSpec::parse("nbd://h/x").unwrap(),
            TargetSpec::Nbd(_)
        ));
        let opts = S3Options {
            endpoint: Some("http://127.0.0.1:9000".into()),
            access_key: Some("k".into()),
            secret_key: Some("s".into()),
            ..S3Options::default()
        };
        match TargetSpec::parse_with("s3://bucket/p", &opts).unwrap() {
            TargetSpec::S3(t) => {
                assert_eq!((t.bucket.as_str(), t.prefix.as_str()), ("bucket", "p/"))
            }
            t => panic!("{t:?}"),
        }
        assert!(TargetSpec::parse_with("s3://B", &opts).is_err());
        assert!(TargetSpec::parse("ftp://x").is_err());
    }

    #[test]
    fn refuses_files_with_data_and_cleans_up_created_ones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.img");
        std::fs::write(&p, vec![7u8; 8192]).unwrap();
        let spec = TargetSpec::File(p.clone());
        let e = spec.prepare(None, true, false, false, 4096).unwrap_err();
        assert!(e.to_string().contains("holds data"), "{e}");
        // reading is fine, and --force allows writing
        spec.prepare(None, false, true, false, 4096).unwrap();
        let prep = spec.prepare(None, true, false, true, 4096).unwrap();
        assert_eq!(prep.region, 8192);
        drop(prep);
        assert!(p.exists(), "existing files are never removed");

        // a sparse all-zero file is fine
        let z = dir.path().join("z.img");
        File::create(&z).unwrap().set_len(4 << 20).unwrap();
        let zs = TargetSpec::File(z.clone());
        assert_eq!(
            zs.prepare(None, true, false, false, 4096).unwrap().region,
            4 << 20
        );
        // data beyond the first MiB is found too
        let f = OpenOptions::new().write(true).open(&z).unwrap();
        f.write_all_at(&[1u8; 4096], 3 << 20).unwrap();
        f.sync_all().unwrap();
        assert!(zs.prepare(None, true, false, false, 4096).is_err());

        let n = dir.path().join("new.img");
        let ns = TargetSpec::File(n.clone());
        let prep = ns.prepare(Some(1 << 20), true, true, false, 4096).unwrap();
        assert!(n.exists());
        assert_eq!(std::fs::metadata(&n).unwrap().len(), 1 << 20);
        let mut t = ns.open(OpenFlags { direct: false }, true).unwrap();
        t.write_sync(4096, &[3u8; 4096]).unwrap();
        let mut b = vec![0u8; 4096];
        t.read_at(4096, &mut b).unwrap();
        assert_eq!(b, vec![3u8; 4096]);
        t.close().unwrap();
        prep.finish().unwrap();
        assert!(!n.exists(), "created file removed");
    }

    #[test]
    fn nbd_target_checks_for_data() {
        let srv = crate::nbd_client::mock::MockServer::start("v", 2 << 20).unwrap();
        let spec = TargetSpec::parse(&srv.uri()).unwrap();
        let prep = spec.prepare(None, true, false, false, 4096).unwrap();
        assert_eq!(prep.region, 2 << 20);
        let mut t = spec.open(OpenFlags::default(), true).unwrap();
        t.write_sync(0, &[9u8; 4096]).unwrap();
        t.close().unwrap();
        assert_eq!(srv.data.lock().unwrap()[..4096], [9u8; 4096]);
        let e = spec.prepare(None, true, false, false, 4096).unwrap_err();
        assert!(e.to_string().contains("holds data"), "{e}");
        spec.prepare(None, true, false, true, 4096).unwrap();
    }
}
