"""Pool verbs scripts written for zpool call: history, events, wait,
attach/detach/remove, labelclear, upgrade, list columns, status --json."""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
import time

from conftest import cistern_bin, popen
from helpers import MiB, connected, pattern

DATA_OFFSET = 256 * 1024 + 32 * MiB  # label + 16M metadata + 16M log on a 256M device


def _fails(p, *patterns):
    msg = p.stdout + p.stderr
    assert p.returncode != 0, f"expected failure, got exit 0: {msg}"
    assert "panicked" not in msg, msg
    for pat in patterns:
        assert re.search(pat, msg, re.I), f"error message lacks /{pat}/: {msg!r}"
    return msg


def _write(d, vol: str, seed: str, n: int = 4 * MiB) -> bytes:
    data = pattern(seed, n)
    with connected(d.uri(vol)) as h:
        h.pwrite(data, 0)
        h.flush()
    return data


def _read(d, vol: str, n: int) -> bytes:
    with connected(d.uri(vol)) as h:
        return h.pread(n, 0)


def _status(d, pool: str) -> dict:
    return d.cli_json("pool", "status", pool)["pools"][pool]


def test_history_is_kept_on_the_pool_across_export_import_and_restart(daemon, disks):
    d = daemon
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "16M", "tank/vol")
    d.cli("snapshot", "tank/vol@first")
    d.cli("set", "compression=zstd", "tank/vol")
    d.cli("pool", "scrub", "-w", "tank")
    d.cli("pool", "export", "tank")
    d.cli("pool", "import", "-d", disks, "tank")
    d.restart()
    out = d.cli("pool", "history", "tank").stdout
    lines = out.splitlines()
    assert lines[0] == "History for 'tank':", out
    stamp = r"^\d{4}-\d\d-\d\d\.\d\d:\d\d:\d\d "
    assert all(re.match(stamp, l) for l in lines[1:]), out
    commands = [l.split(" ", 1)[1] for l in lines[1:]]
    assert commands == [
        f"cistern pool create -s 256M tank mirror {disks / 'd0'} {disks / 'd1'}",
        "cistern create -V 16M tank/vol",
        "cistern snapshot tank/vol@first",
        "cistern set compression=zstd tank/vol",
        "cistern pool scrub -w tank",
        "cistern pool export tank",
        f"cistern pool import -d {disks} tank",
    ], out
    long = d.cli("pool", "history", "-l", "tank").stdout
    assert re.search(r"cistern pool scrub -w tank \[user \S+.* on \S+\]$", long, re.M), long
    internal = d.cli("pool", "history", "-i", "tank").stdout
    for what in ("create pool", "scrub setup", "scrub done", "export", "import"):
        assert re.search(rf"\[txg:\d+\] {what}", internal), (what, internal)
    # Without a pool: every pool's. Failed commands are not recorded.
    d.cli("set", "compression=bogus", "tank/vol", check=False)
    assert "bogus" not in d.cli("pool", "history").stdout
    _fails(d.cli("pool", "history", "nope", check=False), "nope")


class Follower:
    """`cistern pool events -f -H POOL` in the background, lines timestamped."""

    def __init__(self, d, *args):
        self.proc = popen([cistern_bin(), "pool", "events", "-f", "-H", *args], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, env=d.env(), text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, cls: str, timeout: float) -> float:
        """When the first line of class `cls` arrived (waiting up to `timeout`)."""
        deadline = time.monotonic() + timeout
        while True:
            for at, line in self.seen:
                if line.split("\t")[-1] == cls:
                    return at
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {cls} event within {timeout}s; saw {self.seen}")
            try:
                self.seen.append(self.lines.get(timeout=left))
            except queue.Empty:
                pass

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def test_events_follow_shows_a_checksum_error_within_a_second(daemon, disks):
    d = daemon
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "16M", "-o", "compression=off", "tank/vol")
    data = _write(d, "tank/vol", "events")
    d.restart()  # committed, and nothing cached
    f = Follower(d, "tank")
    try:
        # Bit rot on one side of the mirror, under the daemon.
        with open(disks / "d1", "r+b") as dev:
            dev.seek(DATA_OFFSET)
            dev.write(os.urandom(2 * MiB))
        d.cli("pool", "scrub", "tank")
        f.wait_for("sysevent.fs.cistern.scrub_start", 5)
        d.cli("pool", "wait", "-t", "scrub", "tank", timeout=120)
        done = time.monotonic()
        # The scrub found and repaired it: its event is out within a second.
        at = f.wait_for("ereport.fs.cistern.checksum", 5)
        assert at - done < 1.0 or at < done, f"checksum event {at - done:.2f}s after the scrub ended"
        f.wait_for("sysevent.fs.cistern.scrub_finish", 5)
    finally:
        f.stop()
    assert _read(d, "tank/vol", len(data)) == data
    verbose = d.cli("pool", "events", "-v", "tank").stdout
    assert re.search(r"^TIME\s+CLASS$", verbose, re.M), verbose
    assert f'vdev_path = "{disks / "d1"}"' in verbose, verbose
    evs = d.cli_json("pool", "events", "tank")
    assert {"seq", "time", "class", "pool", "fields"} <= set(evs[0]), evs[0]
    assert "cleared" in d.cli("pool", "events", "-c", "tank").stdout
    assert d.cli("pool", "events", "-H", "tank").stdout == ""
    _fails(d.cli("pool", "events", "nope", check=False), "nope")


def test_wait_returns_when_the_scrub_ends(daemon, disks):
    d = daemon
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "32M", "tank/vol")
    _write(d, "tank/vol", "wait", 16 * MiB)
    d.cli("pool", "scrub", "tank")
    d.cli("pool", "wait", "-t", "scrub,resilver", "tank", timeout=120)
    assert _status(d, "tank")["scan"]["state"] == "finished"
    d.cli("pool", "wait", "tank")  # nothing running: returns at once
    # A state change is an event too.
    d.cli("pool", "offline", "tank", "d1")
    deadline = time.monotonic() + 2
    while "resource.fs.cistern.statechange" not in (ev := d.cli("pool", "events", "-v", "tank").stdout):
        assert time.monotonic() < deadline, ev
        time.sleep(0.1)
    assert 'vdev_state = "OFFLINE"' in ev and 'vdev_laststate = "ONLINE"' in ev, ev
    _fails(d.cli("pool", "wait", "-t", "trim", "tank", check=False), "invalid activity 'trim'", "scrub")
    _fails(d.cli("pool", "wait", "nope", check=False), "nope")


def test_attach_detach_and_replace_a_missing_device_by_its_old_path(daemon, disks):
    d = daemon
    for n in ("x0", "x1", "x2", "x3"):
        with open(disks / n, "wb") as f:
            f.truncate(256 * MiB)
    d.cli("pool", "create", "tank", disks / "x0")
    d.cli("create", "-V", "16M", "tank/vol")
    data = _write(d, "tank/vol", "attach")
    # A single disk becomes a mirror, resilvered.
    d.cli("pool", "attach", "-w", "tank", "x0", disks / "x1")
    g = _status(d, "tank")["groups"]
    assert [x["kind"] for x in g] == ["mirror"] and len(g[0]["devices"]) == 2, g
    assert all(x["state"] == "ONLINE" and not x["resilvering"] for x in g[0]["devices"]), g
    # And back: the remaining copy holds everything.
    d.cli("pool", "detach", "tank", disks / "x0")
    g = _status(d, "tank")["groups"]
    assert [x["kind"] for x in g] == ["disk"] and g[0]["devices"][0]["path"] == str(disks / "x1"), g
    assert _read(d, "tank/vol", len(data)) == data
    _fails(d.cli("pool", "detach", "tank", "x1", check=False), "only a device of a mirror")
    _fails(d.cli("pool", "attach", "tank", "x1", disks / "nope", check=False), "does not exist")
    _fails(d.cli("pool", "attach", "tank", "x1", disks / "x1", check=False), "already part of")
    # A mirror again; then x0 disappears while the daemon is down.
    d.cli("pool", "attach", "-w", "tank", "x1", disks / "x0")
    d.stop()
    (disks / "x0").unlink()
    d.start()
    st = d.cli("pool", "status", "tank").stdout
    assert re.search(r"^\s+\d+\s+UNAVAIL\s+0\s+0\s+0\s+was " + re.escape(str(disks / "x0")) + "$", st, re.M), st
    dev = [x for x in _status(d, "tank")["groups"][0]["devices"] if x["state"] == "UNAVAIL"][0]
    assert dev["was"] == str(disks / "x0"), dev
    # zpool's way: the old path names the missing device.
    d.cli("pool", "replace", "-w", "tank", disks / "x0", disks / "x2")
    st = _status(d, "tank")
    assert st["summary"]["health"] == "ONLINE", st
    assert sorted(x["path"] for x in st["groups"][0]["devices"]) == [str(disks / "x1"), str(disks / "x2")]
    assert _read(d, "tank/vol", len(data)) == data
    _fails(d.cli("pool", "replace", "tank", disks / "x0", disks / "x3", check=False), "x0")


def test_remove_only_where_the_layout_allows(daemon, disks):
    d = daemon
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "16M", "tank/vol")
    _write(d, "tank/vol", "remove", MiB)
    _fails(d.cli("pool", "remove", "tank", "d0", check=False), "detach", "mirror-0")
    _fails(d.cli("pool", "remove", "tank", "mirror-0", check=False), "only group")
    d.cli("pool", "add", "-s", "256M", "tank", "raidz1", disks / "r0", disks / "r1", disks / "r2")
    _fails(d.cli("pool", "remove", "tank", "r1", check=False), "raidz")
    _fails(d.cli("pool", "remove", "tank", "mirror-0", check=False), "only the last group")
    # The new group is empty (nothing written since): it can go.
    d.cli("pool", "remove", "tank", "raidz1-1")
    assert [g["name"] for g in _status(d, "tank")["groups"]] == ["mirror-0"]
    assert "vdev remove" in d.cli("pool", "history", "-i", "tank").stdout
    # Its devices are free again.
    d.cli("pool", "create", "other", disks / "r0")


def test_list_columns_as_zpool(daemon, disks):
    d = daemon
    d.cli("pool", "create", "-s", "256M", "tank", "raidz1", disks / "r0", disks / "r1", disks / "r2")
    head = d.cli("pool", "list").stdout.splitlines()[0].split()
    assert head == ["NAME", "SIZE", "ALLOC", "FREE", "CKPOINT", "EXPANDSZ", "FRAG", "CAP", "DEDUP",
                    "HEALTH", "ALTROOT"], head
    row = d.cli("pool", "list", "-Hp", "-o", "name,size,alloc,free,frag,cap,dedup,health,usable,avail",
                "tank").stdout.split("\t")
    name, size, alloc, free, frag, cap, dedup, health, usable, avail = [c.strip() for c in row]
    assert name == "tank" and health == "ONLINE" and dedup == "1.00"
    # Raw: every device's data area, parity included; usable is 2/3 of it.
    assert int(size) == int(alloc) + int(free)
    assert abs(int(usable) * 3 - int(size) * 2) < int(size) // 100, (size, usable)
    assert frag.isdigit() and cap.isdigit(), row
    # The usable figure is where `zfs list` users look for it.
    ds_avail = int(d.cli("list", "-Hp", "-o", "avail", "tank").stdout.split()[0])
    assert 0 < ds_avail <= int(avail)
    _fails(d.cli("pool", "list", "-o", "name,bogus", check=False), "bogus", "valid: name")


def test_status_json_has_one_shape(daemon, disks):
    d = daemon
    d.cli("pool", "create", "-s", "256M", "tank", disks / "d0")
    d.cli("pool", "create", "-s", "256M", "pond", disks / "p0")
    one = d.cli_json("pool", "status", "tank")
    every = d.cli_json("pool", "status")
    assert one["output_version"] == every["output_version"] == 1
    assert list(one["pools"]) == ["tank"] and sorted(every["pools"]) == ["pond", "tank"]
    assert set(one["pools"]["tank"]) == set(every["pools"]["pond"]) >= {"summary", "groups", "errors", "scan"}
    d.cli("pool", "export", "tank")
    d.cli("pool", "export", "pond")
    assert d.cli_json("pool", "status") == {"output_version": 1, "pools": {}}


def test_labelclear_and_upgrade(make_daemon, disks):
    a = make_daemon("a")
    a.cli("pool", "create", "-s", "256M", "tank", disks / "d0")
    a.cli("pool", "create", "-s", "256M", "gone", disks / "g0")
    _fails(a.cli("pool", "labelclear", disks / "d0", check=False), "imported here")
    _fails(a.cli("pool", "labelclear", disks / "nope", check=False), "no such device")
    # Another daemon sees the label of a pool that was never exported.
    b = make_daemon("b")
    _fails(b.cli("pool", "labelclear", disks / "g0", check=False), "not exported", "-f")
    b.cli("pool", "labelclear", "-f", disks / "g0")
    _fails(b.cli("pool", "labelclear", disks / "g0", check=False), "no pool label")
    a.cli("pool", "export", "tank")
    b.cli("pool", "labelclear", disks / "d0")  # exported: no -f needed
    assert "no pools available to import" in b.cli("pool", "import", "-d", disks).stdout
    # upgrade: reports the versions; nothing to do on a current pool.
    b.cli("pool", "create", "-s", "256M", "new", disks / "n0")
    assert "current format" in b.cli("pool", "upgrade").stdout
    assert "nothing to upgrade" in b.cli("pool", "upgrade", "new").stdout
    assert "nothing to upgrade" in b.cli("pool", "upgrade", "-a").stdout
    assert re.search(r"metadata format \d+", b.cli("pool", "upgrade", "-v").stdout)
    _fails(b.cli("pool", "upgrade", "nope", check=False), "nope")
