//! Handshake phase: fixed newstyle greeting and option haggling, up to the
//! point where an export is chosen (`NBD_OPT_EXPORT_NAME` or a successful
//! `NBD_OPT_GO`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::proto::*;
use crate::{BlockExport, ExportProvider};

/// Most options one connection may send before we give up on it.
const MAX_OPTIONS: usize = 65_536;

/// What the client chose.
pub(crate) struct Negotiated {
    pub export: Arc<dyn BlockExport>,
    /// Canonical export name (the default export's real name for `""`).
    pub name: String,
    pub structured: bool,
    /// Selected meta contexts: (id, name).
    pub contexts: Vec<(u32, String)>,
}

pub(crate) enum Outcome {
    /// Enter transmission with this export.
    Transmission(Negotiated),
    /// The client aborted, or the server is shutting down.
    Closed,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum HandshakeError {
    #[error("{0}")]
    Io(#[from] io::Error),
    /// The client broke the protocol; the connection is dropped.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// `NBD_OPT_EXPORT_NAME` for an export we cannot serve: the protocol
    /// has no error reply for it, so the connection is dropped.
    #[error("refused: {0}")]
    Refused(String),
}

/// An export looked up by name, with what the handshake needs to know.
struct Resolved {
    name: String,
    description: String,
    export: Arc<dyn BlockExport>,
    size: u64,
    read_only: bool,
    preferred_block: u32,
    /// `base:allocation` first, then the export's valid extra contexts.
    contexts: Vec<String>,
}

/// Meta contexts chosen by the last `NBD_OPT_SET_META_CONTEXT`.
struct MetaSelection {
    export: String,
    contexts: Vec<(u32, String)>,
}

struct State {
    structured: bool,
    no_zeroes: bool,
    meta: Option<MetaSelection>,
}

/// Runs the handshake over `rd`/`wr`. `wr` should be buffered: it is flushed
/// after every complete option reply.
pub(crate) async fn negotiate<R, W>(
    rd: &mut R,
    wr: &mut W,
    peer: SocketAddr,
    provider: &Arc<dyn ExportProvider>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Outcome, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut hello = [0u8; 18];
    hello[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    hello[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    wr.write_all(&hello).await?;
    wr.flush().await?;

    let client_flags = rd.read_u32().await?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(HandshakeError::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    // A client without FLAG_C_FIXED_NEWSTYLE gets fixed newstyle anyway (the
    // spec allows it; a plain-newstyle client only sends NBD_OPT_EXPORT_NAME).
    let mut st = State {
        structured: false,
        no_zeroes: client_flags & FLAG_C_NO_ZEROES != 0,
        meta: None,
    };

    for _ in 0..MAX_OPTIONS {
        let mut h = [0u8; OptionHeader::SIZE];
        tokio::select! {
            r = rd.read_exact(&mut h) => { r?; }
            _ = crate::server::shutdown_requested(shutdown) => return Ok(Outcome::Closed),
        }
        let h = OptionHeader::parse(&h);
        if h.magic != IHAVEOPT {
            return Err(HandshakeError::Protocol(format!(
                "bad option magic {:#018x}",
                h.magic
            )));
        }
        if h.len > MAX_OPTION_LEN {
            if h.option == OPT_EXPORT_NAME {
                return Err(HandshakeError::Protocol(format!(
                    "NBD_OPT_EXPORT_NAME with {} bytes",
                    h.len
                )));
            }
            let msg = format!(
                "option data of {} bytes is over the limit of {MAX_OPTION_LEN}",
                h.len
            );
            if h.len > MAX_OPTION_DISCARD {
                send_err(wr, h.option, REP_ERR_TOO_BIG, &msg).await?;
                wr.flush().await?;
                return Err(HandshakeError::Protocol(msg));
            }
            let mut take = (&mut *rd).take(u64::from(h.len));
            let n = tokio::io::copy(&mut take, &mut tokio::io::sink()).await?;
            if n != u64::from(h.len) {
                return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
            }
            debug!(option = h.option, len = h.len, "oversize option discarded");
            send_err(wr, h.option, REP_ERR_TOO_BIG, &msg).await?;
            wr.flush().await?;
            continue;
        }
        let mut data = vec![0u8; h.len as usize];
        rd.read_exact(&mut data).await?;

        if *shutdown.borrow() && h.option != OPT_ABORT {
            send_err(wr, h.option, REP_ERR_SHUTDOWN, "server is shutting down").await?;
            wr.flush().await?;
            continue;
        }
        debug!(option = h.option, len = h.len, "option");

        match h.option {
            OPT_EXPORT_NAME => {
                let name = parse_string(&data, "export name")
                    .map_err(|e| HandshakeError::Protocol(e.0))?;
                let Some(r) = resolve(provider, &name, false, Some(peer)).await else {
                    return Err(HandshakeError::Refused(format!(
                        "NBD_OPT_EXPORT_NAME: no export {name:?}"
                    )));
                };
                let flags = transmission_flags(r.read_only, st.structured);
                let mut b = [0u8; 10 + EXPORT_NAME_ZEROES];
                b[0..8].copy_from_slice(&r.size.to_be_bytes());
                b[8..10].copy_from_slice(&flags.to_be_bytes());
                let n = if st.no_zeroes { 10 } else { b.len() };
                wr.write_all(&b[..n]).await?;
                wr.flush().await?;
                return Ok(Outcome::Transmission(finish(&mut st, &name, r)));
            }
            OPT_ABORT => {
                // The client may already have closed; a failed ACK does not matter.
                let _ = send(wr, h.option, REP_ACK, &[]).await;
                let _ = wr.flush().await;
                return Ok(Outcome::Closed);
            }
            OPT_LIST => {
                if !data.is_empty() {
                    send_err(wr, h.option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data").await?;
                } else {
                    let p = provider.clone();
                    match tokio::task::spawn_blocking(move || p.list()).await {
                        Ok(list) => {
                            for e in list {
                                if e.name.len() > MAX_STRING_LEN {
                                    continue;
                                }
                                let d = truncate_str(&e.description, MAX_STRING_LEN);
                                send(wr, h.option, REP_SERVER, &rep_server(&e.name, d)).await?;
                            }
                            send(wr, h.option, REP_ACK, &[]).await?;
                        }
                        Err(_) => {
                            send_err(wr, h.option, REP_ERR_UNSUP, "export list failed").await?
                        }
                    }
                }
            }
            OPT_STARTTLS => {
                send_err(
                    wr,
                    h.option,
                    REP_ERR_POLICY,
                    "TLS is not supported by this server",
                )
                .await?;
            }
            OPT_INFO | OPT_GO => {
                let go = h.option == OPT_GO;
                let req = match parse_info_request(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        send_err(wr, h.option, REP_ERR_INVALID, &e.0).await?;
                        wr.flush().await?;
                        continue;
                    }
                };
                let want_desc = req.requests.contains(&INFO_DESCRIPTION);
                // Only GO opens the export for transmission (the provider
                // then counts this client among its holders).
                let hold = go.then_some(peer);
                let Some(r) = resolve(provider, &req.name, want_desc, hold).await else {
                    send_err(
                        wr,
                        h.option,
                        REP_ERR_UNKNOWN,
                        &format!("no export named {:?}", req.name),
                    )
                    .await?;
                    wr.flush().await?;
                    continue;
                };
                let flags = transmission_flags(r.read_only, st.structured);
                send(wr, h.option, REP_INFO, &info_export(r.size, flags)).await?;
                if req.requests.contains(&INFO_NAME) {
                    send(wr, h.option, REP_INFO, &info_string(INFO_NAME, &r.name)).await?;
                }
                if want_desc && !r.description.is_empty() {
                    let d = truncate_str(&r.description, MAX_STRING_LEN);
                    send(wr, h.option, REP_INFO, &info_string(INFO_DESCRIPTION, d)).await?;
                }
                // Sent even when not asked: min 1 and max 32 MiB are the
                // defaults, so a client that ignores it loses nothing.
                let bs = info_block_size(MIN_BLOCK_SIZE, r.preferred_block, MAX_PAYLOAD);
                send(wr, h.option, REP_INFO, &bs).await?;
                send(wr, h.option, REP_ACK, &[]).await?;
                if go {
                    wr.flush().await?;
                    return Ok(Outcome::Transmission(finish(&mut st, &req.name, r)));
                }
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    send_err(
                        wr,
                        h.option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )
                    .await?;
                } else {
                    st.structured = true;
                    send(wr, h.option, REP_ACK, &[]).await?;
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                meta_context(wr, provider, &mut st, h.option, &data).await?;
            }
            other => {
                send_err(
                    wr,
                    other,
                    REP_ERR_UNSUP,
                    &format!("option {other} is not supported"),
                )
                .await?;
            }
        }
        wr.flush().await?;
    }
    Err(HandshakeError::Protocol(format!(
        "more than {MAX_OPTIONS} options"
    )))
}

/// Builds the outcome of a successful `NBD_OPT_GO` / `NBD_OPT_EXPORT_NAME`
/// for the export requested as `requested_name`.
fn finish(st: &mut State, requested_name: &str, r: Resolved) -> Negotiated {
    // Contexts only count if they were selected for this same export name.
    let contexts = match st.meta.take() {
        Some(m) if m.export == requested_name => m.contexts,
        _ => Vec::new(),
    };
    info!(export = %r.name, size = r.size, read_only = r.read_only, structured = st.structured,
        contexts = contexts.len(), "export opened");
    Negotiated {
        export: r.export,
        name: r.name,
        structured: st.structured,
        contexts,
    }
}

async fn meta_context<W: AsyncWrite + Unpin>(
    wr: &mut W,
    provider: &Arc<dyn ExportProvider>,
    st: &mut State,
    option: u32,
    data: &[u8],
) -> io::Result<()> {
    let set = option == OPT_SET_META_CONTEXT;
    if set {
        // "replaces all previously-set metadata contexts (including when this command fails)"
        st.meta = None;
        if !st.structured {
            return send_err(
                wr,
                option,
                REP_ERR_INVALID,
                "negotiate structured replies first",
            )
            .await;
        }
    }
    let req = match parse_meta_context_request(data) {
        Ok(r) => r,
        Err(e) => return send_err(wr, option, REP_ERR_INVALID, &e.0).await,
    };
    let Some(r) = resolve(provider, &req.export, false, None).await else {
        return send_err(
            wr,
            option,
            REP_ERR_UNKNOWN,
            &format!("no export named {:?}", req.export),
        )
        .await;
    };
    let chosen = match match_meta_contexts(&r.contexts, &req.queries, !set) {
        Ok(c) => c,
        Err(e) => return send_err(wr, option, REP_ERR_INVALID, &e.0).await,
    };
    let mut selected = Vec::with_capacity(chosen.len());
    for (i, name) in chosen.into_iter().enumerate() {
        // Ids are only meaningful after SET; LIST uses the reserved 0.
        let id = if set { i as u32 + 1 } else { 0 };
        send(wr, option, REP_META_CONTEXT, &rep_meta_context(id, &name)).await?;
        selected.push((id, name));
    }
    send(wr, option, REP_ACK, &[]).await?;
    if set {
        st.meta = Some(MetaSelection {
            export: req.export,
            contexts: selected,
        });
    }
    Ok(())
}

/// Looks an export up (on the blocking pool: providers may block).
/// The empty name means the provider's `""` export if it has one, else the
/// first export of `list()`.
/// `hold`: the client that opens the export for transmission.
async fn resolve(
    provider: &Arc<dyn ExportProvider>,
    name: &str,
    want_description: bool,
    hold: Option<SocketAddr>,
) -> Option<Resolved> {
    let p = provider.clone();
    let name = name.to_owned();
    tokio::task::spawn_blocking(move || resolve_blocking(&*p, &name, want_description, hold))
        .await
        .ok()
        .flatten()
}

fn resolve_blocking(
    p: &dyn ExportProvider,
    name: &str,
    want_description: bool,
    hold: Option<SocketAddr>,
) -> Option<Resolved> {
    let open = |name: &str| match hold {
        Some(peer) => p.open_from(name, peer),
        None => p.open(name),
    };
    let (name, export) = match open(name) {
        Some(e) => (name.to_owned(), e),
        None if name.is_empty() => {
            let first = p.list().into_iter().next()?;
            let e = open(&first.name)?;
            (first.name, e)
        }
        None => return None,
    };
    let description = if want_description {
        p.list()
            .into_iter()
            .find(|i| i.name == name)
            .map(|i| i.description)
            .unwrap_or_default()
    } else {
        String::new()
    };
    let mut contexts = vec![BASE_ALLOCATION.to_owned()];
    for c in export.extra_meta_contexts() {
        if c.len() <= MAX_STRING_LEN && namespace_of(&c).is_some() && !contexts.contains(&c) {
            contexts.push(c);
        }
    }
    Some(Resolved {
        size: export.size(),
        read_only: export.read_only(),
        preferred_block: sanitize_preferred_block_size(export.preferred_block_size()),
        name,
        description,
        export,
        contexts,
    })
}

async fn send<W: AsyncWrite + Unpin>(
    wr: &mut W,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> io::Result<()> {
    wr.write_all(&opt_reply_header(option, reply_type, data.len() as u32))
        .await?;
    wr.write_all(data).await
}

async fn send_err<W: AsyncWrite + Unpin>(
    wr: &mut W,
    option: u32,
    reply_type: u32,
    msg: &str,
) -> io::Result<()> {
    debug!(
        option,
        reply_type = format_args!("{reply_type:#x}"),
        msg,
        "option refused"
    );
    send(
        wr,
        option,
        reply_type,
        truncate_str(msg, MAX_STRING_LEN).as_bytes(),
    )
    .await
}
