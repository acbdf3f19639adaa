//! One server TLS connection shared by a reader task and any number of
//! writer threads (decision 0043).
//!
//! A split `tokio_rustls` stream can only be written from one task, so a
//! front end whose replies are produced on worker threads had to copy each
//! reply into a queue and hand it to a writer task, which copied it again
//! into TLS records. Here the rustls connection sits under a mutex next to
//! the socket: a worker seals its reply into records straight from its own
//! buffers (`writev`-style pieces, no gathering copy) and writes them with a
//! non-blocking `writev` of the records, on its own thread. Only what the
//! socket does not take stays queued in rustls for the caller's drain task
//! ([`SharedTls::writable`] + [`SharedTls::try_flush`]).
//!
//! The reader side ([`SharedTlsReader`]) is an `AsyncRead` that takes the
//! mutex only to decrypt what the socket delivered.

use std::io::{self, IoSlice, Read, Write};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use rustls::ServerConnection;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::TlsStream;

/// The writing side: the rustls connection and the socket.
pub struct SharedTls {
    conn: Mutex<ServerConnection>,
    sock: Arc<TcpStream>,
    /// Records the reader queued (alerts, key update replies) that the
    /// socket did not take at once.
    flush_wanted: Notify,
}

/// The reading side: decrypted bytes as an `AsyncRead`.
pub struct SharedTlsReader {
    shared: Arc<SharedTls>,
    sock: Arc<TcpStream>,
}

/// Splits a finished server connection into its reader and its shared
/// writer. Whatever rustls already holds (records read ahead, plaintext
/// not read yet) stays in the connection, so nothing is lost in the switch.
/// rustls' own queue limit is lifted: the caller bounds what it sends
/// (NBD's in-flight byte budget).
pub fn share(stream: TlsStream<TcpStream>) -> (SharedTlsReader, Arc<SharedTls>) {
    let (sock, mut conn) = stream.into_inner();
    conn.set_buffer_limit(None);
    let sock = Arc::new(sock);
    let shared = Arc::new(SharedTls {
        conn: Mutex::new(conn),
        sock: sock.clone(),
        flush_wanted: Notify::new(),
    });
    (
        SharedTlsReader {
            shared: shared.clone(),
            sock,
        },
        shared,
    )
}

/// `io::Write` over a non-blocking socket (rustls' `write_tls` writes its
/// queued records with one `writev`).
struct SockWrite<'a>(&'a TcpStream);

impl Write for SockWrite<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.try_write(b)
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> io::Result<usize> {
        self.0.try_write_vectored(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct SockRead<'a>(&'a TcpStream);

impl Read for SockRead<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(b)
    }
}

/// Writes queued records until none is left (`Ok((n, true))`) or the socket
/// is full (`Ok((n, false))`); `n` bytes went out.
fn flush_locked(conn: &mut ServerConnection, sock: &TcpStream) -> io::Result<(usize, bool)> {
    let mut wrote = 0;
    while conn.wants_write() {
        match conn.write_tls(&mut SockWrite(sock)) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => wrote += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok((wrote, false)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok((wrote, true))
}

impl SharedTls {
    fn lock(&self) -> MutexGuard<'_, ServerConnection> {
        // rustls keeps its state consistent between calls; a panic in
        // another thread loses that thread's reply, not the connection's.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seals `bufs` (one message, kept contiguous) into records and writes
    /// what the socket takes now, without blocking. `Ok(true)`: nothing is
    /// queued any more (this and every earlier message is on the wire);
    /// `Ok(false)`: the rest waits for [`SharedTls::try_flush`].
    pub fn send(&self, mut bufs: &mut [IoSlice<'_>]) -> io::Result<bool> {
        let mut conn = self.lock();
        while !bufs.is_empty() {
            // Without a buffer limit rustls takes everything at once; it
            // stops early only to update its keys first.
            let n = conn.writer().write_vectored(bufs)?;
            if n == 0 && bufs.iter().any(|b| !b.is_empty()) {
                return Err(io::Error::other("the TLS connection takes no more data"));
            }
            IoSlice::advance_slices(&mut bufs, n);
        }
        Ok(flush_locked(&mut conn, &self.sock)?.1)
    }

    /// Writes queued records until the socket is full: `(bytes written,
    /// nothing left)`.
    pub fn try_flush(&self) -> io::Result<(usize, bool)> {
        flush_locked(&mut self.lock(), &self.sock)
    }

    /// Resolves when the socket may take more bytes.
    pub async fn writable(&self) -> io::Result<()> {
        self.sock.writable().await
    }

    /// Resolves when the reader queued records the socket did not take
    /// (call [`SharedTls::try_flush`] as the socket allows).
    pub async fn flush_wanted(&self) {
        self.flush_wanted.notified().await
    }

    /// Queues TLS `close_notify` (flush it with [`SharedTls::try_flush`]).
    pub fn close_notify(&self) {
        self.lock().send_close_notify();
    }
}

impl AsyncRead for SharedTlsReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            let mut conn = this.shared.lock();
            match conn.reader().read(buf.initialize_unfilled()) {
                // 0: the peer sent close_notify.
                Ok(n) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // UnexpectedEof: the socket closed without close_notify.
                Err(e) => return Poll::Ready(Err(e)),
            }
            match conn.read_tls(&mut SockRead(&this.sock)) {
                Ok(_) => {
                    // At EOF too: records still buffered are processed, and
                    // the next `reader().read` reports the end.
                    let r = conn.process_new_packets();
                    // Alerts or a key update answer rustls queued.
                    if conn.wants_write() {
                        match flush_locked(&mut conn, &this.sock) {
                            Ok((_, true)) => {}
                            Ok((_, false)) => this.shared.flush_wanted.notify_one(),
                            Err(e) => return Poll::Ready(Err(e)),
                        }
                    }
                    if let Err(e) = r {
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, e)));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    drop(conn);
                    match this.sock.poll_read_ready(cx) {
                        Poll::Ready(Ok(())) => continue,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}
