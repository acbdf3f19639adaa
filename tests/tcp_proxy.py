"""A small TCP proxy on 127.0.0.1 that a test owns, to cause the network
faults a test cannot otherwise cause: it forwards both ways to an upstream
port and, once `limit` bytes went through in the watched direction,
either cuts every connection (RST), or holds them (stops forwarding, sets
`tripped`) until the test releases or cuts them — a stalled peer."""

from __future__ import annotations

import socket
import struct
import threading

from proxy_listener import Listener


class TcpProxy:
    """`TcpProxy(upstream_port, limit=None, mode="cut", direction="up")`.

    direction "up" counts client->upstream bytes (an upload, `receive`),
    "down" upstream->client bytes (a download, `send`). mode "cut" closes
    all connections with a reset at `limit`; "hold" stops forwarding there
    (data stays in the socket buffers, the peers see a silent stall).
    """

    def __init__(self, upstream_port: int, limit: int | None = None, mode: str = "cut", direction: str = "up"):
        assert mode in ("cut", "hold") and direction in ("up", "down")
        self.upstream_port = upstream_port
        self.limit = limit
        self.mode = mode
        self.direction = direction
        self.passed = 0  # bytes forwarded in the watched direction
        self.tripped = threading.Event()
        self._released = threading.Event()
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._listener = Listener(self._client)
        self.port = self._listener.port

    @property
    def url(self) -> str:
        return self._listener.url

    def _client(self, c: socket.socket):
        try:
            u = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            u.settimeout(None)
        except OSError:
            c.close()
            return
        with self._lock:
            self._socks += [c, u]
        threading.Thread(target=self._pump, args=(c, u, self.direction == "up"), daemon=True).start()
        threading.Thread(target=self._pump, args=(u, c, self.direction == "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watched: bool):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                if watched and self.limit is not None:
                    with self._lock:
                        room = max(0, self.limit - self.passed)
                        take = data[:room]
                        self.passed += len(take)
                    if take:
                        dst.sendall(take)
                    if len(take) < len(data):
                        self.tripped.set()
                        if self.mode == "cut":
                            self.cut()
                            return
                        # hold: forward nothing more until released (bounded wait
                        # so an abandoned proxy does not keep a thread forever)
                        if not self._released.wait(600):
                            return
                        dst.sendall(data[len(take):])
                        self.limit = None
                        continue
                    continue
                dst.sendall(data)
        except OSError:
            pass

    def release(self):
        """hold mode: forward again from where it stopped."""
        self._released.set()

    def cut(self):
        """Resets every connection (SO_LINGER 0: the peers see ECONNRESET)."""
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                # shutdown wakes the pump blocked in recv on it (a bare close
                # would not, and the peer would never see the cut)
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def close(self):
        # Cut before waking held pumps: a held stream (say, a killed
        # sender's last bytes still in the socket buffers) must never be
        # forwarded by the teardown itself.
        self._listener.close()
        self.cut()
        self._released.set()
