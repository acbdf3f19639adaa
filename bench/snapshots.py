"""Driver of bench/snapshots.sh (see there). Starts its own daemon on a
file-backed pool under BENCH_DIR, prints a table per measurement."""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = os.environ["CISTERN_BIN"]
DIR = Path(os.environ["BENCH_DIR"])
RUNTIME = int(os.environ.get("RUNTIME", "15"))
REPS = int(os.environ.get("REPS", "10"))
SNAPSHOTS = int(os.environ.get("SNAPSHOTS", "100"))
BIG = os.environ.get("BIG", "16G")
MiB = 1 << 20


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


NBD_PORT, API_PORT = free_port(), free_port()
ENV = dict(os.environ, CISTERN_API=f"http://127.0.0.1:{API_PORT}")


def cli(*args: str) -> str:
    p = subprocess.run([BIN, *args], env=ENV, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"cistern {' '.join(args)} failed: {p.stderr}")
    return p.stdout


def uri(export: str) -> str:
    return f"nbd://127.0.0.1:{NBD_PORT}/{export}"


def fill(export: str, size: str):
    """Writes the whole volume with nbdkit's pattern data (not compressible to nothing)."""
    subprocess.run(
        ["nbdcopy", "--", "[", "nbdkit", "pattern", f"size={size}", "]", uri(export)],
        check=True,
    )


def overwrite(export: str, offset: int, length: int, seed: int):
    """Random data over [offset, offset+length), flushed (fio nbd engine would do too)."""
    subprocess.run(
        ["fio", "--name=ow", "--ioengine=nbd", f"--uri={uri(export)}", "--rw=write", "--bs=1M",
         f"--offset={offset}", f"--size={length}", "--iodepth=8", f"--randseed={seed}",
         "--refill_buffers", "--end_fsync=1", "--output-format=json"],
        check=True, capture_output=True,
    )


def fio_4k_flush(export: str) -> float:
    out = subprocess.run(
        ["fio", "--name=r", "--ioengine=nbd", f"--uri={uri(export)}", "--rw=randwrite", "--bs=4k",
         "--fsync=1", "--numjobs=8", "--iodepth=1", "--group_reporting", "--time_based",
         f"--runtime={RUNTIME}", "--size=1G", "--refill_buffers", "--output-format=json"],
        check=True, capture_output=True, text=True,
    ).stdout
    return json.loads(out[out.index("{"):])["jobs"][0]["write"]["iops"]


def timed(*args: str) -> float:
    t = time.perf_counter()
    cli(*args)
    return time.perf_counter() - t


def main():
    log = open(DIR / "daemon.log", "wb")
    daemon = subprocess.Popen(
        [BIN, "serve", "--state-dir", DIR / "state", "--nbd", f"127.0.0.1:{NBD_PORT}",
         "--api", f"127.0.0.1:{API_PORT}"],
        stdout=log, stderr=subprocess.STDOUT, env=ENV,
    )
    try:
        for _ in range(100):
            if subprocess.run([BIN, "pool", "list"], env=ENV, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        cli("pool", "create", "-s", "64G", "bench", str(DIR / "disk0"))
        cli("create", "-V", "1G", "-o", "compression=off", "bench/small")
        cli("create", "-V", BIG, "-o", "compression=off", "bench/big")
        print(f"==> filling bench/small (1G) and bench/big ({BIG})", flush=True)
        fill("bench/small", "1G")
        fill("bench/big", BIG)

        print("\n== snapshot creation latency (cistern snapshot, wall time incl. CLI start)")
        lat = {}
        for vol in ("small", "big"):
            samples = [timed("snapshot", f"bench/{vol}@lat{i}") * 1000 for i in range(REPS)]
            lat[vol] = statistics.median(samples)
            print(f"{vol:6} median {lat[vol]:7.2f} ms  min {min(samples):7.2f}  max {max(samples):7.2f}")
        print(f"ratio big/small: {lat['big'] / lat['small']:.2f} (target ~1.0)")
        for vol in ("small", "big"):
            cli("destroy", f"bench/{vol}@lat0%lat{REPS - 1}")

        print(f"\n== 4K random writes + FLUSH, 8 connections, {RUNTIME}s (fio nbd engine)")
        base = fio_4k_flush("bench/small")
        print(f"0 snapshots:   {base:9.0f} IOPS", flush=True)
        for i in range(SNAPSHOTS):
            overwrite("bench/small", (i * 4 * MiB) % (1 << 30), 4 * MiB, i)
            cli("snapshot", f"bench/small@h{i}")
        held = cli("get", "-Hp", "-o", "value", "usedbysnapshots", "bench/small").strip()
        with_snaps = fio_4k_flush("bench/small")
        print(f"{SNAPSHOTS} snapshots: {with_snaps:9.0f} IOPS  (snapshots hold {int(held) >> 20} MiB)")
        print(f"ratio with/without: {with_snaps / base:.2f} (target >= 0.90)")
        cli("destroy", f"bench/small@h0%h{SNAPSHOTS - 1}")

        print("\n== destroy time against data unique to the snapshot")
        print(f"{'unique':>8} {'destroy s':>10} {'freed':>8} {'GiB/s':>8}")
        for size_mb in (64, 256, 1024):
            cli("snapshot", f"bench/big@d{size_mb}")
            overwrite("bench/big", 0, size_mb * MiB, size_mb)
            cli("snapshot", f"bench/big@after{size_mb}")  # the head no longer shares it
            t = time.perf_counter()
            out = cli("destroy", "-vp", f"bench/big@d{size_mb}")
            dt = time.perf_counter() - t
            freed = int(out.strip().splitlines()[-1].split()[-1])
            print(f"{size_mb:>7}M {dt:>10.3f} {freed >> 20:>7}M {freed / dt / (1 << 30):>8.2f}")
            cli("destroy", f"bench/big@after{size_mb}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(120)
        for f in DIR.glob("disk*"):
            f.unlink()


if __name__ == "__main__":
    main()
