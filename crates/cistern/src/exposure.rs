//! Which listeners reach beyond loopback without protection, checked before
//! anything is bound (decision 0025). A daemon asked to serve NBD, the API,
//! S3, NFS or SMB on a non-loopback address without TLS (and, for NBD,
//! client certificates) refuses to start and says which setting is
//! missing; `cistern serve --insecure` starts anyway with one loud warning.

use crate::config::Resolved;
use anyhow::{bail, Result};
use std::net::SocketAddr;

/// 127.0.0.0/8 and ::1 (and ::ffff:127.x) stay on this machine; 0.0.0.0,
/// :: and every other address do not.
pub fn is_loopback(addr: &SocketAddr) -> bool {
    match addr {
        SocketAddr::V4(a) => a.ip().is_loopback(),
        SocketAddr::V6(a) => {
            a.ip().is_loopback() || a.ip().to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// Each unprotected non-loopback listener: what listens where, and what to set.
pub fn unprotected(r: &Resolved) -> Vec<String> {
    let mut out = Vec::new();
    let mut check = |what: &str, addr: SocketAddr, missing: Option<String>| {
        if let (false, Some(m)) = (is_loopback(&addr), missing) {
            out.push(format!("{what} listens on {addr}, beyond loopback, {m}"));
        }
    };
    let nbd_missing = match &r.nbd_server.tls {
        None => Some(
            "without TLS: set [nbd] tls = \"require\", tls_cert, tls_key and tls_ca (client certificates)"
                .to_string(),
        ),
        Some(t) if !t.require => Some(
            "with TLS optional: set [nbd] tls = \"require\" (plaintext clients could reach every volume)"
                .to_string(),
        ),
        Some(_) if !r.nbd_client_certs => Some(
            "without client certificates: set [nbd] tls_ca (anyone completing TLS could write every volume)"
                .to_string(),
        ),
        Some(_) => None,
    };
    check("NBD", r.nbd.addr, nbd_missing);
    check(
        "the API",
        r.api.addr,
        r.api_tls
            .is_none()
            .then(|| "without TLS: set [api] tls_cert and tls_key".to_string()),
    );
    if let Some(s3) = &r.s3 {
        check(
            "S3",
            s3.listen.addr,
            s3.tls
                .is_none()
                .then(|| "without TLS: set [s3] tls_cert and tls_key".to_string()),
        );
    }
    if let Some(n) = &r.nfs {
        check(
            "NFS",
            n.listen.addr,
            Some("and NFSv3 has no TLS: keep it on 127.0.0.1 (or pass --insecure)".to_string()),
        );
    }
    if r.smb.enabled {
        check(
            "SMB",
            r.smb.listen,
            Some("and the daemon's smbd has no TLS: keep [smb] listen on 127.0.0.1 (or pass --insecure)".to_string()),
        );
    }
    out
}

/// Refuses an unprotected exposure unless `insecure`; with it, one loud
/// warning names every unprotected listener.
pub fn check(r: &Resolved, insecure: bool) -> Result<()> {
    let bad = unprotected(r);
    if bad.is_empty() {
        return Ok(());
    }
    if !insecure {
        bail!(
            "refusing to start: {}; `cistern serve --insecure` starts anyway (labs only)",
            bad.join("; ")
        );
    }
    tracing::warn!(
        "INSECURE (--insecure): {}. Anyone who can reach these addresses can read, change or destroy data.",
        bad.join("; ")
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_addresses() {
        for a in [
            "127.0.0.1:1",
            "127.3.2.1:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(is_loopback(&a.parse().unwrap()), "{a}");
        }
        for a in [
            "0.0.0.0:1",
            "[::]:1",
            "10.0.0.1:1",
            "[fe80::1]:1",
            "192.168.1.2:1",
        ] {
            assert!(!is_loopback(&a.parse().unwrap()), "{a}");
        }
    }
}
