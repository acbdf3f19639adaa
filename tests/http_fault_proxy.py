"""An HTTP-aware proxy on 127.0.0.1 in front of an S3 server, to cause the
one fault a test cannot otherwise cause: a PUT that reaches the store but
whose answer is lost. Each request is forwarded on its own upstream
connection (`Connection: close`); `decide(method, path)` says what happens:

- "pass": forwarded, the answer relayed;
- "drop": forwarded (the object lands), the answer read and thrown away,
  the client's connection closed without a reply;
- "fail": not forwarded, the client gets 503 SlowDown.

Only plain HTTP/1.1 with Content-Length request bodies (what object_store
sends); everything else is refused loudly rather than guessed at."""

from __future__ import annotations

import socket
import threading
from typing import Callable

from proxy_listener import Listener

Decide = Callable[[str, str], str]


def _read_head(sock: socket.socket, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > 1 << 20:
            raise ValueError("request head larger than 1 MiB")
    i = buf.index(b"\r\n\r\n") + 4
    head = bytes(buf[:i])
    del buf[:i]
    return head


def _read_exact(sock: socket.socket, buf: bytearray, n: int) -> bytes:
    while len(buf) < n:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("client closed mid-body")
        buf += chunk
    body = bytes(buf[:n])
    del buf[:n]
    return body


class HttpFaultProxy:
    def __init__(self, upstream_port: int, decide: Decide | None = None):
        self.upstream_port = upstream_port
        self.decide: Decide = decide or (lambda m, p: "pass")
        self.lock = threading.Lock()
        self.counts = {"pass": 0, "drop": 0, "fail": 0}
        self._listener = Listener(
            lambda c: threading.Thread(target=self._serve, args=(c,), daemon=True).start(), backlog=64
        )
        self.port = self._listener.port

    @property
    def url(self) -> str:
        return self._listener.url

    def _serve(self, c: socket.socket):
        buf = bytearray()
        try:
            for _ in range(100_000):  # bounded: one client connection's requests
                head = _read_head(c, buf)
                if head is None:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = [ln for ln in lines[1:] if ln]
                length = 0
                for h in headers:
                    k, _, v = h.partition(":")
                    if k.strip().lower() == "content-length":
                        length = int(v.strip())
                    if k.strip().lower() == "transfer-encoding":
                        raise ValueError(f"unsupported request encoding: {h}")
                body = _read_exact(c, buf, length)
                action = self.decide(method, path)
                with self.lock:
                    self.counts[action] += 1
                if action == "fail":
                    msg = b"<Error><Code>SlowDown</Code><Message>proxy</Message></Error>"
                    c.sendall(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                        + f"Content-Length: {len(msg)}\r\n\r\n".encode()
                        + msg
                    )
                    continue
                fwd = [lines[0]] + [h for h in headers if h.split(":", 1)[0].strip().lower() != "connection"]
                fwd.append("Connection: close")
                answer = self._upstream(("\r\n".join(fwd) + "\r\n\r\n").encode("latin-1") + body)
                if action == "drop":
                    c.shutdown(socket.SHUT_RDWR)
                    return
                c.sendall(answer)
                if not answer or b"\r\nconnection: close" in answer.split(b"\r\n\r\n", 1)[0].lower():
                    return
        except (OSError, ValueError, ConnectionError):
            return
        finally:
            c.close()

    def _upstream(self, request: bytes) -> bytes:
        """Sends one request and returns the whole answer (read to EOF)."""
        u = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=60)
        try:
            u.sendall(request)
            out = bytearray()
            while True:
                chunk = u.recv(1 << 20)
                if not chunk:
                    break
                out += chunk
            # The client may reuse its connection: say it is closed after this.
            head, sep, rest = bytes(out).partition(b"\r\n\r\n")
            if sep and b"\r\nconnection:" not in head.lower():
                head += b"\r\nConnection: close"
            return head + sep + rest
        finally:
            u.close()

    def close(self):
        self._listener.close()
