//! Entry points for the fuzz targets (`fuzz/`, decision 0027): the real
//! handshake and request decoding, driven from a byte slice instead of a
//! socket, against an in-memory export. Not part of the API.

use std::cell::RefCell;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::handshake::{self, Outcome};
use crate::proto::*;
use crate::{BlockExport, ExportError, ExportInfo, ExportProvider, ReadChunk, StatusExtent};

/// Size of the in-memory export: small, so that fuzzed offsets hit both
/// sides of the range checks.
const EXPORT_SIZE: u64 = 64 * 1024;
const BLOCK: u64 = 4096;
/// The extra meta context the fuzzed exports offer.
pub const CHANGED_CONTEXT: &str = "cistern:changed:snap1";

/// A RAM export: 4 KiB blocks, a block is allocated once written. Also the
/// protocol tests' export (`tests.rs`): it counts FLUSHes, and a write of
/// exactly `EIO!` fails, so error replies can be provoked.
pub struct RamExport {
    state: Mutex<(Vec<u8>, Vec<bool>)>,
    read_only: bool,
    /// Meta contexts offered besides `base:allocation`; they report every
    /// extent with flag 1 ("changed").
    extra: Vec<String>,
    flushes: AtomicU64,
}

impl RamExport {
    pub fn new(size: u64, read_only: bool) -> Arc<RamExport> {
        Self::with_contexts(size, read_only, Vec::new())
    }

    pub fn with_contexts(size: u64, read_only: bool, extra: Vec<String>) -> Arc<RamExport> {
        Arc::new(RamExport {
            state: Mutex::new((
                vec![0; size as usize],
                vec![false; size.div_ceil(BLOCK) as usize],
            )),
            read_only,
            extra,
            flushes: AtomicU64::new(0),
        })
    }

    /// FLUSH requests served so far.
    pub fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    fn with<T>(&self, f: impl FnOnce(&mut (Vec<u8>, Vec<bool>)) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// `(offset, len, allocated)` runs covering the range (checked by the server).
    fn runs(&self, offset: u64, len: u64) -> Vec<(u64, u64, bool)> {
        self.with(|(_, map)| {
            let mut out: Vec<(u64, u64, bool)> = Vec::new();
            let (mut at, end) = (offset, offset + len);
            while at < end {
                let b = at / BLOCK;
                let next = ((b + 1) * BLOCK).min(end);
                let a = map[b as usize];
                match out.last_mut() {
                    Some(l) if l.2 == a => l.1 += next - at,
                    _ => out.push((at, next - at, a)),
                }
                at = next;
            }
            out
        })
    }

    pub fn fill(&self, offset: u64, data: &[u8]) {
        self.with(|(bytes, map)| {
            let (o, e) = (offset as usize, offset as usize + data.len());
            bytes[o..e].copy_from_slice(data);
            for b in offset / BLOCK..(e as u64).div_ceil(BLOCK) {
                map[b as usize] = true;
            }
        })
    }
}

impl BlockExport for RamExport {
    fn size(&self) -> u64 {
        self.with(|(b, _)| b.len() as u64)
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn preferred_block_size(&self) -> u32 {
        BLOCK as u32
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        let runs = self.runs(offset, len);
        Ok(self.with(|(bytes, _)| {
            runs.into_iter()
                .map(|(o, l, a)| match a {
                    true => ReadChunk::Data(bytes[o as usize..(o + l) as usize].to_vec()),
                    false => ReadChunk::Hole(l),
                })
                .collect()
        }))
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), ExportError> {
        if data == b"EIO!" {
            return Err(ExportError::Io("injected".into()));
        }
        self.fill(offset, data);
        Ok(())
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> Result<(), ExportError> {
        self.with(|(bytes, map)| {
            bytes[offset as usize..(offset + len) as usize].fill(0);
            for b in offset.div_ceil(BLOCK)..(offset + len) / BLOCK {
                map[b as usize] = false;
            }
        });
        Ok(())
    }
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        fua: bool,
    ) -> Result<(), ExportError> {
        if allocate {
            self.fill(offset, &vec![0; len as usize]);
            Ok(())
        } else {
            self.trim(offset, len, fua)
        }
    }
    fn extra_meta_contexts(&self) -> Vec<String> {
        self.extra.clone()
    }
    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError> {
        if context != BASE_ALLOCATION {
            return Ok(vec![StatusExtent { len, flags: 1 }]);
        }
        Ok(self
            .runs(offset, len)
            .into_iter()
            .map(|(_, l, a)| StatusExtent {
                len: l,
                flags: if a { 0 } else { STATE_HOLE | STATE_ZERO },
            })
            .collect())
    }
}

/// Named [`RamExport`]s.
pub(crate) struct RamProvider(pub(crate) Vec<(ExportInfo, Arc<RamExport>)>);

impl ExportProvider for RamProvider {
    fn list(&self) -> Vec<ExportInfo> {
        self.0.iter().map(|(i, _)| i.clone()).collect()
    }
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        self.0
            .iter()
            .find(|(i, _)| i.name == name)
            .map(|(_, e)| e.clone() as Arc<dyn BlockExport>)
    }
}

thread_local! {
    // One runtime per fuzzing thread: building one per input would cost
    // more than the handshake itself.
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// What a fuzzed handshake ended with (for the replay test's summary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeEnd {
    /// The client chose this export and would enter transmission.
    Transmission {
        export: String,
        structured: bool,
        contexts: usize,
    },
    Closed,
    Error(String),
}

/// Runs the server side of the handshake with `client` as everything the
/// client sends; returns how it ended and the bytes the server sent.
pub fn handshake(client: &[u8]) -> (HandshakeEnd, Vec<u8>) {
    let provider: Arc<dyn ExportProvider> = Arc::new(RamProvider(vec![
        (
            ExportInfo {
                name: "vol0".into(),
                description: "fuzzed volume".into(),
            },
            RamExport::with_contexts(EXPORT_SIZE, false, vec![CHANGED_CONTEXT.to_owned()]),
        ),
        (
            ExportInfo {
                name: "ro".into(),
                description: String::new(),
            },
            RamExport::with_contexts(EXPORT_SIZE, true, vec![CHANGED_CONTEXT.to_owned()]),
        ),
    ]));
    let peer = SocketAddr::from((Ipv4Addr::LOCALHOST, 1));
    let (_stop, mut shutdown) = tokio::sync::watch::channel(false);
    let mut rd = client;
    let mut out = Vec::new();
    let end = RUNTIME.with(|rt| {
        let mut rt = rt.borrow_mut();
        let rt = rt.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime builds")
        });
        rt.block_on(async {
            let no_zeroes = handshake::greet(&mut rd, &mut out).await?;
            // A plaintext server without TLS: STARTTLS gets ERR_POLICY.
            let ctx = handshake::Ctx {
                provider: &provider,
                client: crate::Client {
                    peer,
                    tls: false,
                    common_name: None,
                },
                tls_available: false,
                require: false,
                no_zeroes,
            };
            let mut options_left = handshake::MAX_OPTIONS;
            handshake::negotiate(&mut rd, &mut out, &ctx, &mut shutdown, &mut options_left).await
        })
    });
    let end = match end {
        Ok(Outcome::Transmission(n)) => HandshakeEnd::Transmission {
            export: n.name,
            structured: n.structured,
            contexts: n.contexts.len(),
        },
        Ok(Outcome::Closed) => HandshakeEnd::Closed,
        Ok(Outcome::StartTls) => HandshakeEnd::Error("STARTTLS acknowledged without TLS".into()),
        Err(e) => HandshakeEnd::Error(e.to_string()),
    };
    // Every reply the server sent is well formed: the greeting, then
    // option replies (or the 10/134-byte NBD_OPT_EXPORT_NAME answer last).
    assert!(
        out.len() >= 18 && out[..8] == NBDMAGIC.to_be_bytes(),
        "greeting"
    );
    let mut at = 18;
    while out.len().saturating_sub(at) >= 20 && out[at..at + 8] == OPT_REPLY_MAGIC.to_be_bytes() {
        let len = u32::from_be_bytes([out[at + 16], out[at + 17], out[at + 18], out[at + 19]]);
        at += 20 + len as usize;
    }
    let rest = out.len().saturating_sub(at);
    assert!(
        at <= out.len() && (rest == 0 || rest == 10 || rest == 134),
        "server output does not parse as option replies ({rest} bytes left)"
    );
    (end, out)
}

/// Runs the transmission phase over `stream` (request headers and WRITE
/// payloads, as a client sends them). Its first byte chooses the session:
/// bit 0 structured replies, bit 1 the read-only export, bit 2 with the
/// meta contexts selected. Returns the encoded replies, one per request
/// answered; each is checked to start with a reply magic.
pub fn transmission(stream: &[u8]) -> Vec<Vec<u8>> {
    let Some((&mode, stream)) = stream.split_first() else {
        return Vec::new();
    };
    let structured = mode & 1 != 0;
    let export =
        RamExport::with_contexts(EXPORT_SIZE, mode & 2 != 0, vec![CHANGED_CONTEXT.to_owned()]);
    let contexts = if structured && mode & 4 != 0 {
        vec![
            (1, BASE_ALLOCATION.to_owned()),
            (2, CHANGED_CONTEXT.to_owned()),
        ]
    } else {
        Vec::new()
    };
    let replies = crate::transmission::run_on_bytes(export, structured, contexts, stream);
    for r in &replies {
        let magic = u32::from_be_bytes([r[0], r[1], r[2], r[3]]);
        assert!(
            magic == SIMPLE_REPLY_MAGIC || (structured && magic == STRUCTURED_REPLY_MAGIC),
            "reply magic {magic:#x}"
        );
    }
    replies
}

/// A request header as a client encodes it (for seeds and tests).
pub fn request(command: u16, flags: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = Vec::with_capacity(Request::SIZE);
    b.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b.extend_from_slice(&flags.to_be_bytes());
    b.extend_from_slice(&command.to_be_bytes());
    b.extend_from_slice(&handle.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// A client option as a client encodes it (for seeds and tests).
pub fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(16 + data.len());
    b.extend_from_slice(&IHAVEOPT.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}
