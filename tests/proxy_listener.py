"""The listening side the test proxies share (tcp_proxy.TcpProxy,
http_fault_proxy.HttpFaultProxy): a socket on 127.0.0.1 with an ephemeral
port, and a thread that hands each accepted client to a callback until the
listener is closed."""

from __future__ import annotations

import socket
import threading
from typing import Callable


class Listener:
    def __init__(self, on_client: Callable[[socket.socket], None], backlog: int = 16):
        self._on_client = on_client
        self.closed = False
        self._srv = socket.socket()
        self._srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._srv.bind(("127.0.0.1", 0))
        self._srv.listen(backlog)
        self.port = self._srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            self._on_client(c)

    def close(self):
        self.closed = True
        try:
            self._srv.close()
        except OSError:
            pass
