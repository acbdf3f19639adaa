//! Handshake phase: fixed newstyle greeting and option haggling, up to the
//! point where an export is chosen (`NBD_OPT_EXPORT_NAME` or a successful
//! `NBD_OPT_GO`).

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::proto::*;
use crate::{Access, BlockExport, Client, ExportProvider};

/// Most options one connection may send before we give up on it.
pub(crate) const MAX_OPTIONS: usize = 65_536;
/// Most options a client may send before STARTTLS when TLS is required.
const MAX_OPTIONS_BEFORE_TLS: usize = 16;

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
    /// STARTTLS was acknowledged: upgrade, then haggle again.
    StartTls,
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

/// What the option loop knows about the connection.
pub(crate) struct Ctx<'a> {
    pub provider: &'a Arc<dyn ExportProvider>,
    pub client: Client,
    /// The server has TLS configured (STARTTLS is acknowledged).
    pub tls_available: bool,
    /// FORCEDTLS: nothing but STARTTLS and ABORT before the upgrade.
    pub require: bool,
    pub no_zeroes: bool,
}

impl Ctx<'_> {
    /// Plaintext connection on a server that insists on TLS.
    fn forced(&self) -> bool {
        self.require && !self.client.tls
    }
}

/// Sends the greeting and reads the client's flags: whether it asked for
/// `NBD_FLAG_C_NO_ZEROES`.
pub(crate) async fn greet<R, W>(rd: &mut R, wr: &mut W) -> Result<bool, HandshakeError>
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
    Ok(client_flags & FLAG_C_NO_ZEROES != 0)
}

/// Runs the option haggling over `rd`/`wr` (after [`greet`], and again
/// from scratch after STARTTLS). `wr` should be buffered: it is flushed
/// after every complete option reply. `options_left` bounds the options of
/// the whole connection.
pub(crate) async fn negotiate<R, W>(
    rd: &mut R,
    wr: &mut W,
    ctx: &Ctx<'_>,
    shutdown: &mut watch::Receiver<bool>,
    options_left: &mut usize,
) -> Result<Outcome, HandshakeError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let provider = ctx.provider;
    let client = &ctx.client;
    // Nothing negotiated before STARTTLS survives it (proto.md).
    let mut st = State {
        structured: false,
        no_zeroes: ctx.no_zeroes,
        meta: None,
    };
    let mut before_tls = 0usize;

    loop {
        if *options_left == 0 {
            break;
        }
        *options_left -= 1;
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
        if ctx.forced() {
            // Before TLS only STARTTLS (no data) and ABORT make sense: a
            // client that sends much or many is not worth reading.
            before_tls += 1;
            if h.len as usize > MAX_STRING_LEN || before_tls > MAX_OPTIONS_BEFORE_TLS {
                return Err(HandshakeError::Protocol(format!(
                    "option {} with {} bytes (option {before_tls}) before TLS",
                    h.option, h.len
                )));
            }
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
        debug!(option = h.option, len = h.len, tls = client.tls, "option");

        if ctx.forced() && h.option != OPT_STARTTLS && h.option != OPT_ABORT {
            if h.option == OPT_EXPORT_NAME {
                // It has no error reply: the connection ends (proto.md).
                return Err(HandshakeError::Refused(
                    "NBD_OPT_EXPORT_NAME before TLS (tls = require)".into(),
                ));
            }
            send_err(
                wr,
                h.option,
                REP_ERR_TLS_REQD,
                "this server requires TLS: send NBD_OPT_STARTTLS first",
            )
            .await?;
            wr.flush().await?;
            continue;
        }

        match h.option {
            OPT_EXPORT_NAME => {
                let name = parse_string(&data, "export name")
                    .map_err(|e| HandshakeError::Protocol(e.0))?;
                let r = match resolve(provider, &name, false, true, client).await {
                    Ok(r) => r,
                    Err(why) => {
                        return Err(HandshakeError::Refused(format!(
                            "NBD_OPT_EXPORT_NAME {name:?}: {}",
                            why.describe()
                        )))
                    }
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
                    let c = client.clone();
                    match tokio::task::spawn_blocking(move || p.list_for(&c)).await {
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
                if !data.is_empty() {
                    send_err(
                        wr,
                        h.option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STARTTLS takes no data",
                    )
                    .await?;
                } else if client.tls {
                    send_err(wr, h.option, REP_ERR_INVALID, "TLS is already on").await?;
                } else if !ctx.tls_available {
                    send_err(
                        wr,
                        h.option,
                        REP_ERR_POLICY,
                        "TLS is not enabled on this server",
                    )
                    .await?;
                } else {
                    send(wr, h.option, REP_ACK, &[]).await?;
                    wr.flush().await?;
                    return Ok(Outcome::StartTls);
                }
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
                let r = match resolve(provider, &req.name, want_desc, go, client).await {
                    Ok(r) => r,
                    Err(why) => {
                        if let Refusal::Denied(m) = &why {
                            info!(export = %req.name, client = ?client.common_name,
                                tls = client.tls, "NBD client refused: {m}");
                        }
                        let (code, msg) = match why {
                            Refusal::Unknown => {
                                (REP_ERR_UNKNOWN, format!("no export named {:?}", req.name))
                            }
                            Refusal::TlsRequired => (
                                REP_ERR_TLS_REQD,
                                format!("export {:?} requires TLS", req.name),
                            ),
                            Refusal::Denied(_) => (
                                REP_ERR_POLICY,
                                format!("access to export {:?} denied", req.name),
                            ),
                        };
                        send_err(wr, h.option, code, &msg).await?;
                        wr.flush().await?;
                        continue;
                    }
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
                meta_context(wr, provider, client, &mut st, h.option, &data).await?;
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
    client: &Client,
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
    let r = match resolve(provider, &req.export, false, false, client).await {
        Ok(r) => r,
        Err(Refusal::Unknown) => {
            return send_err(
                wr,
                option,
                REP_ERR_UNKNOWN,
                &format!("no export named {:?}", req.export),
            )
            .await
        }
        // TLS_REQD is only for INFO/GO/EXPORT_NAME (proto.md).
        Err(_) => {
            return send_err(
                wr,
                option,
                REP_ERR_POLICY,
                &format!("access to export {:?} denied", req.export),
            )
            .await
        }
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

/// Why an export was not resolved.
#[derive(Debug)]
enum Refusal {
    Unknown,
    TlsRequired,
    Denied(String),
}

impl Refusal {
    fn describe(&self) -> String {
        match self {
            Refusal::Unknown => "no such export".into(),
            Refusal::TlsRequired => "the export requires TLS".into(),
            Refusal::Denied(m) => format!("denied: {m}"),
        }
    }
}

/// Looks an export up (on the blocking pool: providers may block) and asks
/// the provider what `client` may do with it. The empty name means the
/// provider's `""` export if it has one, else the first export the client
/// may list. `hold`: the client opens it for transmission.
async fn resolve(
    provider: &Arc<dyn ExportProvider>,
    name: &str,
    want_description: bool,
    hold: bool,
    client: &Client,
) -> Result<Resolved, Refusal> {
    let p = provider.clone();
    let name = name.to_owned();
    let client = client.clone();
    tokio::task::spawn_blocking(move || {
        resolve_blocking(&*p, &name, want_description, hold, &client)
    })
    .await
    .unwrap_or(Err(Refusal::Unknown))
}

fn resolve_blocking(
    p: &dyn ExportProvider,
    name: &str,
    want_description: bool,
    hold: bool,
    client: &Client,
) -> Result<Resolved, Refusal> {
    let allowed = |name: &str| match p.access(name, client) {
        Access::Denied(m) => Err(Refusal::Denied(m)),
        Access::TlsRequired if !client.tls => Err(Refusal::TlsRequired),
        Access::ReadOnly => Ok(true),
        _ => Ok(false),
    };
    let open = |name: &str| {
        if hold {
            p.open_from(name, client.peer)
        } else {
            p.open(name)
        }
    };
    let mut read_only = allowed(name)?;
    let (name, export) = match open(name) {
        Some(e) => (name.to_owned(), e),
        None if name.is_empty() => {
            let first = p
                .list_for(client)
                .into_iter()
                .next()
                .ok_or(Refusal::Unknown)?;
            read_only = allowed(&first.name)?;
            let e = open(&first.name).ok_or(Refusal::Unknown)?;
            (first.name, e)
        }
        None => return Err(Refusal::Unknown),
    };
    let export: Arc<dyn BlockExport> = if read_only {
        Arc::new(crate::ReadOnlyExport(export))
    } else {
        export
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
    Ok(Resolved {
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
