#!/usr/bin/env python3
"""bench/ui.py: how long the dashboard's pages take with 100 datasets and
10,000 snapshots, against the reference in the same run: the full JSON
listing the CLI's `cistern list -t snapshot` asks for. A benchmark, not a
test: it prints figures (median of REPEAT requests per page) and the
daemon's RSS.

    python3 bench/ui.py
    DATASETS=100 SNAPSHOTS=10000 REPEAT=5 python3 bench/ui.py

Environment: CISTERN_BIN (default target/release/cistern), BENCH_DIR
(default a temporary directory, removed), DATASETS, SNAPSHOTS, REPEAT.
Goal (issue 17): every page under 1 s.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = os.environ.get("CISTERN_BIN", str(ROOT / "target" / "release" / "cistern"))
DATASETS = int(os.environ.get("DATASETS", "100"))
SNAPSHOTS = int(os.environ.get("SNAPSHOTS", "10000"))
REPEAT = int(os.environ.get("REPEAT", "5"))


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Api:
    def __init__(self, url: str, state: Path):
        self.url, self.state = url, state

    def headers(self) -> dict:
        tok = self.state / "api.token"
        return {"Authorization": f"Bearer {tok.read_text().strip()}"} if tok.exists() else {}

    def call(self, method: str, path: str, body=None) -> bytes:
        h = self.headers()
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        req = urllib.request.Request(self.url + path, data=data, headers=h, method=method)
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.read()

    def timed(self, path: str) -> float:
        t = []
        for _ in range(REPEAT):
            t0 = time.perf_counter()
            self.call("GET", path)
            t.append(time.perf_counter() - t0)
        return statistics.median(t)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main() -> int:
    own = "BENCH_DIR" not in os.environ
    work = Path(os.environ.get("BENCH_DIR") or tempfile.mkdtemp(prefix="cistern-ui-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    state = work / "state"
    api_port, nbd_port = free_port(), free_port()
    log = open(work / "daemon.log", "wb")
    d = subprocess.Popen([BIN, "serve", "--state-dir", str(state), "--api", f"127.0.0.1:{api_port}",
                          "--nbd", f"127.0.0.1:{nbd_port}"], stdout=log, stderr=subprocess.STDOUT)
    api = Api(f"http://127.0.0.1:{api_port}", state)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                api.call("GET", "/v1/health")
                break
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() > deadline or d.poll() is not None:
                    raise SystemExit("daemon did not start; see " + str(work / "daemon.log"))
                time.sleep(0.2)
        api.call("POST", "/v1/pools", {"name": "big", "groups": [{"kind": "disk", "devices": [str(work / "big0")]}],
                                       "create_size": 2 << 30})
        t0 = time.perf_counter()
        for i in range(DATASETS - 1):
            api.call("POST", "/v1/datasets", {"name": f"big/ds{i:03d}", "volsize": 0, "kind": "filesystem"})
        names = ["big"] + [f"big/ds{i:03d}" for i in range(DATASETS - 1)]
        rounds = SNAPSHOTS // len(names)
        for j in range(rounds):
            api.call("POST", "/v1/snapshots", {"names": [f"{n}@s{j:05d}" for n in names]})
        made = time.perf_counter() - t0
        print(f"{DATASETS} datasets, {rounds * len(names)} snapshots made in {made:.1f}s")
        mid = names[len(names) // 2]
        ref = api.timed("/v1/datasets")
        print(f"reference: GET /v1/datasets (everything, as `cistern list -t all`): {ref * 1000:.0f} ms")
        worst = 0.0
        for path in ("/", "/pools/big", "/datasets", f"/dataset?name={mid}", f"/snapshots?name={mid}",
                     f"/snapshots?name={mid}&page=1", "/snapshots?name=big", "/snapshots", "/policies"):
            t = api.timed(path)
            worst = max(worst, t)
            print(f"{path:40s} {t * 1000:7.0f} ms   {t / ref:6.3f}x the full listing")
        print(f"slowest page {worst * 1000:.0f} ms (goal < 1000 ms): {'OK' if worst < 1 else 'SLOW'}")
        print(f"daemon RSS {rss_kib(d.pid) / 1024:.0f} MiB")
        return 0 if worst < 1 else 1
    finally:
        d.terminate()
        try:
            d.wait(60)
        except subprocess.TimeoutExpired:
            d.kill()
        if own:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
