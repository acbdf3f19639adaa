"""Space as ZFS promises it (decision 0011): volumes reserve their size unless
sparse, quotas and refquotas hold, ENOSPC reaches the NBD writer cleanly and is
logged once, and a full pool can always be freed (TRIM, zeroing, rollback,
destroy) without losing anything that was acknowledged."""

from __future__ import annotations

import errno
import os
import re
import subprocess

import nbd
import pytest

from conftest import run
from helpers import MiB, connected, pattern, wait_until
from test_filesystem import _why_no_fs, loop_mount, nbdfuse

POOL_SIZE = "256M"


@pytest.fixture
def small_pool(daemon, disks) -> str:
    daemon.cli("pool", "create", "-s", POOL_SIZE, "tank", disks / "d0")
    return "tank"


def _bytes(d, ds, prop) -> int:
    return int(d.cli("get", "-Hp", "-o", "value", prop, ds).stdout.strip())


def _fails(p, *patterns):
    msg = p.stdout + p.stderr
    assert p.returncode != 0, f"expected failure: {msg}"
    for pat in patterns:
        assert re.search(pat, msg), f"error lacks /{pat}/: {msg!r}"


def _fill(h, start: int, end: int, seed: int) -> int:
    """Writes 1 MiB chunks until the server says ENOSPC; returns where it stopped."""
    at = start
    while at < end:
        try:
            h.pwrite(pattern(f"{seed}-{at}", MiB), at)
        except nbd.Error as e:
            assert e.errnum == errno.ENOSPC, f"write at {at}: {e}"
            return at
        at += MiB
    return at


def _log_count(d, needle: str) -> int:
    return d.log_path.read_text(errors="replace").count(needle)


def test_thin_and_reserved_volumes(daemon, small_pool):
    d = daemon
    avail = _bytes(d, "tank", "available")
    assert 200 * MiB < avail < 256 * MiB, avail
    _fails(d.cli("create", "-V", "100T", "tank/big", check=False), r"cannot create 'tank/big': out of space")
    assert "tank/big" not in d.cli("list", "-H", "-o", "name").stdout
    d.cli("create", "-s", "-V", "100T", "tank/big")
    assert d.cli("get", "-H", "-o", "value,source", "refreservation", "tank/big").stdout.split() == ["none", "default"]
    d.cli("create", "-V", "64M", "tank/thick")
    assert _bytes(d, "tank/thick", "refreservation") == 64 * MiB
    assert _bytes(d, "tank/thick", "usedbyrefreservation") == 64 * MiB
    assert _bytes(d, "tank/big", "available") == avail - 64 * MiB
    assert _bytes(d, "tank", "used") == 64 * MiB
    _fails(d.cli("set", "volsize=1T", "tank/thick", check=False), r"size is greater than available space")
    assert _bytes(d, "tank/thick", "volsize") == 64 * MiB
    _fails(d.cli("set", "reservation=1T", "tank/big", check=False), r"size is greater than available space")
    d.cli("set", "volsize=100M", "tank/thick")
    assert _bytes(d, "tank/thick", "refreservation") == 100 * MiB
    assert _bytes(d, "tank/big", "available") == avail - 100 * MiB
    # The thin volume cannot take what the thick one was promised.
    with connected(d.uri("tank/big")) as h:
        reached = _fill(h, 0, 1 << 30, 1)
    assert avail - 100 * MiB - 2 * MiB <= reached <= avail - 100 * MiB, (reached, avail)
    with connected(d.uri("tank/thick")) as h:
        for rnd in range(2):  # all of it, twice: overwrites are covered too
            for off in range(0, 100 * MiB, 4 * MiB):
                h.pwrite(pattern(f"t{rnd}-{off}", 4 * MiB), off)
        h.flush()
        assert h.pread(4 * MiB, 96 * MiB) == pattern(f"t1-{96 * MiB}", 4 * MiB)


def test_quota_and_refquota_give_enospc_to_the_nbd_writer(daemon, small_pool):
    d = daemon
    d.cli("create", "-s", "-V", "1G", "-o", "compression=off", "tank/q")
    d.cli("set", "refquota=8M", "tank/q")
    assert d.cli("get", "-H", "-o", "value,source", "refquota", "tank/q").stdout.split() == ["8M", "local"]
    with connected(d.uri("tank/q")) as h:
        assert _fill(h, 0, 1 << 30, 2) == 8 * MiB
        for _ in range(20):  # a guest retries: each fails, the log says it once
            with pytest.raises(nbd.Error) as e:
                h.pwrite(b"x" * 65536, 16 * MiB)
            assert e.value.errnum == errno.ENOSPC
        h.flush()  # what was accepted is durable; FLUSH itself does not fail
        assert _log_count(d, "disk quota exceeded") == 1
        # quota counts snapshots as well.
        d.cli("snapshot", "tank/q@a")
        d.cli("set", "refquota=none", "tank/q")
        d.cli("set", "quota=12M", "tank/q")
        h.trim(4 * MiB, 0)
        assert _fill(h, 0, 1 << 30, 3) == 4 * MiB, "8M referenced + 4M held by @a: 4M left"
        d.cli("destroy", "tank/q@a")
        h.flush()
        assert _fill(h, 8 * MiB, 1 << 30, 4) == 12 * MiB
        assert h.pread(MiB, 0) == pattern("3-0", MiB)
        assert h.pread(MiB, 4 * MiB) == pattern(f"2-{4 * MiB}", MiB)
    _fails(d.cli("set", "quota=1M", "tank/q", check=False), r"less than current used")


def test_full_pool_can_always_be_freed_and_nothing_acknowledged_is_lost(daemon, small_pool):
    d = daemon
    d.cli("create", "-s", "-V", "1G", "-o", "compression=off", "-o", "volblocksize=16K", "tank/v")
    d.cli("create", "-s", "-V", "64M", "tank/other")
    with connected(d.uri("tank/other")) as h:
        h.pwrite(pattern("other", 4 * MiB), 0)
        h.flush()
    with connected(d.uri("tank/v")) as h:
        reached = _fill(h, 0, 1 << 30, 5)
        h.flush()
        assert reached > 150 * MiB, reached
        d.cli("snapshot", "tank/v@full")
        assert _log_count(d, "writes fail with ENOSPC") == 1
        # TRIM and WRITE_ZEROES (deallocating, allocating, partial blocks) all succeed.
        h.trim(8 * MiB, 0)
        h.zero(8 * MiB, 8 * MiB)
        h.zero(4096, 16 * MiB + 512, nbd.CMD_FLAG_NO_HOLE)
        h.zero(64 * MiB, 32 * MiB, nbd.CMD_FLAG_FUA)
        h.flush()
        # The snapshot still holds everything: writes still fail ...
        with pytest.raises(nbd.Error) as e:
            h.pwrite(b"y" * MiB, 0)
        assert e.value.errnum == errno.ENOSPC
    # ... rollback and snapshot destroy succeed on the full pool, then TRIM frees.
    d.cli("rollback", "tank/v@full")
    d.cli("destroy", "tank/v@full")
    with connected(d.uri("tank/v")) as h:
        h.trim(32 * MiB, 0)
        h.flush()
        h.pwrite(pattern("again", MiB), 0)
        h.flush()
    # Everything acknowledged survives kill -9.
    d.kill9()
    d.start()
    with connected(d.uri("tank/v")) as h:
        assert h.pread(MiB, 0) == pattern("again", MiB)
        assert h.pread(MiB, 32 * MiB) == pattern(f"5-{32 * MiB}", MiB)
        last = reached - MiB
        assert h.pread(MiB, last) == pattern(f"5-{last}", MiB)
        assert h.pread(MiB, reached) == bytes(MiB)
    with connected(d.uri("tank/other")) as h:
        assert h.pread(4 * MiB, 0) == pattern("other", 4 * MiB)
    # Filling again and destroying the volume on a full pool.
    with connected(d.uri("tank/other")) as h:
        _fill(h, 4 * MiB, 64 * MiB, 6)
    with connected(d.uri("tank/v")) as h:
        _fill(h, 0, 1 << 30, 7)
    d.cli("destroy", "tank/v")
    assert _bytes(d, "tank", "available") > 150 * MiB


@pytest.mark.skipif(_why_no_fs() is not None, reason=_why_no_fs() or "")
def test_ext4_guest_fills_the_pool_then_rm_and_fstrim_free_it(daemon, small_pool, tmp_path):
    d = daemon
    d.cli("create", "-s", "-V", "1G", "-o", "compression=off", "tank/fs")
    fuse_log = tmp_path / "nbdfuse.log"
    with nbdfuse(d.uri("tank/fs"), tmp_path / "mnt", fuse_log) as image:
        run(["mkfs.ext4", "-q", "-F", image], timeout=300)
        with loop_mount(image, tmp_path / "fs") as fs:
            kept, failed_at = [], None
            for i in range(400):  # 256M pool: fills well before 400 MiB
                path = fs / f"f{i:03d}"
                try:
                    with open(path, "wb") as f:
                        f.write(pattern(f"f{i}", MiB))
                        f.flush()
                        os.fsync(f.fileno())
                except OSError as e:
                    failed_at = (i, e)
                    break
                kept.append(i)
            assert failed_at is not None, "the pool never filled"
            assert len(kept) > 100, (len(kept), failed_at)
            # The guest may have remounted read-only after the error: check it over.
        subprocess.run(["e2fsck", "-f", "-y", str(image)], capture_output=True, timeout=300)
        used_before = _bytes(d, "tank/fs", "usedbydataset")
        with loop_mount(image, tmp_path / "fs") as fs:
            for i in kept[: len(kept) // 2]:
                (fs / f"f{i:03d}").unlink()
            # This kernel's loop driver does not pass fstrim's discards on to a
            # FUSE file; e2fsck below discards the free blocks through nbdfuse
            # (fallocate PUNCH_HOLE -> NBD_CMD_TRIM) instead.
            run(["fstrim", fs], timeout=120)
        trims = _trims(d)
        run(["e2fsck", "-f", "-y", "-E", "discard", image], timeout=300)
        assert _trims(d) > trims, "e2fsck -E discard sent no TRIM"
        wait_until(lambda: _bytes(d, "tank/fs", "usedbydataset") < used_before - 32 * MiB, 30,
                   what="space freed by TRIM")
        with loop_mount(image, tmp_path / "fs") as fs:
            # Writes resume, and what was acknowledged before the pool filled is intact.
            for i in range(20):
                with open(fs / f"new{i}", "wb") as f:
                    f.write(pattern(f"new{i}", MiB))
                    f.flush()
                    os.fsync(f.fileno())
            for i in kept[len(kept) // 2: -1][-10:]:
                assert (fs / f"f{i:03d}").read_bytes() == pattern(f"f{i}", MiB), i
            assert (fs / "new19").read_bytes() == pattern("new19", MiB)


def _trims(d) -> int:
    text = d.metrics()
    m = re.search(r'^cistern_nbd_requests_total\{command="trim"\} (\d+)', text, re.M)
    assert m, "no trim counter in /metrics"
    return int(m.group(1))
