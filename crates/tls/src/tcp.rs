//! Socket options every TCP front end (NBD, S3, NFS, the API) sets on a
//! connection it accepts. Why a loopback peer leaves BBR:
//! docs/decisions/0080-loopback-connections-unpaced.md.

use std::ffi::c_void;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use tokio::net::TcpStream;

/// The congestion control a loopback connection is moved to when the
/// system's default paces (BBR): Linux's default, always built in.
const UNPACED: &[u8] = b"cubic";

/// Sets up an accepted connection:
/// - `TCP_NODELAY`: replies go out as a header and then a payload in
///   separate writes; Nagle and delayed ACKs would add ~40 ms to each small one.
/// - For a peer on this host, a pacing congestion control (BBR) is replaced
///   by cubic. Pacing exists to spare a network's queues; over loopback
///   there is none, and it costs a timer per burst: cached 1 MiB NBD reads
///   were 27% slower with it (decision 0080). Remote peers keep the
///   system's choice.
///
/// Failures only cost speed, so they are logged at debug and ignored.
pub fn accepted(sock: &TcpStream, peer: SocketAddr) {
    if let Err(e) = sock.set_nodelay(true) {
        tracing::debug!(%peer, "cannot set TCP_NODELAY: {e}");
    }
    if is_local(peer) {
        if let Err(e) = unpace(sock.as_raw_fd()) {
            tracing::debug!(%peer, "cannot change the congestion control: {e}");
        }
    }
}

/// A peer on this host: 127.0.0.0/8, ::1, or either mapped into IPv6.
fn is_local(peer: SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// Moves the socket off a pacing congestion control, if it is on one.
fn unpace(fd: RawFd) -> io::Result<()> {
    if congestion_control(fd)?.starts_with("bbr") {
        set_congestion_control(fd, UNPACED)?;
    }
    Ok(())
}

/// The socket's congestion control algorithm (`TCP_CONGESTION`).
fn congestion_control(fd: RawFd) -> io::Result<String> {
    // TCP_CA_NAME_MAX is 16 with the terminating NUL.
    let mut name = [0u8; 16];
    let mut len = name.len() as libc::socklen_t;
    // SAFETY: `name` is writable for `len` bytes; the kernel writes at most that.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_mut_ptr().cast::<c_void>(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let name = &name[..(len as usize).min(name.len())];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Sets the socket's congestion control algorithm (`TCP_CONGESTION`).
fn set_congestion_control(fd: RawFd, name: &[u8]) -> io::Result<()> {
    // SAFETY: `name` is readable for its length.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            name.as_ptr().cast::<c_void>(),
            name.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn only_peers_on_this_host_are_local() {
        for p in [
            "127.0.0.1:1",
            "127.9.9.9:1",
            "[::1]:1",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(is_local(p.parse().unwrap()), "{p}");
        }
        for p in [
            "10.0.0.1:1",
            "192.168.1.2:1",
            "[2001:db8::1]:1",
            "[::ffff:10.0.0.1]:1",
        ] {
            assert!(!is_local(p.parse().unwrap()), "{p}");
        }
    }

    /// An accepted loopback connection whose congestion control was `cc`
    /// before [`accepted`]: what it is after, and whether NODELAY is set.
    async fn after_accept(cc: &[u8]) -> io::Result<(String, bool)> {
        let l = TcpListener::bind("127.0.0.1:0").await?;
        let addr = l.local_addr()?;
        let (client, server) = tokio::join!(TcpStream::connect(addr), l.accept());
        let (_client, (sock, peer)) = (client?, server?);
        set_congestion_control(sock.as_raw_fd(), cc)?;
        accepted(&sock, peer);
        Ok((congestion_control(sock.as_raw_fd())?, sock.nodelay()?))
    }

    #[tokio::test]
    async fn a_loopback_connection_leaves_bbr_and_keeps_other_choices() {
        // reno is always there: a non-pacing choice is left as it is.
        assert_eq!(after_accept(b"reno").await.unwrap(), ("reno".into(), true));
        match after_accept(b"bbr").await {
            Ok(got) => assert_eq!(got, ("cubic".into(), true)),
            // A kernel without BBR cannot pace this way: nothing to undo.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                eprintln!("tcp_bbr is not available here; the BBR case was not run")
            }
            Err(e) => panic!("{e}"),
        }
    }
}
