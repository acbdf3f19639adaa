"""Per-dataset compression: stored size (`used`) shrinks by about the ratio the
algorithm reaches on the data, and `compressratio` reports it."""

from __future__ import annotations

import hashlib
import os
import random
import time
import zlib

import pytest

from helpers import KiB, MiB, connected, pattern

DATA_BYTES = 64 * MiB
UNIQUE_BYTES = 8 * MiB  # the 64 MiB are 8 copies; per-block ratios are what matter
VOLBLOCK = 16 * KiB
FAST_TXG = "[engine]\ntxg_timeout_secs = 1.0\n"


def text_like(n: int, seed: int = 1) -> bytes:
    """Log-like text: fixed structure, random fields. Compresses ~3-6x."""
    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 10))) for _ in range(400)]
    levels = ["INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR"]
    out = []
    size = 0
    t = 1_700_000_000
    while size < n:
        t += rng.randint(0, 3)
        line = (f"{t} {rng.choice(levels)} req={rng.randrange(1 << 32):08x} user={rng.choice(words)} "
                f"path=/api/v1/{rng.choice(words)}/{rng.randrange(10000)} status={rng.choice((200, 200, 200, 404, 500))} "
                f"ms={rng.randrange(2000)} msg=\"{' '.join(rng.choices(words, k=rng.randint(2, 9)))}\"\n")
        out.append(line)
        size += len(line)
    return "".join(out).encode()[:n]


def expected_ratio(data: bytes, level: int, sector: int) -> float:
    """Per-volblock zlib ratio, each compressed block rounded up to `sector`,
    blocks that do not shrink stored raw."""
    logical = physical = 0
    for i in range(0, len(data), VOLBLOCK):
        blk = data[i:i + VOLBLOCK]
        c = len(zlib.compress(blk, level))
        p = min(-(-c // sector) * sector, len(blk))
        logical += len(blk)
        physical += p
    return logical / physical


def _ratio(v: str) -> float:
    return float(v.rstrip("x"))


def write_and_settle(vol, data_unique: bytes, copies: int, timeout: float = 60, prev_used: int | None = None) -> dict[str, str]:
    with connected(vol.uri) as h:
        for c in range(copies):
            for off in range(0, len(data_unique), 4 * MiB):
                h.pwrite(data_unique[off:off + 4 * MiB], c * len(data_unique) + off)
        h.flush()
    total = len(data_unique) * copies
    # Wait until a txg has carried everything and the accounting is stable.
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        p = vol.props()
        cur = (int(p["used"]), int(p["logicalused"]))
        if cur[1] >= total and cur == last and cur[0] != prev_used:
            return p
        last = cur
        time.sleep(1.0)
    raise AssertionError(f"used/logicalused not stable after {timeout}s (last {last}, want logicalused >= {total})")


def check_consistent(p: dict[str, str]):
    used, logical, ratio = int(p["used"]), int(p["logicalused"]), _ratio(p["compressratio"])
    assert used > 0
    assert abs(ratio - logical / used) <= 0.015, (
        f"compressratio {ratio} but logicalused/used = {logical}/{used} = {logical / used:.3f}")


@pytest.fixture(scope="module")
def text():
    return text_like(UNIQUE_BYTES)


@pytest.fixture
def cvol(make_daemon, disks):
    def make(compression: str, name="c"):
        d = make_daemon(config=FAST_TXG)
        d.cli("pool", "create", "-s", "2G", "tank", disks / "d0")
        d.cli("create", "-V", "128M", "-o", f"compression={compression}", f"tank/{name}")
        from helpers import Volume
        return Volume(d, f"tank/{name}")
    return make


@pytest.mark.parametrize("algo", ["off", "lz4", "zstd", "gzip-9"])
def test_text_compresses_by_expected_ratio(cvol, text, algo):
    vol = cvol(algo)
    assert vol.prop("compression") == algo
    p = write_and_settle(vol, text, DATA_BYTES // UNIQUE_BYTES)
    used, logical, ratio = int(p["used"]), int(p["logicalused"]), _ratio(p["compressratio"])
    assert logical >= DATA_BYTES, p
    check_consistent(p)
    z = {lvl: (expected_ratio(text, lvl, 4096), expected_ratio(text, lvl, 512)) for lvl in (1, 6, 9)}
    msg = f"{algo}: used={used} logicalused={logical} compressratio={ratio}; zlib per-block ratios {z}"
    if algo == "off":
        assert ratio == pytest.approx(1.0, abs=0.01), msg
        assert used >= DATA_BYTES, msg
    else:
        assert ratio >= 2.0, msg
        assert used <= logical / 2, msg
        if algo == "gzip-9":
            lo, hi = z[9][0] * 0.8, z[9][1] * 1.25
        elif algo == "zstd":
            lo, hi = z[6][0] * 0.7, z[9][1] * 1.6
        else:  # lz4: below zlib-9, above half of zlib-1
            lo, hi = z[1][0] * 0.5, z[9][1] * 1.1
        assert lo <= ratio <= hi, f"ratio outside [{lo:.2f}, {hi:.2f}]; " + msg
    # Everything reads back, also from disk after a restart.
    want = hashlib.sha256(text).digest()
    vol.daemon.restart()
    with connected(vol.uri) as h:
        for c in range(DATA_BYTES // UNIQUE_BYTES):
            got = b"".join(h.pread(4 * MiB, c * UNIQUE_BYTES + o) for o in range(0, UNIQUE_BYTES, 4 * MiB))
            assert hashlib.sha256(got).digest() == want, f"copy {c} differs"


def test_random_data_is_stored_raw(cvol):
    vol = cvol("lz4")
    data = os.urandom(16 * MiB)
    p = write_and_settle(vol, data, 2)
    used, logical, ratio = int(p["used"]), int(p["logicalused"]), _ratio(p["compressratio"])
    check_consistent(p)
    assert ratio == pytest.approx(1.0, abs=0.02), p
    assert used <= logical * 1.02, f"incompressible data takes more than 2% extra: {p}"


def test_changing_compression_applies_to_new_writes(cvol, text):
    vol = cvol("off")
    data = text[:16 * MiB] if len(text) >= 16 * MiB else (text * 2)[:16 * MiB]
    p1 = write_and_settle(vol, data, 1)
    assert _ratio(p1["compressratio"]) == pytest.approx(1.0, abs=0.01)
    vol.daemon.cli("set", "compression=zstd-19", vol.name)
    assert vol.prop("compression") == "zstd-19"
    p2 = write_and_settle(vol, data, 1, prev_used=int(p1["used"]))  # rewrite the same blocks
    assert int(p2["logicalused"]) == int(p1["logicalused"])
    assert int(p2["used"]) < int(p1["used"]) / 2, (p1, p2)
    check_consistent(p2)
    with connected(vol.uri) as h:
        assert h.pread(len(data), 0) == data


@pytest.mark.parametrize("algo", ["zstd-1", "zstd-19", "gzip", "gzip-1"])
def test_other_levels_round_trip(cvol, algo):
    vol = cvol(algo)
    data = text_like(2 * MiB, seed=5) + pattern(5, 1 * MiB)
    with connected(vol.uri) as h:
        h.pwrite(data, 3 * MiB + 512)
        h.flush()
    vol.daemon.restart()
    with connected(vol.uri) as h:
        assert h.pread(len(data), 3 * MiB + 512) == data
    assert vol.prop("compression") == algo
