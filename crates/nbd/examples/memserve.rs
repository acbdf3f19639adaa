//! Serves sparse in-memory exports over NBD, to try real clients against
//! the protocol layer while the storage engine is being written.
//!
//! ```text
//! cargo run --release -p nbd --example memserve -- 127.0.0.1:10899 vol 1G [ro:ro 64M ...]
//! nbdinfo nbd://127.0.0.1:10899/vol
//! ```
//! A name written `NAME:ro` is served read-only. Sizes take K/M/G/T
//! suffixes. Ctrl-C (or SIGTERM) stops the server. `RUST_LOG` sets the log level.

use std::sync::{Arc, RwLock};

use nbd::{BlockExport, ExportError, ExportInfo, ExportProvider, ReadChunk, StatusExtent};

/// Allocation unit: a chunk is either absent (a hole of zeros) or a buffer.
const CHUNK: u64 = 64 * 1024;
const HOLE: u32 = 1;
const ZERO: u32 = 2;

struct MemVolume {
    size: u64,
    read_only: bool,
    chunks: Vec<RwLock<Option<Box<[u8]>>>>,
}

impl MemVolume {
    fn new(size: u64, read_only: bool) -> Self {
        let n = size.div_ceil(CHUNK) as usize;
        MemVolume {
            size,
            read_only,
            chunks: (0..n).map(|_| RwLock::new(None)).collect(),
        }
    }

    /// Splits `[off, off+len)` into (chunk index, offset in chunk, length).
    fn pieces(off: u64, len: u64) -> impl Iterator<Item = (usize, usize, usize)> {
        let end = off + len;
        let mut at = off;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let idx = at / CHUNK;
            let within = at % CHUNK;
            let n = (CHUNK - within).min(end - at);
            at += n;
            Some((idx as usize, within as usize, n as usize))
        })
    }

    fn zero_range(&self, off: u64, len: u64, allocate: bool) {
        for (i, within, n) in Self::pieces(off, len) {
            let mut c = self.chunks[i].write().unwrap_or_else(|e| e.into_inner());
            if !allocate && n as u64 == CHUNK {
                *c = None;
            } else if let Some(buf) = c.as_mut() {
                buf[within..within + n].fill(0);
            } else if allocate {
                *c = Some(vec![0u8; CHUNK as usize].into_boxed_slice());
            }
        }
    }
}

impl BlockExport for MemVolume {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn preferred_block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        let mut out: Vec<ReadChunk> = Vec::new();
        for (i, within, n) in Self::pieces(offset, len) {
            let c = self.chunks[i].read().unwrap_or_else(|e| e.into_inner());
            match (c.as_ref(), out.last_mut()) {
                (None, Some(ReadChunk::Hole(h))) => *h += n as u64,
                (None, _) => out.push(ReadChunk::Hole(n as u64)),
                (Some(buf), Some(ReadChunk::Data(d))) => {
                    d.extend_from_slice(&buf[within..within + n])
                }
                (Some(buf), _) => {
                    let mut d = Vec::with_capacity(len as usize);
                    d.extend_from_slice(&buf[within..within + n]);
                    out.push(ReadChunk::Data(d));
                }
            }
        }
        Ok(out)
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        let mut src = data;
        for (i, within, n) in Self::pieces(offset, data.len() as u64) {
            let mut c = self.chunks[i].write().unwrap_or_else(|e| e.into_inner());
            let buf = c.get_or_insert_with(|| vec![0u8; CHUNK as usize].into_boxed_slice());
            buf[within..within + n].copy_from_slice(&src[..n]);
            src = &src[n..];
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.zero_range(offset, len, false);
        Ok(())
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        _fua: bool,
    ) -> Result<(), ExportError> {
        self.zero_range(offset, len, allocate);
        Ok(())
    }
    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError> {
        if context != "base:allocation" {
            return Err(ExportError::NotSupported(context.to_owned()));
        }
        let mut out: Vec<StatusExtent> = Vec::new();
        for (i, _, n) in Self::pieces(offset, len) {
            let allocated = self.chunks[i]
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .is_some();
            let flags = if allocated { 0 } else { HOLE | ZERO };
            match out.last_mut() {
                Some(e) if e.flags == flags => e.len += n as u64,
                _ => out.push(StatusExtent {
                    len: n as u64,
                    flags,
                }),
            }
        }
        Ok(out)
    }
}

struct Provider(Vec<(String, Arc<MemVolume>)>);

impl ExportProvider for Provider {
    fn list(&self) -> Vec<ExportInfo> {
        self.0
            .iter()
            .map(|(n, v)| ExportInfo {
                name: n.clone(),
                description: format!(
                    "in-memory {} bytes{}",
                    v.size,
                    if v.read_only { ", read-only" } else { "" }
                ),
            })
            .collect()
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone() as Arc<dyn BlockExport>)
    }
}

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'K' | 'k') => (&s[..i], 1u64 << 10),
        (i, 'M' | 'm') => (&s[..i], 1 << 20),
        (i, 'G' | 'g') => (&s[..i], 1 << 30),
        (i, 'T' | 't') => (&s[..i], 1 << 40),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 || args.len() % 2 == 0 {
        anyhow::bail!("usage: memserve ADDR NAME[:ro] SIZE [NAME[:ro] SIZE ...]");
    }
    let mut exports = Vec::new();
    for pair in args[1..].chunks(2) {
        let (name, ro) = match pair[0].strip_suffix(":ro") {
            Some(n) => (n.to_owned(), true),
            None => (pair[0].clone(), false),
        };
        let size = parse_size(&pair[1]).ok_or_else(|| anyhow::anyhow!("bad size {:?}", pair[1]))?;
        exports.push((name, Arc::new(MemVolume::new(size, ro))));
    }
    let listener = tokio::net::TcpListener::bind(&args[0]).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
        }
        let _ = stop_tx.send(true);
    });
    nbd::serve(listener, Arc::new(Provider(exports)), stop_rx).await?;
    let s = nbd::stats().snapshot();
    eprintln!("stats: {s:?}");
    Ok(())
}
