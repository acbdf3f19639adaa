"""Fault injection: damaged, truncated and deleted devices under mirror and
raidz pools, scrub, resilver, offline/online, and kill -9 during a scrub or a
resilver. Every byte read back over NBD must be right or fail with EIO, never
be wrong; the counters must say what happened; a scrub must repair what the
layout can repair, list what it cannot by dataset and offset, and a second
scrub must find nothing.

Pools are small (96 MiB files, 16 MiB volumes) so the file runs in well under
three minutes on two cores."""

from __future__ import annotations

import errno
import json
import random
import struct
import threading
import time
from pathlib import Path

import nbd
import pytest

from helpers import KiB, MiB, connected, pattern, wait_until

DEV_SIZE = "96M"
VOL = 16 * MiB
BS = 16 * KiB
# Small txg interval so written data reaches the data region soon; no block
# cache so every read goes to the devices.
CONFIG = "[engine]\ntxg_timeout_secs = 0.2\nblock_cache_bytes = 0\n"
SLOW = CONFIG + "scan_rate_bytes = 2097152\n"
MEDIUM = CONFIG + "scan_rate_bytes = 8388608\n"

LAYOUTS = {
    # kind: (devices, parity = devices that may be damaged)
    "mirror": (2, 1),
    "raidz1": (3, 1),
    "raidz2": (4, 2),
    "raidz3": (5, 3),
}


# ------------------------------------------------------------------ helpers


def read_label(path: Path) -> dict:
    """The JSON label of a device (first end that parses)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        for at in (0, size - 256 * KiB):
            if at < 0:
                continue
            f.seek(at)
            head = f.read(48)
            if head[:8] != b"CISTLABL":
                continue
            (ln,) = struct.unpack("<I", head[12:16])
            try:
                return json.loads(f.read(ln))
            except ValueError:
                continue
    raise AssertionError(f"{path}: no readable label")


def make_pool(d, disks: Path, kind: str, pool: str = "tank") -> list[Path]:
    n, _ = LAYOUTS[kind]
    devs = [disks / f"d{i}" for i in range(n)]
    d.cli("pool", "create", "-s", DEV_SIZE, pool, kind, *devs)
    d.cli("create", "-V", str(VOL), "-o", f"volblocksize={BS // KiB}K", "-o", "compression=off", f"{pool}/vol0")
    return devs


def write_volume(d, name: str = "tank/vol0", seed: int = 1) -> bytes:
    data = pattern(seed, VOL)
    with connected(d.uri(name)) as h:
        for off in range(0, VOL, MiB):
            h.pwrite(data[off:off + MiB], off)
        h.flush()
    return data


def metric(d, name: str, pool: str = "tank") -> float:
    body = d.metrics()
    for line in body.splitlines():
        if line.startswith(name) and f'pool="{pool}"' in line:
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"metric {name} for {pool} not found")


def wait_committed(d, pool: str = "tank"):
    """Until the open txg is empty and a commit finished after that."""
    wait_until(lambda: metric(d, "cistern_pool_dirty_bytes", pool) == 0, 30, what="dirty data committed")
    c = metric(d, "cistern_pool_txg_commits_total", pool)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and metric(d, "cistern_pool_txg_commits_total", pool) == c:
        time.sleep(0.1)
    time.sleep(0.3)


def status(d, pool: str = "tank") -> dict:
    return d.cli_json("pool", "status", pool)["pools"][pool]


def devices(st: dict) -> dict[str, dict]:
    return {Path(dev["path"]).name: dev for g in st["groups"] for dev in g["devices"]}


def scrub(d, pool: str = "tank") -> dict:
    d.cli("pool", "scrub", "-w", pool, check=False, timeout=180)
    st = status(d, pool)
    scan = st["scan"]
    assert scan["function"] == "scrub" and scan["state"] == "finished", scan
    return st


def wait_resilvered(d, pool: str = "tank", timeout: float = 120) -> dict:
    def done():
        st = status(d, pool)
        s = st.get("scan")
        return st if s and s["function"] == "resilver" and s["state"] == "finished" else None

    return wait_until(done, timeout, interval=0.3, what="resilver finished")


def read_all(d, name: str = "tank/vol0") -> bytes:
    out = bytearray()
    with connected(d.uri(name)) as h:
        for off in range(0, VOL, MiB):
            out += h.pread(MiB, off)
    return bytes(out)


def assert_same(got: bytes, want: bytes, what: str):
    assert len(got) == len(want), f"{what}: {len(got)} bytes, expected {len(want)}"
    if got != want:
        i = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
        raise AssertionError(f"{what}: first wrong byte at offset {i} (block {i // BS})")


def corrupt(path: Path, start: int, span: int, hits: int, rnd: random.Random, size: int = 64):
    """`hits` random `size`-byte overwrites inside [start, start + span)."""
    with open(path, "r+b") as f:
        for _ in range(hits):
            at = start + rnd.randrange(max(1, span - size))
            f.seek(at)
            f.write(rnd.randbytes(size))
        f.flush()


def data_span(d, kind: str) -> int:
    """Bytes of each device's data region holding the volume (fresh pool, written once)."""
    n, parity = LAYOUTS[kind]
    alloc = int(d.cli("pool", "list", "-Hp", "-o", "alloc", "tank").stdout.split()[0])
    # ALLOC is raw, as zpool's: raidz parity included, a mirror counted once.
    return alloc if kind == "mirror" else alloc // n + 64 * KiB


def damage(devs: list[Path], kind: str, span: int, meta: bool, seed: int) -> list[Path]:
    """Overwrites random bytes of as many devices as the layout can lose."""
    _, parity = LAYOUTS[kind]
    rnd = random.Random(seed)
    hit = rnd.sample(devs, parity)
    for dev in hit:
        regions = read_label(dev)["regions"]
        corrupt(dev, regions["data_offset"], span, 150, rnd)
        if meta:
            # Database pages after the two header slots (the used part is small).
            corrupt(dev, regions["meta_offset"] + 8 * KiB, 512 * KiB, 40, rnd)
    return hit


def cksum(st: dict) -> dict[str, int]:
    return {n: dev["checksum_errors"] + dev["read_errors"] for n, dev in devices(st).items()}


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize(
    "kind,running,meta",
    [
        ("mirror", True, False),
        ("raidz1", False, True),
        ("raidz2", True, True),
        ("raidz3", False, False),
    ],
)
def test_bit_rot_is_healed_and_scrub_repairs_everything(make_daemon, disks, kind, running, meta):
    d = make_daemon(config=CONFIG)
    devs = make_pool(d, disks, kind)
    data = write_volume(d)
    wait_committed(d)
    span = data_span(d, kind)
    if not running:
        d.stop()
    hit = damage(devs, kind, span, meta, seed=len(kind) + meta)
    if not running:
        d.start()
    assert_same(read_all(d), data, f"{kind}: volume read after damage")
    st = scrub(d)
    scan = st["scan"]
    assert scan["errors"] == 0, scan
    assert st["data_errors"] == [], st["data_errors"]
    counts = cksum(st)
    healed_by_reads = sum(counts.values()) > 0 and scan["repaired"] == 0
    assert scan["repaired"] > 0 or healed_by_reads, (scan, counts)
    for dev in devs:
        if dev in hit:
            assert counts[dev.name] > 0, f"damaged {dev.name} shows no errors: {counts}"
        else:
            assert counts[dev.name] == 0, f"undamaged {dev.name} shows errors: {counts}"
    assert st["summary"]["health"] == "ONLINE", st["summary"]
    # The same counters in the Prometheus text.
    body = d.metrics()
    for dev in hit:
        line = next(l for l in body.splitlines() if l.startswith("cistern_device_errors_total")
                    and f'device="{dev}"' in l and 'kind="checksum"' in l)
        read_line = next(l for l in body.splitlines() if l.startswith("cistern_device_errors_total")
                         and f'device="{dev}"' in l and 'kind="read"' in l)
        assert float(line.rsplit(" ", 1)[1]) + float(read_line.rsplit(" ", 1)[1]) == counts[dev.name], (line, counts)
    assert 'cistern_scan_examined_bytes{pool="tank",function="scrub"}' in body
    text = d.cli("pool", "status", "tank").stdout
    assert "scan: scrub repaired" in text and "with 0 errors" in text, text
    # Nothing left: a second scrub repairs nothing and counts nothing new.
    d.cli("pool", "clear", "tank")
    st = scrub(d)
    assert st["scan"]["repaired"] == 0 and st["scan"]["errors"] == 0, st["scan"]
    assert sum(cksum(st).values()) == 0, cksum(st)
    assert_same(read_all(d), data, f"{kind}: volume read after scrub")


def test_more_damage_than_parity_is_eio_and_listed_never_wrong(make_daemon, disks):
    d = make_daemon(config=CONFIG)
    devs = make_pool(d, disks, "raidz1")
    data = write_volume(d)
    wait_committed(d)
    d.stop()
    # The same 256 KiB of two of the three devices: those rows are lost.
    for dev in devs[:2]:
        start = read_label(dev)["regions"]["data_offset"] + 1 * MiB
        with open(dev, "r+b") as f:
            f.seek(start)
            f.write(random.Random(dev.name).randbytes(256 * KiB))
    d.start()
    lost = set()
    with connected(d.uri("tank/vol0")) as h:
        for off in range(0, VOL, BS):
            try:
                got = h.pread(BS, off)
            except nbd.Error as e:
                # libnbd gives the errno as a number or (older bindings) its name.
                assert e.errno in (errno.EIO, "EIO"), f"block at {off}: {e} (errno {e.errno})"
                lost.add(off)
                continue
            assert got == data[off:off + BS], f"block at {off}: wrong data returned"
    assert lost, "no block was lost: the damage did not hit live data"
    assert len(lost) < VOL // BS // 4, f"{len(lost)} blocks lost: more than the damaged range"
    # Reads that found no good copy are listed at once.
    st = status(d)
    assert {e["offset"] for e in st["data_errors"] if e["dataset"] == "tank/vol0"} == lost, st["data_errors"]
    st = scrub(d)
    assert st["scan"]["errors"] == len(lost), (st["scan"], len(lost))
    listed = {(e["dataset"], e["offset"]) for e in st["data_errors"]}
    assert listed == {("tank/vol0", off) for off in lost}, (sorted(listed), sorted(lost))
    text = d.cli("pool", "status", "-v", "tank").stdout
    assert f"tank/vol0 @ offset {min(lost)}" in text, text
    # The rest of the pool keeps working: rewrite the lost blocks, all reads right.
    fresh = pattern("fresh", BS)
    with connected(d.uri("tank/vol0")) as h:
        for off in lost:
            h.pwrite(fresh, off)
        h.flush()
    want = bytearray(data)
    for off in lost:
        want[off:off + BS] = fresh
    wait_committed(d)
    assert_same(read_all(d), bytes(want), "volume after rewriting the lost blocks")
    st = scrub(d)
    assert st["scan"]["errors"] == 0 and st["data_errors"] == [], st["scan"]


@pytest.mark.parametrize("fault", ["truncate", "delete"])
def test_lost_device_then_replace(make_daemon, disks, fault):
    d = make_daemon(config=CONFIG)
    devs = make_pool(d, disks, "raidz1")
    data = write_volume(d)
    wait_committed(d)
    d.stop()
    victim = devs[1]
    guid = read_label(victim)["device_guid"]
    if fault == "truncate":
        with open(victim, "r+b") as f:
            # Keeps the first label and the metadata; loses the end label and
            # most of the data region (which starts after 32 MiB of regions).
            f.truncate(34 * MiB)
    else:
        victim.unlink()
    d.start()
    assert_same(read_all(d), data, f"volume with {fault}d device")
    st = status(d)
    if fault == "delete":
        assert st["summary"]["health"] == "DEGRADED", st["summary"]
        assert any(dev["state"] == "UNAVAIL" for dev in devices(st).values()), devices(st)
    else:
        # Shorter than its layout: FAULTED at import, the pool DEGRADED.
        assert devices(st)["d1"]["state"] == "FAULTED", devices(st)
        assert st["summary"]["health"] == "DEGRADED", st["summary"]
        st = scrub(d)
        assert st["scan"]["errors"] == 0, st["scan"]
        assert devices(st)["d1"]["state"] in ("FAULTED", "UNAVAIL"), devices(st)
        assert st["summary"]["health"] == "DEGRADED", st["summary"]
        assert_same(read_all(d), data, "volume after scrubbing with a truncated device")
    new = disks / "new"
    new.write_bytes(b"")
    with open(new, "r+b") as f:
        f.truncate(96 * MiB)
    d.cli("pool", "replace", "tank", str(guid), new)
    st = wait_resilvered(d)
    assert st["scan"]["errors"] == 0, st["scan"]
    devs_now = devices(st)
    assert "new" in devs_now and not devs_now["new"]["resilvering"], devs_now
    assert devs_now["new"]["state"] == "ONLINE", devs_now
    assert st["summary"]["health"] == "ONLINE", st["summary"]
    d.cli("pool", "clear", "tank")
    st = scrub(d)
    assert st["scan"]["errors"] == 0 and st["scan"]["repaired"] == 0, st["scan"]
    assert_same(read_all(d), data, "volume after replace")
    # Survives a restart with the new device (cache file and labels updated).
    d.restart()
    assert status(d)["summary"]["health"] == "ONLINE"
    assert_same(read_all(d), data, "volume after replace and restart")


def _writer(uri: str, stop: threading.Event, model: dict, errors: list, seed: int):
    rnd = random.Random(seed)
    try:
        with connected(uri) as h:
            n = 0
            while not stop.is_set():
                blk = rnd.randrange(VOL // BS)
                buf = pattern(f"{seed}-{n}", BS)
                h.pwrite(buf, blk * BS)
                model[blk] = buf
                n += 1
                if n % 16 == 0:
                    h.flush()
            h.flush()
    except Exception as e:  # noqa: BLE001 (reported by the test)
        errors.append(e)


def test_replace_under_write_load(make_daemon, disks):
    d = make_daemon(config=MEDIUM)
    devs = make_pool(d, disks, "mirror")
    data = write_volume(d)
    wait_committed(d)
    new = disks / "new"
    with open(new, "wb") as f:
        f.truncate(96 * MiB)
    stop, model, errors = threading.Event(), {}, []
    t = threading.Thread(target=_writer, args=(d.uri("tank/vol0"), stop, model, errors, 7))
    t.start()
    try:
        time.sleep(0.5)
        d.cli("pool", "replace", "tank", devs[1], new)
        st = status(d)
        assert devices(st)["new"]["resilvering"], devices(st)
        assert "resilver in progress" in d.cli("pool", "status", "tank").stdout
        wait_resilvered(d, timeout=120)
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert len(model) > 10, "the write load did not run"
    want = bytearray(data)
    for blk, buf in model.items():
        want[blk * BS:(blk + 1) * BS] = buf
    wait_committed(d)
    assert_same(read_all(d), bytes(want), "volume after replace under load")
    st = scrub(d)
    assert st["scan"]["errors"] == 0 and st["scan"]["repaired"] == 0, st["scan"]
    # The new device alone holds everything.
    d.cli("pool", "offline", "tank", devs[0])
    assert_same(read_all(d), bytes(want), "volume read from the new device only")


def test_offline_online_resilvers_what_was_missed(make_daemon, disks):
    d = make_daemon(config=CONFIG)
    devs = make_pool(d, disks, "mirror")
    data = write_volume(d)
    wait_committed(d)
    d.cli("pool", "offline", "tank", devs[1])
    st = status(d)
    assert devices(st)["d1"]["state"] == "OFFLINE" and st["summary"]["health"] == "DEGRADED", st
    p = d.cli("pool", "offline", "tank", devs[0], check=False)
    assert p.returncode != 0 and "replicas" in p.stderr, p.stderr
    newer = write_volume(d, seed=2)
    wait_committed(d)
    # OFFLINE survives a restart (as zpool offline without -t).
    d.restart()
    st = status(d)
    assert devices(st)["d1"]["state"] == "OFFLINE" and st["summary"]["health"] == "DEGRADED", st
    assert_same(read_all(d), newer, "volume read with d1 offline after a restart")
    d.cli("pool", "online", "tank", "d1")
    st = wait_resilvered(d)
    assert devices(st)["d1"]["state"] == "ONLINE" and st["summary"]["health"] == "ONLINE", st
    d.cli("pool", "offline", "tank", devs[0])
    assert_same(read_all(d), newer, "volume read from the onlined device only")
    d.cli("pool", "online", "tank", devs[0])
    wait_resilvered(d)
    assert data != newer


def _scan_progress(d) -> dict:
    return status(d).get("scan") or {}


@pytest.mark.parametrize("what", ["scrub", "resilver"])
def test_kill9_during_scan_resumes(make_daemon, disks, what):
    d = make_daemon(config=SLOW)
    devs = make_pool(d, disks, "mirror")
    data = write_volume(d)
    wait_committed(d)
    if what == "scrub":
        d.cli("pool", "scrub", "tank")
    else:
        new = disks / "new"
        with open(new, "wb") as f:
            f.truncate(96 * MiB)
        d.cli("pool", "replace", "tank", devs[1], new)
    # Past a checkpoint (every 2 s) and clearly not done (2 MiB/s, ~19 MiB).
    started = time.monotonic()
    wait_until(lambda: _scan_progress(d).get("examined", 0) > 6 * MiB, 30, what="scan progress")
    time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
    before = _scan_progress(d)
    assert before["state"] == "scanning", before
    d.kill9()
    d.config_path.write_text(CONFIG)  # full speed after the restart
    d.start()
    after = _scan_progress(d)
    assert after["function"] == what, after
    assert after["state"] in ("scanning", "finished"), after
    # Continued after the last persisted key, not from the start.
    log = d.log_text().split("killed with SIGKILL")[-1]
    assert "resuming scan" in log and "position=Some" in log, log[-2000:]
    if what == "scrub":
        wait_until(lambda: _scan_progress(d)["state"] == "finished", 60, what="scrub finished")
        st = status(d)
        assert st["scan"]["errors"] == 0, st["scan"]
    else:
        st = wait_resilvered(d)
        assert st["scan"]["errors"] == 0, st["scan"]
        assert not devices(st)["new"]["resilvering"], devices(st)
        d.cli("pool", "offline", "tank", devs[0])
        assert_same(read_all(d), data, "volume read from the resilvered device only")
        d.cli("pool", "online", "tank", devs[0])
        wait_resilvered(d)
    assert_same(read_all(d), data, f"volume after kill -9 during {what}")
    st = scrub(d)
    assert st["scan"]["errors"] == 0 and st["scan"]["repaired"] == 0, st["scan"]


def test_scrub_pause_resume_cancel(make_daemon, disks):
    d = make_daemon(config=SLOW)
    make_pool(d, disks, "mirror")
    write_volume(d)
    wait_committed(d)
    d.cli("pool", "scrub", "tank")
    wait_until(lambda: _scan_progress(d).get("examined", 0) > 1 * MiB, 30, what="scrub progress")
    d.cli("pool", "scrub", "-p", "tank")
    s = _scan_progress(d)
    assert s["state"] == "paused", s
    assert "scrub paused" in d.cli("pool", "status", "tank").stdout
    time.sleep(0.5)
    assert _scan_progress(d)["examined"] == s["examined"], "a paused scrub went on"
    d.cli("pool", "scrub", "tank")  # resumes
    s2 = _scan_progress(d)
    assert s2["state"] == "scanning" and s2["examined"] >= s["examined"], s2
    text = d.cli("pool", "status", "tank").stdout
    assert "scrub in progress" in text and "scanned at" in text, text
    d.cli("pool", "scrub", "-s", "tank")
    assert _scan_progress(d)["state"] == "canceled"
    p = d.cli("pool", "scrub", "-p", "tank", check=False)
    assert p.returncode != 0 and "no active scrub" in p.stderr, p.stderr
