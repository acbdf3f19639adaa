//! Answers that leave the request body unread close the connection.
//!
//! An S3 error is often answered before the request body is read (UploadPart
//! to an unknown upload, PUT to a missing bucket). When the client sent
//! `Expect: 100-continue` (botocore does for every part and PUT), no 100 was
//! sent, so the client never sends that body and reuses the connection for its
//! next request. hyper only notices the unread body after the answer is on the
//! wire, and then takes the first bytes that arrive as the rest of the old body:
//! if the client's next request arrived first, its first bytes are eaten
//! (`DELETE` becomes `ELETE`, answered SignatureDoesNotMatch). Saying
//! `Connection: close` on such an answer removes the ambiguity: the client
//! opens a new connection and hyper closes this one (as S3 and nginx do).

use hyper::body::{Body, Frame, Incoming, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// The S3 service, with `Connection: close` on answers given before the
/// request body was read to its end.
#[derive(Clone)]
pub(crate) struct CloseIfUnread(pub(crate) s3s::service::S3Service);

impl hyper::service::Service<http::Request<Incoming>> for CloseIfUnread {
    type Response = s3s::HttpResponse;
    type Error = s3s::HttpError;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn call(&self, req: http::Request<Incoming>) -> Self::Future {
        let (req, read) = tracked(req);
        let svc = self.0.clone();
        Box::pin(async move {
            let mut resp = svc.call(req).await?;
            close_if_unread(&mut resp, &read);
            Ok(resp)
        })
    }
}

/// The request with its body wrapped to record when it has been read to its end.
pub(crate) fn tracked(req: http::Request<Incoming>) -> (s3s::HttpRequest, Arc<AtomicBool>) {
    let read = Arc::new(AtomicBool::new(req.body().is_end_stream()));
    let flag = read.clone();
    let req = req.map(move |inner| s3s::Body::http_body(Tracked { inner, read: flag }));
    (req, read)
}

/// Marks `resp` to close the connection unless the body was read to its end.
pub(crate) fn close_if_unread<B>(resp: &mut http::Response<B>, read: &AtomicBool) {
    if !read.load(Ordering::Acquire) {
        resp.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
}

/// A request body that sets `read` once it has been read to its end.
struct Tracked<B> {
    inner: B,
    read: Arc<AtomicBool>,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        // A body that ended with an error is not read to its end: hyper has
        // already given up on the connection then.
        let done = match &r {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            _ => false,
        };
        if done {
            this.read.store(true, Ordering::Release);
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::collections::VecDeque;

    /// A body of some chunks. `knows_end`: like hyper's, it has ended once
    /// its last chunk is taken; else it learns of its end only when asked
    /// once more (`Body::is_end_stream`'s default).
    struct Chunks {
        chunks: VecDeque<Bytes>,
        knows_end: bool,
    }

    impl Body for Chunks {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(
                self.get_mut()
                    .chunks
                    .pop_front()
                    .map(|b| Ok(Frame::data(b))),
            )
        }
        fn is_end_stream(&self) -> bool {
            self.knows_end && self.chunks.is_empty()
        }
    }

    fn tracked_chunks(
        chunks: &[&'static [u8]],
        knows_end: bool,
    ) -> (Tracked<Chunks>, Arc<AtomicBool>) {
        let read = Arc::new(AtomicBool::new(false));
        let inner = Chunks {
            chunks: chunks.iter().map(|c| Bytes::from_static(c)).collect(),
            knows_end,
        };
        let b = Tracked {
            inner,
            read: read.clone(),
        };
        (b, read)
    }

    /// Polls once: whether a chunk came.
    fn poll(b: &mut Tracked<Chunks>) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        matches!(Pin::new(b).poll_frame(&mut cx), Poll::Ready(Some(Ok(_))))
    }

    fn answer(read: &AtomicBool) -> http::Response<()> {
        let mut resp = http::Response::new(());
        close_if_unread(&mut resp, read);
        resp
    }

    #[test]
    fn unread_or_partly_read_body_closes_read_body_keeps_alive() {
        let (mut b, read) = tracked_chunks(&[b"ab", b"c"], true);
        assert_eq!(
            answer(&read).headers()["connection"],
            "close",
            "not read at all"
        );
        assert!(poll(&mut b));
        assert_eq!(
            answer(&read).headers()["connection"],
            "close",
            "read in part"
        );
        assert!(poll(&mut b));
        assert!(
            answer(&read).headers().get("connection").is_none(),
            "the last chunk taken: read to its end"
        );
    }

    #[test]
    fn end_seen_as_none_counts_as_read() {
        let (mut b, read) = tracked_chunks(&[b"x"], false);
        assert!(poll(&mut b));
        assert!(!read.load(Ordering::Acquire));
        assert!(!poll(&mut b), "then the end");
        assert!(read.load(Ordering::Acquire));
    }
}
