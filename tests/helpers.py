"""Helpers shared by the tests (no fixtures here; see conftest.py)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import subprocess
import time

import nbd

MiB = 1 << 20
KiB = 1 << 10


def parse_get(out: str) -> dict[str, str]:
    """Parses `cistern get -H[p] ...` output (ZFS layout: NAME PROPERTY VALUE SOURCE,
    tab-separated) into {property: value}."""
    props: dict[str, str] = {}
    for line in out.splitlines():
        if not line.strip():
            continue
        f = line.split("\t") if "\t" in line else line.split()
        if len(f) >= 4:
            props[f[1]] = f[2]
        elif len(f) == 3:  # PROPERTY VALUE SOURCE
            props[f[0]] = f[1]
        elif len(f) == 2:
            props[f[0]] = f[1]
    return props


def parse_size(s: str) -> int:
    """'16K' -> 16384, '1.5G' -> ..., '123' -> 123."""
    s = s.strip()
    units = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
    num = s.rstrip("KMGTPBkmgtpbi")
    unit = s[len(num):].upper().replace("I", "").replace("B", "") or ""
    return int(float(num) * units[unit])


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def pattern(seed: int | str, n: int) -> bytes:
    """Deterministic pseudo-random bytes."""
    return random.Random(seed).randbytes(n)


def connect(uri: str, *, strict: bool = True) -> nbd.NBD:
    h = nbd.NBD()
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    if not strict:
        # Let requests libnbd would refuse client-side reach the server.
        h.set_strict_mode(0)
    h.connect_uri(uri)
    return h


def close(h: nbd.NBD):
    """Disconnects politely; frees the handle (libnbd < 1.16 has no close())."""
    with contextlib.suppress(nbd.Error):
        h.shutdown()
    if hasattr(h, "close"):
        h.close()


@contextlib.contextmanager
def connected(uri: str, **kw):
    h = connect(uri, **kw)
    try:
        yield h
    finally:
        close(h)


def allocation_map(h: nbd.NBD, offset: int, length: int) -> list[tuple[int, int, int]]:
    """base:allocation block status of [offset, offset+length) as (offset, len, flags),
    asking again where the server answered only a prefix."""
    out: list[tuple[int, int, int]] = []
    pos, end = offset, offset + length
    while pos < end:
        got: list[tuple[int, int]] = []

        def cb(metacontext, off, entries, err):
            if metacontext == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(zip(entries[0::2], entries[1::2]))
            return 0

        h.block_status(min(end - pos, 1 << 30), pos, cb)
        assert got, f"block_status at {pos} returned no extents"
        for ln, flags in got:
            assert ln > 0, f"zero-length extent at {pos}"
            ln = min(ln, end - pos)
            if out and out[-1][2] == flags and out[-1][0] + out[-1][1] == pos:
                out[-1] = (out[-1][0], out[-1][1] + ln, flags)
            else:
                out.append((pos, ln, flags))
            pos += ln
            if pos >= end:
                break
    return out


def flags_at(amap, pos: int) -> int:
    for off, ln, flags in amap:
        if off <= pos < off + ln:
            return flags
    raise KeyError(pos)


def nbdinfo_json(uri: str, *extra) -> dict:
    p = subprocess.run(["nbdinfo", "--json", *extra, uri], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"nbdinfo {uri} failed: {p.stderr}"
    return json.loads(p.stdout)


def wait_until(pred, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Volume:
    def __init__(self, daemon, name: str):
        self.daemon = daemon
        self.name = name

    @property
    def uri(self) -> str:
        return self.daemon.uri(self.name)

    def connect(self, **kw) -> nbd.NBD:
        return connect(self.uri, **kw)

    def connected(self, **kw):
        return connected(self.uri, **kw)

    def props(self) -> dict[str, str]:
        return self.daemon.props(self.name)

    def prop(self, name: str) -> str:
        return self.daemon.prop(self.name, name)

    def size(self) -> int:
        return int(self.prop("volsize"))

    def __repr__(self):
        return f"Volume({self.name} @ {self.uri})"


# A resumable receive checkpoints every MiB with txgs this small.
SMALL_TXGS = '[engine]\ndirty_max_bytes = "2M"\n'


def with_small_txgs(config: str | None) -> str:
    """`config` (TOML) with SMALL_TXGS in its [engine] table."""
    config = config or ""
    if "[engine]\n" in config:
        return config.replace("[engine]\n", SMALL_TXGS, 1)
    return SMALL_TXGS + config


def two_daemons(make_daemon, disks, src_pool: str = "tank", dst_pool: str = "backup", *, size: str = "1G",
                mirror: bool = False, config: str | None = None, small_txgs: bool = False, env: dict | None = None):
    """The send/receive and replication set-up: daemons `src` (pool
    `src_pool`) and `dst` (pool `dst_pool`), each pool one sparse file of
    `size` under `disks` (a 2-way mirror with `mirror`), both with `config`;
    `small_txgs`: the target's txgs are small (see SMALL_TXGS)."""
    src = make_daemon("src", config=config, env=env)
    dst = make_daemon("dst", config=with_small_txgs(config) if small_txgs else config, env=env)
    for d, pool in ((src, src_pool), (dst, dst_pool)):
        if mirror:
            d.cli("pool", "create", "-s", size, pool, "mirror", disks / f"{pool}-a", disks / f"{pool}-b")
        else:
            d.cli("pool", "create", "-s", size, pool, disks / f"{pool}-d0")
    return src, dst


def fill_random(d, vol: str, size: int, randbytes=None):
    """Writes `size` bytes of random data (`randbytes(n)`, default
    os.urandom) over volume `vol` of daemon `d`, flushed."""
    import os

    randbytes = randbytes or os.urandom
    with connected(d.uri(vol)) as c:
        for off in range(0, size, MiB):
            c.pwrite(randbytes(min(MiB, size - off)), off)
        c.flush()
