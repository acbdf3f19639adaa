"""The NBD server as real clients (nbdinfo, python3-libnbd) see it: every
feature issue 2 promises is negotiated and behaves as the protocol says."""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess

import nbd
import pytest

from helpers import MiB, KiB, allocation_map, close, flags_at, nbdinfo_json, pattern

HOLE = nbd.STATE_HOLE
ZERO = nbd.STATE_ZERO


def nbd_errno(excinfo) -> int:
    return excinfo.value.errnum


# ------------------------------------------------------------------ negotiation


@pytest.mark.parametrize("vbs", [None, "4K", "64K"])
def test_nbdinfo_shows_every_feature(make_volume, vbs):
    props = {"volblocksize": vbs} if vbs else {}
    vol = make_volume("vol0", "1G", **props)
    info = nbdinfo_json(vol.uri)
    assert info["protocol"] == "newstyle-fixed"
    assert info.get("structured") is True, f"structured replies not negotiated: {info}"
    (ex,) = info["exports"]
    assert ex["export-name"] == "tank/vol0"
    assert ex["export-size"] == 1 << 30
    for cap in ("can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero", "can_multi_conn"):
        assert ex.get(cap) is True, f"{cap} is not advertised: {ex}"
    assert ex.get("is_read_only") is False
    assert "base:allocation" in ex.get("contexts", []), ex
    # NBD_INFO_BLOCK_SIZE: minimum <= preferred <= maximum, powers of two,
    # preferred = volblocksize.
    want_pref = {None: 16 * KiB, "4K": 4 * KiB, "64K": 64 * KiB}[vbs]
    bmin, bpref, bmax = ex.get("block_size_minimum"), ex.get("block_size_preferred"), ex.get("block_size_maximum")
    assert None not in (bmin, bpref, bmax), f"no NBD_INFO_BLOCK_SIZE: {ex}"
    assert bpref == want_pref
    assert 1 <= bmin <= bpref <= bmax
    for v in (bmin, bpref):
        assert v & (v - 1) == 0, f"block size {v} not a power of two"
    assert bmax >= 1 * MiB, "maximum payload below 1 MiB would cripple sequential I/O"


def test_libnbd_negotiation(volume):
    with volume.connected() as h:
        assert h.get_structured_replies_negotiated()
        assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
        assert h.get_size() == 1 << 30
        assert h.get_export_name() == "tank/vol0"
        assert h.can_flush() and h.can_fua() and h.can_trim() and h.can_zero()
        assert h.can_fast_zero() and h.can_multi_conn()
        assert not h.is_read_only()
        assert h.get_block_size(nbd.SIZE_PREFERRED) == 16 * KiB


def test_nbdinfo_list_shows_all_volumes(make_volume, daemon):
    make_volume("vol0", "64M")
    make_volume("vol1", "128M", compression="lz4")
    info = nbdinfo_json(daemon.uri(), "--list")
    names = {e["export-name"]: e for e in info["exports"]}
    assert set(names) >= {"tank/vol0", "tank/vol1"}, names.keys()
    assert names["tank/vol0"]["export-size"] == 64 * MiB
    assert names["tank/vol1"]["export-size"] == 128 * MiB
    # A volume created while the daemon runs is exported at once...
    daemon.cli("create", "-V", "32M", "tank/late")
    info = nbdinfo_json(daemon.uri(), "--list")
    assert "tank/late" in {e["export-name"] for e in info["exports"]}
    # ... and a destroyed one disappears.
    daemon.cli("destroy", "tank/late")
    info = nbdinfo_json(daemon.uri(), "--list")
    assert "tank/late" not in {e["export-name"] for e in info["exports"]}


def test_unknown_export_is_refused(volume, daemon):
    with pytest.raises(nbd.Error):
        h = nbd.NBD()
        h.connect_uri(daemon.uri("tank/nope"))
    p = subprocess.run(["nbdinfo", daemon.uri("tank/nope")], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    # The server is still fine.
    with volume.connected() as h:
        assert h.get_size() == 1 << 30


# ------------------------------------------------------------------ I/O


def test_pwrite_pread_roundtrip_and_flush(volume):
    data = pattern(1, 3 * MiB + 1234)
    with volume.connected() as h:
        h.pwrite(data, 5 * MiB + 77)  # unaligned start and length
        assert h.pread(len(data), 5 * MiB + 77) == data
        h.flush()
        h.pwrite(data[:4096], 0, nbd.CMD_FLAG_FUA)
    # A second connection sees the same bytes.
    with volume.connected() as h:
        assert h.pread(len(data), 5 * MiB + 77) == data
        assert h.pread(4096, 0) == data[:4096]
        assert h.pread(77, 5 * MiB) == bytes(77)


def test_small_unaligned_writes_within_one_block(volume):
    """Read-modify-write of a 16K volblock from many tiny writes."""
    with volume.connected() as h:
        expect = bytearray(64 * KiB)
        for i, (off, ln) in enumerate([(1, 1), (511, 2), (4095, 3), (16383, 2), (20000, 9000), (100, 40000)]):
            buf = pattern(i, ln)
            h.pwrite(buf, off)
            expect[off:off + ln] = buf
        assert h.pread(len(expect), 0) == bytes(expect)


def test_trim_then_reads_zeros_and_is_a_hole(volume):
    with volume.connected() as h:
        h.pwrite(pattern(2, 4 * MiB), 8 * MiB)
        h.flush()
        h.trim(1 * MiB, 9 * MiB)  # aligned to 16K blocks
        assert h.pread(1 * MiB, 9 * MiB) == bytes(1 * MiB)
        assert h.pread(1 * MiB, 8 * MiB) == pattern(2, 4 * MiB)[:1 * MiB]
        amap = allocation_map(h, 8 * MiB, 4 * MiB)
        assert flags_at(amap, 9 * MiB) & HOLE, f"trimmed range is not a hole: {amap}"
        assert flags_at(amap, 9 * MiB) & ZERO
        # An unaligned trim still reads as zeros where it applied.
        h.trim(1000, 11 * MiB - 500)
        assert h.pread(1000, 11 * MiB - 500) == bytes(1000)
        assert h.pread(500, 11 * MiB - 1000) == pattern(2, 4 * MiB)[3 * MiB - 1000:3 * MiB - 500]


def test_write_zeroes_no_hole_and_fast_zero(volume):
    data = pattern(3, 4 * MiB)
    with volume.connected() as h:
        h.pwrite(data, 0)
        # Plain WRITE_ZEROES: zeros, may be a hole.
        h.zero(1 * MiB, 0)
        assert h.pread(1 * MiB, 0) == bytes(1 * MiB)
        # NO_HOLE: zeros and stays allocated (base:allocation must not say HOLE).
        h.zero(1 * MiB, 1 * MiB, nbd.CMD_FLAG_NO_HOLE)
        assert h.pread(1 * MiB, 1 * MiB) == bytes(1 * MiB)
        amap = allocation_map(h, 0, 4 * MiB)
        assert not flags_at(amap, 1 * MiB + 4096) & HOLE, f"NO_HOLE zeroing left a hole: {amap}"
        # FAST_ZERO: a copy-on-write store can always zero fast.
        h.zero(1 * MiB, 2 * MiB, nbd.CMD_FLAG_FAST_ZERO)
        assert h.pread(1 * MiB, 2 * MiB) == bytes(1 * MiB)
        # NO_HOLE|FAST_ZERO: either done, or refused with ENOTSUP and nothing changed.
        try:
            h.zero(512 * KiB, 3 * MiB, nbd.CMD_FLAG_NO_HOLE | nbd.CMD_FLAG_FAST_ZERO)
            assert h.pread(512 * KiB, 3 * MiB) == bytes(512 * KiB)
        except nbd.Error as e:
            assert e.errnum == errno.ENOTSUP, f"FAST_ZERO failure must be ENOTSUP, got {e}"
            assert h.pread(512 * KiB, 3 * MiB) == data[3 * MiB:3 * MiB + 512 * KiB]
        # Untouched tail.
        assert h.pread(512 * KiB, 3 * MiB + 512 * KiB) == data[3 * MiB + 512 * KiB:]
        # Unaligned zero inside a block keeps its neighbours.
        h.pwrite(data[:64 * KiB], 10 * MiB)
        h.zero(100, 10 * MiB + 5000)
        got = h.pread(64 * KiB, 10 * MiB)
        assert got == data[:5000] + bytes(100) + data[5100:64 * KiB]


@pytest.mark.parametrize("op", ["trim", "zero", "zero_no_hole"])
def test_zero_and_trim_ranges_on_committed_data(volume, op):
    """Every shape of range (partial head/tail, whole 16K blocks, both) over
    data already committed in a txg, then again after a restart."""
    K = KiB
    shapes = [(16 * K, 16 * K), (12 * K, 20 * K), (16 * K, 20 * K), (12 * K, 24 * K), (4 * K, 8 * K),
              (12 * K, 8 * K), (1, 40 * K), (0, 64 * K), (15 * K, 2 * K), (8 * K, 48 * K)]
    data = pattern(8, 64 * K)
    with volume.connected() as h:
        for i in range(len(shapes)):
            h.pwrite(data, i * MiB)
    volume.daemon.restart()  # the data is now committed, not dirty
    want = {}
    with volume.connected() as h:
        for i, (off, ln) in enumerate(shapes):
            if op == "trim":
                h.trim(ln, i * MiB + off)
            else:
                h.zero(ln, i * MiB + off, nbd.CMD_FLAG_NO_HOLE if op == "zero_no_hole" else 0)
            want[i] = data[:off] + bytes(ln) + data[off + ln:]
        bad = [shapes[i] for i in want if h.pread(64 * K, i * MiB) != want[i]]
        assert not bad, f"{op} over committed data left old bytes for (offset, length) {bad}"
    volume.daemon.restart()
    with volume.connected() as h:
        bad = [shapes[i] for i in want if h.pread(64 * K, i * MiB) != want[i]]
        assert not bad, f"{op} not persistent for (offset, length) {bad}"


def test_block_status_holes_and_data(volume):
    with volume.connected() as h:
        amap = allocation_map(h, 0, 1 << 30)
        assert all(f & HOLE and f & ZERO for _, _, f in amap), f"fresh volume not all hole: {amap[:5]}"
        h.pwrite(pattern(4, 64 * KiB), 1 * MiB)
        h.pwrite(pattern(5, 16 * KiB), 512 * MiB)
        amap = allocation_map(h, 0, 1 << 30)
        assert flags_at(amap, 0) & HOLE
        assert flags_at(amap, 1 * MiB - 1) & HOLE
        assert flags_at(amap, 1 * MiB) == 0, amap
        assert flags_at(amap, 1 * MiB + 64 * KiB - 1) == 0
        assert flags_at(amap, 1 * MiB + 64 * KiB) & HOLE
        assert flags_at(amap, 512 * MiB) == 0
        assert flags_at(amap, 512 * MiB + 16 * KiB) & HOLE
        assert flags_at(amap, (1 << 30) - 1) & HOLE
        # The data extents total exactly what was written (16K-aligned writes).
        data_bytes = sum(ln for _, ln, f in amap if not f & HOLE)
        assert data_bytes == 80 * KiB, amap
        # The same after the txg has been committed and the daemon restarted.
    volume.daemon.restart()
    with volume.connected() as h:
        amap2 = allocation_map(h, 0, 1 << 30)
        assert [(o, l, f & HOLE) for o, l, f in amap2] == [(o, l, f & HOLE) for o, l, f in amap]


def test_block_status_req_one_and_out_of_range(volume):
    with volume.connected(strict=False) as h:
        got = []

        def cb(ctx, off, entries, err):
            got.append(list(entries))
            return 0

        h.block_status(64 * MiB, 0, cb, nbd.CMD_FLAG_REQ_ONE)
        assert got and len(got[0]) == 2, f"REQ_ONE must give one extent: {got}"
        with pytest.raises(nbd.Error) as e:
            h.block_status(2 * MiB, (1 << 30) - MiB, cb)
        assert e.value.errnum == errno.EINVAL


def test_structured_read_reports_holes(volume):
    with volume.connected() as h:
        h.pwrite(pattern(6, 32 * KiB), 256 * KiB)
        chunks = []

        def chunk(subbuf, offset, status, err):
            chunks.append((offset, len(subbuf), status))
            return 0

        buf = h.pread_structured(1 * MiB, 0, chunk)
        assert buf == bytes(256 * KiB) + pattern(6, 32 * KiB) + bytes(1 * MiB - 288 * KiB)
        statuses = {s for _, _, s in chunks}
        assert nbd.READ_HOLE in statuses, f"no hole chunk in reply: {chunks}"
        assert nbd.READ_DATA in statuses
        # Chunks cover the request exactly, without overlap.
        cover = sorted((o, n) for o, n, _ in chunks)
        pos = 0
        for o, n in cover:
            assert o == pos, f"gap/overlap at {pos}: {cover}"
            pos += n
        assert pos == 1 * MiB
        # The written range arrives as data.
        for o, n, s in chunks:
            if o < 288 * KiB and o + n > 256 * KiB:
                assert s == nbd.READ_DATA, chunks


def test_out_of_range_requests_get_errors(volume):
    size = 1 << 30
    with volume.connected(strict=False) as h:
        with pytest.raises(nbd.Error) as e:
            h.pread(4096, size - 2048)
        assert e.value.errnum == errno.EINVAL, e.value
        with pytest.raises(nbd.Error) as e:
            h.pread(512, size)
        assert e.value.errnum == errno.EINVAL
        # NBD spec: writes past the end SHOULD be ENOSPC; EINVAL is also accepted.
        with pytest.raises(nbd.Error) as e:
            h.pwrite(b"x" * 4096, size - 2048)
        assert e.value.errnum in (errno.EINVAL, errno.ENOSPC), e.value
        with pytest.raises(nbd.Error) as e:
            h.trim(8192, size - 4096)
        assert e.value.errnum == errno.EINVAL
        with pytest.raises(nbd.Error) as e:
            h.zero(8192, size - 4096)
        assert e.value.errnum in (errno.EINVAL, errno.ENOSPC)
        # No partial write happened, and the connection still works.
        assert h.pread(2048, size - 2048) == bytes(2048)
        h.pwrite(b"y" * 2048, size - 2048)
        assert h.pread(2048, size - 2048) == b"y" * 2048


def test_many_requests_in_flight(volume):
    """64 outstanding aio writes, then 64 outstanding aio reads, one connection."""
    n, bs = 64, 64 * KiB
    with volume.connected() as h:
        bufs = [nbd.Buffer.from_bytearray(bytearray(pattern(100 + i, bs))) for i in range(n)]
        # Out of order, and 68K apart so that neighbours share 16K volblocks
        # (concurrent read-modify-write of the same block).
        offsets = [(i * 37 % n) * (bs + 4096) for i in range(n)]
        cookies = [h.aio_pwrite(bufs[i], offsets[i]) for i in range(n)]
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for c in cookies:
            assert h.aio_command_completed(c)  # raises if the server failed it
        h.flush()
        rbufs = [nbd.Buffer(bs) for _ in range(n)]
        rcookies = [h.aio_pread(rbufs[i], offsets[i]) for i in range(n)]
        while h.aio_in_flight() > 0:
            h.poll(-1)
        for c in rcookies:
            assert h.aio_command_completed(c)
        for i in range(n):
            assert bytes(rbufs[i].to_bytearray()) == pattern(100 + i, bs), f"request {i} at {offsets[i]}"


def test_multi_conn_flush_covers_other_connections(volume):
    """Writes completed on one connection are visible on the others at once,
    and a flush on any connection covers them (checked by reading back after
    SIGKILL of the daemon)."""
    d = volume.daemon
    hs = [volume.connect() for _ in range(4)]
    try:
        for i, h in enumerate(hs):
            h.pwrite(pattern(200 + i, 256 * KiB), i * MiB)
        for i in range(4):
            assert hs[(i + 1) % 4].pread(256 * KiB, i * MiB) == pattern(200 + i, 256 * KiB)
        hs[3].flush()  # covers the writes of connections 0..2 too
    finally:
        for h in hs:
            close(h)
    d.kill9()
    d.start()
    with volume.connected() as h:
        for i in range(4):
            assert h.pread(256 * KiB, i * MiB) == pattern(200 + i, 256 * KiB), f"connection {i}'s write lost"


def test_read_only_volume_refuses_writes(make_volume, daemon):
    vol = make_volume("ro", "64M")
    with vol.connected() as h:
        h.pwrite(pattern(7, 64 * KiB), 0)
        h.flush()
    p = daemon.cli("set", "readonly=on", vol.name, check=False)
    if p.returncode != 0:
        pytest.skip(f"engine has no `readonly` property yet: {p.stderr.strip() or p.stdout.strip()}")
    info = nbdinfo_json(vol.uri)
    assert info["exports"][0]["is_read_only"] is True
    with vol.connected(strict=False) as h:
        assert h.is_read_only()
        assert h.pread(64 * KiB, 0) == pattern(7, 64 * KiB)
        for op in (lambda: h.pwrite(b"z" * 4096, 0),
                   lambda: h.trim(4096, 0),
                   lambda: h.zero(4096, 0)):
            with pytest.raises(nbd.Error) as e:
                op()
            assert e.value.errnum == errno.EPERM, e.value
        assert h.pread(64 * KiB, 0) == pattern(7, 64 * KiB)
        h.flush()  # allowed on a read-only export
    daemon.cli("set", "readonly=off", vol.name)
    with vol.connected() as h:
        assert not h.is_read_only()
        h.pwrite(b"z" * 4096, 0)
    # Read-only from creation on.
    ro = make_volume("ro2", "16M", readonly="on")
    with ro.connected(strict=False) as h:
        assert h.is_read_only()
        assert h.pread(4096, 0) == bytes(4096)
        with pytest.raises(nbd.Error) as e:
            h.pwrite(b"z" * 4096, 0)
        assert e.value.errnum == errno.EPERM


# ------------------------------------------------------------------ hostile input


def _recv_exact(s: socket.socket, n: int) -> bytes:
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            break
        b += c
    return b


def test_garbage_from_the_network_does_not_hurt(volume, daemon):
    """Bad magic, an absurd option length, a bad request in transmission:
    the server drops or refuses the connection and keeps serving others."""
    port = daemon.nbd_port
    # 1. Garbage right after the greeting.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        hello = _recv_exact(s, 18)
        assert hello[:8] == b"NBDMAGIC" and hello[8:16] == b"IHAVEOPT", hello
        s.sendall(os.urandom(4096))
        s.settimeout(10)
        try:
            while s.recv(65536):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
    # 2. A valid client flag word, then an option claiming 4 GiB of data.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _recv_exact(s, 18)
        s.sendall(struct.pack(">I", 1))  # NBD_FLAG_C_FIXED_NEWSTYLE
        s.sendall(b"IHAVEOPT" + struct.pack(">II", 7, 0xFFFFFFFF) + b"tank/vol0")
        s.settimeout(10)
        try:
            while s.recv(65536):
                pass
        except (ConnectionResetError, socket.timeout):
            pass
    # 3. An export name that is not UTF-8 and far too long: an error reply
    #    (the connection may stay open for further options).
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        _recv_exact(s, 18)
        s.sendall(struct.pack(">I", 1))
        name = b"\xff" * 5000
        s.sendall(b"IHAVEOPT" + struct.pack(">II", 7, 4 + len(name) + 2) + struct.pack(">I", len(name)) + name + b"\0\0")
        rep = _recv_exact(s, 20)
        assert len(rep) == 20, f"no reply to a bad NBD_OPT_GO: {rep!r}"
        magic, opt, rtype, rlen = struct.unpack(">QIII", rep)
        assert magic == 0x3E889045565A9 and opt == 7, rep
        assert rtype & 0x80000000, f"bad export name not answered with an error (reply type {rtype:#x})"
    # 4. Transmission phase: unknown command type, then a read with bad magic.
    with volume.connected(strict=False) as h:
        h.pwrite(b"a" * 4096, 0)
        with pytest.raises(nbd.Error) as e:
            h.pwrite(b"b" * 4096, 0, 1 << 10)  # undefined command flag
        assert e.value.errnum == errno.EINVAL, e.value
        assert h.pread(4096, 0) == b"a" * 4096
    # Daemon alive, serving, no panic in its log.
    assert daemon.alive()
    with volume.connected() as h:
        assert h.pread(4096, 0) == b"a" * 4096
    assert not daemon.panics()
    rss_kib = int(next(l for l in open(f"/proc/{daemon.pid}/status") if l.startswith("VmRSS:")).split()[1])
    assert rss_kib < 1 << 20, f"daemon RSS {rss_kib} KiB after hostile input (allocated what a client claimed?)"
