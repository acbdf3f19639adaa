"""Health tells the truth (issue 9, items 3 and 6): a pool whose commits fail
is SUSPENDED (failmode wait/continue) and `pool clear` resumes it once room is
made, with nothing acknowledged lost; truncated and deleted devices are
FAULTED/REMOVED under load with zpool's status/action text; a scrub after
kill -9 reports nothing when nothing is damaged; pool get/set; and the log
says each of these once, not once per block.

The full-filesystem test mounts a small tmpfs under the device files (root
only; skipped otherwise) so writes fail with ENOSPC from the kernel."""

from __future__ import annotations

import errno
import os
import random
import re
import subprocess
import threading
import time
from pathlib import Path

import nbd
import pytest

from helpers import KiB, MiB, connected, pattern, wait_until

DEV = "96M"
FAST = "[engine]\ntxg_timeout_secs = 0.2\nblock_cache_bytes = 0\n"


def status(d, pool="tank") -> dict:
    return d.cli_json("pool", "status", pool)["pools"][pool]


def devices(st: dict) -> dict[str, dict]:
    return {Path(dev["path"]).name: dev for g in st["groups"] for dev in g["devices"]}


def wait_status(d, pred, what: str, pool: str = "tank", timeout: float = 60) -> dict:
    """`pool status POOL` once `pred` holds for it."""

    def check():
        st = status(d, pool)
        return st if pred(st) else None

    return wait_until(check, timeout, interval=0.3, what=what)


def metrics(d) -> str:
    return d.metrics()


def metric(d, name: str, **labels) -> float | None:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for line in metrics(d).splitlines():
        if line.startswith(name + "{") and all(w in line for w in want):
            return float(line.rsplit(" ", 1)[1])
    return None


def log_lines(d, pattern_: str) -> list[str]:
    return [l for l in d.log_text().splitlines() if re.search(pattern_, l)]


# ------------------------------------------------------------------ pool get/set


def test_pool_get_set_properties_persist(make_daemon, disks):
    d = make_daemon()
    d.cli("pool", "create", "-s", DEV, "tank", "mirror", disks / "d0", disks / "d1")
    out = d.cli("pool", "get", "all", "tank").stdout
    assert re.search(r"tank\s+failmode\s+wait\s+default", out), out
    assert re.search(r"tank\s+autoreplace\s+off\s+default", out), out
    assert re.search(r"tank\s+health\s+ONLINE\s+-", out), out
    d.cli("pool", "set", "failmode=continue", "tank")
    d.cli("pool", "set", "autoreplace=on", "tank")
    d.cli("pool", "set", "comment=rack 4, shelf 2", "tank")
    bad = d.cli("pool", "set", "failmode=sometimes", "tank", check=False)
    assert bad.returncode != 0 and "failmode" in bad.stderr, bad.stderr
    bad = d.cli("pool", "set", "size=1G", "tank", check=False)
    assert bad.returncode != 0 and "read-only" in bad.stderr, bad.stderr
    d.restart()
    out = d.cli("pool", "get", "-H", "-o", "property,value,source", "failmode,autoreplace,comment", "tank").stdout
    assert out.splitlines() == [
        "failmode\tcontinue\tlocal",
        "autoreplace\ton\tlocal",
        "comment\track 4, shelf 2\tlocal",
    ], out
    assert d.cli("pool", "get", "-Hp", "-o", "value", "size", "tank").stdout.strip().isdigit()
    bad = d.cli("pool", "get", "nope", "tank", check=False)
    assert bad.returncode != 0 and "invalid property 'nope'" in bad.stderr, bad.stderr


# ------------------------------------------------------------------ a full filesystem under the devices


@pytest.fixture
def small_fs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96M", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(mnt: Path, leave: int) -> Path:
    """A file taking all free space of `mnt` but `leave` bytes."""
    st = os.statvfs(mnt)
    free = st.f_bavail * st.f_frsize
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        left = max(0, free - leave)
        chunk = bytes(MiB)
        while left > 0:
            n = min(left, MiB)
            f.write(chunk[:n])
            left -= n
    return filler


@pytest.mark.parametrize("failmode", ["wait", "continue"])
def test_full_filesystem_suspends_pool_and_clear_resumes(make_daemon, small_fs, failmode):
    # A small log buffer: bulk writes are left to the txg, so a FLUSH needs a
    # commit (and must not be acknowledged while none can be written).
    d = make_daemon(config=FAST + "log_buffer_bytes = 1048576\n")
    d.cli("pool", "create", "-s", DEV, "tank", "mirror", small_fs / "d0", small_fs / "d1")
    d.cli("create", "-s", "-V", "64M", "-o", "compression=off", "tank/vol0")
    d.cli("pool", "set", f"failmode={failmode}", "tank")
    first = pattern(1, 4 * MiB)
    with connected(d.uri("tank/vol0")) as h:
        h.pwrite(first, 0)
        h.flush()  # acknowledged: must survive everything below
    filler = fill(small_fs, 2 * MiB)

    second = pattern(2, 12 * MiB)
    h = nbd.NBD()
    h.connect_uri(d.uri("tank/vol0"))
    flushed = threading.Event()
    outcome: list = []

    def write_and_flush():
        try:
            for off in range(0, len(second), MiB):
                h.pwrite(second[off:off + MiB], 8 * MiB + off)
            h.flush()
            outcome.append("ok")
        except nbd.Error as e:
            outcome.append(e)
        flushed.set()

    t = threading.Thread(target=write_and_flush, daemon=True)
    t.start()
    st = wait_status(d, lambda s: s["summary"]["health"] == "SUSPENDED", "pool SUSPENDED")
    assert st["suspended"] and "No space left on device" in st["suspended"], st["suspended"]
    text = d.cli("pool", "status", "tank").stdout
    assert "state: SUSPENDED" in text and "status: The pool is suspended" in text, text
    assert "action: Make sure the affected devices are connected and have room" in text, text
    assert "cistern pool clear tank" in text, text
    assert "SUSPENDED" in d.cli("pool", "list", "-H", "-o", "name,health").stdout
    assert "tank" in d.cli("pool", "status", "-x").stdout
    assert metric(d, "cistern_pool_suspended", pool="tank") == 1
    assert metric(d, "cistern_pool_health", pool="tank", health="SUSPENDED") == 1
    if failmode == "wait":
        time.sleep(2)
        assert not flushed.is_set(), f"FLUSH answered while the pool is suspended: {outcome}"
    else:
        assert flushed.wait(30), "FLUSH still blocked with failmode=continue"
        assert isinstance(outcome[0], nbd.Error) and outcome[0].errno in (errno.EIO, "EIO"), outcome
        with connected(d.uri("tank/vol0")) as h2:
            assert h2.pread(len(first), 0) == first, "reads go on with failmode=continue"
            with pytest.raises(nbd.Error) as e:
                h2.pwrite(b"x" * 4096, 40 * MiB)
            assert e.value.errno in (errno.EIO, "EIO")
    # Still full: clear cannot resume it and says why.
    p = d.cli("pool", "clear", "tank", check=False)
    assert p.returncode != 0 and "still suspended" in p.stderr, p.stderr
    assert status(d)["summary"]["health"] == "SUSPENDED"

    filler.unlink()  # room again
    d.cli("pool", "clear", "tank")
    st = status(d)
    assert st["summary"]["health"] != "SUSPENDED" and st["suspended"] is None, st["summary"]
    if failmode == "wait":
        assert flushed.wait(60), "FLUSH did not complete after pool clear"
        assert outcome == ["ok"], outcome
    else:
        with connected(d.uri("tank/vol0")) as h2:
            for off in range(0, len(second), MiB):
                h2.pwrite(second[off:off + MiB], 8 * MiB + off)
            h2.flush()
    h.shutdown()
    wait_until(lambda: status(d)["summary"]["health"] == "ONLINE", 120, what="pool ONLINE again")
    assert metric(d, "cistern_pool_suspended", pool="tank") == 0
    assert d.cli("pool", "status", "-x").stdout.strip() == "all pools are healthy"
    d.restart()
    with connected(d.uri("tank/vol0")) as h2:
        assert h2.pread(len(first), 0) == first, "acknowledged data before the suspension"
        got = b"".join(h2.pread(MiB, 8 * MiB + off) for off in range(0, len(second), MiB))
        assert got == second, "data flushed after pool clear"
    # The log: the suspension once (plus bounded repeats), no redb advice.
    assert 1 <= len(log_lines(d, "pool SUSPENDED")) <= 5, log_lines(d, "pool SUSPENDED")
    assert len(log_lines(d, "txg commit failed")) <= 10, len(log_lines(d, "txg commit failed"))
    assert not log_lines(d, "re-open the database"), "redb's advice leaked into the log"
    assert log_lines(d, "pool resumed")


def test_sigterm_on_suspended_pool_exits_cleanly(make_daemon, small_fs):
    d = make_daemon(config=FAST + "log_buffer_bytes = 1048576\n")
    d.cli("pool", "create", "-s", DEV, "tank", "mirror", small_fs / "d0", small_fs / "d1")
    d.cli("create", "-s", "-V", "32M", "-o", "compression=off", "tank/vol0")
    acked = pattern(3, 2 * MiB)
    with connected(d.uri("tank/vol0")) as h:
        h.pwrite(acked, 0)
        h.flush()
    fill(small_fs, MiB)

    # Never flushed. From a thread: once the pool suspends, a write may wait
    # for room that never comes, and the test must still get to SIGTERM.
    def unflushed():
        try:
            with connected(d.uri("tank/vol0")) as h2:
                for off in range(0, 8 * MiB, MiB):
                    h2.pwrite(pattern(off, MiB), 4 * MiB + off)
        except Exception:  # noqa: BLE001  (the daemon goes away under it)
            pass

    t = threading.Thread(target=unflushed, daemon=True)
    t.start()
    wait_until(lambda: status(d)["summary"]["health"] == "SUSPENDED", 60, what="SUSPENDED")
    rc = d.stop(timeout=60)
    t.join(30)
    assert rc == 0, d.log_tail()
    assert log_lines(d, "closed while SUSPENDED.*never acknowledged.*dropped"), d.log_tail()
    (small_fs / "filler").unlink()
    d.start()
    with connected(d.uri("tank/vol0")) as h:
        assert h.pread(len(acked), 0) == acked


# ------------------------------------------------------------------ devices lost under load


def writer(uri: str, stop: threading.Event, model: dict, errors: list, seed: int, span: int):
    rnd = random.Random(seed)
    try:
        with connected(uri) as h:
            ver = 0
            while not stop.is_set():
                ver += 1
                blk = rnd.randrange(span // (64 * KiB))
                data = pattern(f"{seed}-{ver}", 64 * KiB)
                h.pwrite(data, blk * 64 * KiB, nbd.CMD_FLAG_FUA)
                model[blk] = data
    except Exception as e:  # noqa: BLE001
        errors.append(e)


def test_truncated_and_deleted_devices_fault_under_load(make_daemon, disks):
    d = make_daemon(config=FAST)
    for pool, a, b in (("tank", "d0", "d1"), ("pool2", "e0", "e1")):
        d.cli("pool", "create", "-s", DEV, pool, "mirror", disks / a, disks / b)
        d.cli("create", "-s", "-V", "16M", "-o", "compression=off", f"{pool}/vol0")
    models = {"tank": {}, "pool2": {}}
    stop = threading.Event()
    errors: list = []
    threads = [threading.Thread(target=writer, args=(d.uri(f"{p}/vol0"), stop, models[p], errors, i, 16 * MiB))
               for i, p in enumerate(models)]
    for t in threads:
        t.start()
    time.sleep(1.5)
    os.truncate(disks / "d1", 0)  # truncated to nothing while serving
    (disks / "e1").unlink()  # deleted while serving
    st = wait_status(d, lambda s: devices(s)["d1"]["state"] == "FAULTED", "d1 FAULTED", timeout=30)
    assert st["summary"]["health"] == "DEGRADED" and st["groups"][0]["state"] == "DEGRADED", st["summary"]
    assert "shorter than" in devices(st)["d1"]["reason"], devices(st)["d1"]
    assert "faulted in response to persistent errors" in st["status"], st["status"]
    assert "Replace the faulted device" in st["action"], st["action"]
    st2 = wait_status(d, lambda s: devices(s)["e1"]["state"] == "REMOVED", "e1 REMOVED", "pool2", 30)
    assert st2["summary"]["health"] == "DEGRADED", st2["summary"]
    text = d.cli("pool", "status", "pool2").stdout
    assert "status: One or more devices has been removed" in text, text
    assert "action: Online the device using 'cistern pool online' or replace the device with" in text, text
    time.sleep(1)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors, f"writers failed: {errors}"
    x = d.cli("pool", "status", "-x").stdout
    assert "pool: tank" in x and "pool: pool2" in x, x
    assert metric(d, "cistern_device_state", pool="tank", device=str(disks / "d1"), state="FAULTED") == 1
    assert metric(d, "cistern_device_state", pool="pool2", device=str(disks / "e1"), state="REMOVED") == 1
    assert metric(d, "cistern_pool_health", pool="tank", health="DEGRADED") == 1
    # I/O stopped going to them: counters no longer grow.
    before = devices(status(d))["d1"]
    time.sleep(1.5)
    after = devices(status(d))["d1"]
    assert (before["read_errors"], before["write_errors"]) == (after["read_errors"], after["write_errors"])
    # Every acknowledged (FUA) write reads back.
    for p, model in models.items():
        with connected(d.uri(f"{p}/vol0")) as h:
            for blk, data in model.items():
                assert h.pread(len(data), blk * 64 * KiB) == data, f"{p} block {blk}"
    # Retried: still short / still gone.
    d.cli("pool", "clear", "tank")
    assert devices(status(d))["d1"]["state"] == "FAULTED"
    p = d.cli("pool", "online", "pool2", "e1", check=False)
    assert p.returncode != 0 and "cannot online" in p.stderr, p.stderr
    # The truncated file gets its size back: clear brings it back and resilvers it.
    os.truncate(disks / "d1", 96 * MiB)
    d.cli("pool", "clear", "tank")
    wait_until(lambda: status(d)["summary"]["health"] == "ONLINE", 60, what="tank ONLINE after resilver")
    d.cli("pool", "scrub", "-w", "tank", timeout=120)
    st = status(d)
    assert st["scan"]["errors"] == 0 and not st["data_errors"], st["scan"]
    # The deleted one is replaced.
    new = disks / "e9"
    with open(new, "wb") as f:
        f.truncate(96 * MiB)
    d.cli("pool", "replace", "-w", "pool2", "e1", new, timeout=120)
    assert status(d, "pool2")["summary"]["health"] == "ONLINE"
    d.cli("pool", "clear", "tank")
    assert d.cli("pool", "status", "-x").stdout.strip() == "all pools are healthy"
    # One line per event, not one per block.
    assert len(log_lines(d, "FAULTED")) <= 6, log_lines(d, "FAULTED")
    assert len(log_lines(d, "REMOVED")) <= 4, log_lines(d, "REMOVED")
    assert len(log_lines(d, "heal")) <= 20, len(log_lines(d, "heal"))
    assert len(log_lines(d, r"WARN|ERROR")) <= 80, len(log_lines(d, r"WARN|ERROR"))


def test_scrub_repairs_damaged_labels(make_daemon, disks):
    d = make_daemon(config=FAST)
    d.cli("pool", "create", "-s", DEV, "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-s", "-V", "8M", "tank/vol0")
    d.cli("pool", "scrub", "-w", "tank")
    size = (disks / "d1").stat().st_size
    with open(disks / "d1", "r+b") as f:  # both labels of d1 overwritten
        for at in (0, size - 256 * KiB):
            f.seek(at)
            f.write(os.urandom(4096))
    d.cli("pool", "scrub", "-w", "tank")
    assert log_lines(d, "label rewritten"), d.log_tail()
    assert status(d)["scan"]["repaired"] > 0
    d.restart()  # the next import finds good labels on both devices
    st = status(d)
    assert st["summary"]["health"] == "ONLINE" and all(v["state"] == "ONLINE" for v in devices(st).values()), st


# ------------------------------------------------------------------ scrub after kill -9


def fua_load(uri: str, stop: threading.Event, seed: int):
    rnd = random.Random(seed)
    try:
        with connected(uri) as h:
            while not stop.is_set():
                n = rnd.choice([4, 16, 64]) * KiB
                h.pwrite(rnd.randbytes(n), rnd.randrange((64 * MiB - n) // 4096) * 4096, nbd.CMD_FLAG_FUA)
    except Exception:  # noqa: BLE001  (the daemon is killed under it)
        pass


def test_scrub_after_kill9_under_load_reports_nothing(make_daemon, disks):
    """A scrub checks what the last committed transaction references: the
    pages a commit interrupted by kill -9 left behind are not damage."""
    budget = float(os.environ.get("CISTERN_SCRUB_CRASH_SECS", "12"))
    d = make_daemon(config="[engine]\ntxg_timeout_secs = 0.05\n")
    d.cli("pool", "create", "-s", DEV, "tank", "mirror", disks / "d0", disks / "d1")
    # Small blocks spread over the volume: many block-map rows, so each
    # commit rewrites many metadata pages.
    d.cli("create", "-s", "-V", "64M", "-o", "volblocksize=4K", "-o", "compression=off", "tank/vol0")
    d.ignore_panics = True
    rnd = random.Random(9)
    deadline = time.monotonic() + budget
    runs = 0
    while time.monotonic() < deadline or runs < 5:
        stop = threading.Event()
        threads = [threading.Thread(target=fua_load, args=(d.uri("tank/vol0"), stop, runs * 10 + i)) for i in range(3)]
        for t in threads:
            t.start()
        time.sleep(rnd.uniform(0.3, 2.0))
        d.kill9()
        stop.set()
        for t in threads:
            t.join(10)
        d.start()
        p = d.cli("pool", "scrub", "-w", "tank", check=False, timeout=120)
        st = status(d)
        assert p.returncode == 0 and st["scan"]["errors"] == 0 and not st["data_errors"], (
            f"run {runs}: scrub after kill -9 reported errors: {p.stderr} {st['scan']} {st['data_errors'][:5]}"
        )
        runs += 1
        if runs >= 40:
            break
    assert runs >= 5
