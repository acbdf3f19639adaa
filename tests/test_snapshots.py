"""Snapshots, clones, rollback, holds and diffs through real clients: the CLI,
NBD snapshot exports and the `cistern:changed:SNAP` meta context (libnbd),
ext4 on a volume (nbdfuse + loop mount), and kill -9 in the middle of every
snapshot command."""

from __future__ import annotations

import json
import os
import random

import nbd
import pytest

from helpers import MiB, connected, parse_get, pattern
from test_filesystem import _read_tree, _why_no_fs, _write_tree, loop_mount, nbdfuse
from conftest import run

BS = 16 * 1024


def read_export(uri: str, size: int) -> bytes:
    with connected(uri) as h:
        out = bytearray()
        pos = 0
        while pos < size:
            n = min(4 * MiB, size - pos)
            out += h.pread(n, pos)
            pos += n
        return bytes(out)


def write_export(uri: str, offset: int, data: bytes):
    with connected(uri) as h:
        h.pwrite(data, offset)
        h.flush()


def allocated(daemon) -> int:
    out = daemon.cli("pool", "list", "-Hp", "-o", "name,alloc").stdout.split()
    return int(out[1])


def test_snapshot_export_is_read_only_and_shows_the_past(daemon, make_volume):
    vol = make_volume("v", "64M")
    old = pattern("old", 8 * MiB)
    write_export(vol.uri, 0, old)
    daemon.cli("snapshot", "tank/v@monday")
    new = pattern("new", 1 * MiB)
    write_export(vol.uri, 2 * MiB, new)

    snap_uri = daemon.uri("tank/v@monday")
    with connected(snap_uri) as h:
        assert h.is_read_only()
        assert h.get_size() == 64 * MiB
        assert h.pread(8 * MiB, 0) == old
        with pytest.raises(nbd.Error) as e:
            h.pwrite(b"x" * 4096, 0)
        assert e.value.errno in (1, "EPERM")
    now = read_export(vol.uri, 8 * MiB)
    assert now[2 * MiB : 3 * MiB] == new and now[: 2 * MiB] == old[: 2 * MiB]

    # The export list names snapshots too.
    p = run(["nbdinfo", "--list", "--json", daemon.uri()])
    names = [e["export-name"] for e in json.loads(p.stdout)["exports"]]
    assert "tank/v" in names and "tank/v@monday" in names


def test_changed_meta_context_names_exactly_the_changed_ranges(daemon, make_volume):
    vol = make_volume("v", "64M", volblocksize="16K")
    write_export(vol.uri, 0, pattern("base", 4 * MiB))
    daemon.cli("snapshot", "tank/v@base")
    changes = [(0, 4096), (1 * MiB + 100, 20000), (8 * MiB, 64 * 1024), (63 * MiB, 16384)]
    with connected(vol.uri) as h:
        for off, ln in changes:
            h.pwrite(pattern(off, ln), off)
        h.trim(5 * MiB, BS)  # a trim over committed blocks is a change too
        h.flush()
    expect = set()
    for off, ln in changes:
        expect.update(range(off // BS, (off + ln - 1) // BS + 1))
    # The trim changed every block that held data at the snapshot (0..4M);
    # the never-written blocks it covers stay unchanged.
    trimmed = set(range(1, 4 * MiB // BS))
    ctx = "cistern:changed:base"
    h = nbd.NBD()
    h.add_meta_context(ctx)
    h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    h.connect_uri(vol.uri)
    try:
        assert h.can_meta_context(ctx)
        got = set()
        pos = 0
        while pos < 64 * MiB:
            seen = []

            def cb(metacontext, off, entries, err):
                if metacontext == ctx:
                    seen.extend(zip(entries[0::2], entries[1::2]))
                return 0

            h.block_status(64 * MiB - pos, pos, cb)
            assert seen
            for ln, flags in seen:
                if flags & 1:
                    got.update(range(pos // BS, (pos + ln) // BS))
                pos += ln
        assert got == expect | trimmed, sorted(got ^ (expect | trimmed))[:10]
    finally:
        h.shutdown()
    # Meta context listing finds it by prefix.
    h2 = nbd.NBD()
    h2.set_opt_mode(True)
    h2.add_meta_context("cistern:")
    h2.connect_uri(vol.uri)
    try:
        found = []
        h2.opt_list_meta_context(lambda name: found.append(name) or 0)
        assert ctx in found
    finally:
        h2.opt_abort()
    # `cistern diff` says the same, in bytes.
    diff = json.loads(daemon.cli("diff", "--json", "tank/v@base").stdout)
    blocks = set()
    for r in diff["ranges"]:
        blocks.update(range(r["offset"] // BS, (r["offset"] + r["length"]) // BS))
    assert blocks == expect | trimmed


def test_cli_lists_snapshot_space_and_destroys_ranges(daemon, make_volume):
    vol = make_volume("v", "64M", compression="off", volblocksize="16K")
    for i, name in enumerate(["a", "b", "c", "d"]):
        write_export(vol.uri, i * 4 * MiB, pattern(name, 4 * MiB))  # new data each time
        write_export(vol.uri, 32 * MiB, pattern(name + "x", 1 * MiB))  # overwritten each time
        daemon.cli("snapshot", f"tank/v@{name}")
    out = daemon.cli("list", "-Hp", "-t", "snapshot", "-o", "name,used,referenced,written,creation").stdout
    rows = {l.split("\t")[0]: l.split("\t") for l in out.strip().splitlines()}
    assert sorted(rows) == ["tank/v@a", "tank/v@b", "tank/v@c", "tank/v@d"]
    # Each of a..c alone holds its 1 MiB version of the overwritten region; d shares it with the head.
    assert [int(rows[f"tank/v@{n}"][1]) for n in "abcd"] == [MiB, MiB, MiB, 0]
    assert [int(rows[f"tank/v@{n}"][2]) for n in "abcd"] == [5 * MiB, 9 * MiB, 13 * MiB, 17 * MiB]
    assert all(int(rows[f"tank/v@{n}"][3]) == 5 * MiB for n in "abcd")
    props = daemon.props("tank/v")
    assert int(props["usedbysnapshots"]) == 3 * MiB
    # Not sparse: after snapshot d nothing is unique, so the whole 64M refreservation is unused.
    assert int(props["usedbyrefreservation"]) == 64 * MiB
    assert int(props["used"]) == 17 * MiB + 3 * MiB + 64 * MiB

    # Default listing hides snapshots; -t all shows them.
    assert "@" not in daemon.cli("list", "-H", "-o", "name").stdout
    assert "tank/v@a" in daemon.cli("list", "-H", "-o", "name", "-t", "all").stdout

    # Dry run of a range says exactly what it frees, and changes nothing.
    before = allocated(daemon)
    p = daemon.cli("destroy", "-nvp", "tank/v@a%c")
    assert p.stdout.splitlines() == [
        "would destroy tank/v@a",
        "would destroy tank/v@b",
        "would destroy tank/v@c",
        f"would reclaim {3 * MiB}",
    ]
    assert allocated(daemon) == before
    # Holds: a held snapshot is not destroyed; holds lists it.
    daemon.cli("hold", "keep", "tank/v@b")
    assert "keep" in daemon.cli("holds", "-H", "tank/v@b").stdout
    p = daemon.cli("destroy", "tank/v@a%c", check=False)
    assert p.returncode != 0 and "held" in p.stderr
    assert allocated(daemon) == before
    daemon.cli("release", "keep", "tank/v@b")
    p = daemon.cli("destroy", "-vp", "tank/v@a%c")
    assert p.stdout.splitlines()[-1] == f"will reclaim {3 * MiB}"
    assert allocated(daemon) == before - 3 * MiB
    # Bad names are refused naming the problem.
    for bad, why in [("tank/v@", "snapshot"), ("tank/nope@x", "does not exist"), ("tank/v@zz", "does not exist")]:
        p = daemon.cli("destroy", bad, check=False)
        assert p.returncode != 0 and why in p.stderr, (bad, p.stderr)
    p = daemon.cli("snapshot", "tank/v@d", check=False)
    assert p.returncode != 0 and "already exists" in p.stderr
    p = daemon.cli("destroy", "tank/v", check=False)
    assert p.returncode != 0 and "snapshots" in p.stderr
    daemon.cli("destroy", "-r", "tank/v")
    assert allocated(daemon) == 0


def test_recursive_snapshot_and_rollback(daemon, make_volume):
    a = make_volume("a", "16M")
    b = make_volume("b", "16M")
    write_export(a.uri, 0, pattern("a1", MiB))
    write_export(b.uri, 0, pattern("b1", MiB))
    daemon.cli("snapshot", "-r", "tank@one")
    names = daemon.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split()
    assert names == ["tank@one", "tank/a@one", "tank/b@one"]  # zfs order: a dataset's snapshots before its children
    # Same txg for all: createtxg equal.
    txgs = {n: daemon.prop(n, "createtxg") for n in names}
    assert len(set(txgs.values())) == 1, txgs
    write_export(a.uri, 0, pattern("a2", MiB))
    daemon.cli("snapshot", "tank/a@two")
    write_export(a.uri, 0, pattern("a3", MiB))
    p = daemon.cli("rollback", "tank/a@one", check=False)
    assert p.returncode != 0 and "tank/a@two" in p.stderr
    assert read_export(a.uri, MiB) == pattern("a3", MiB)
    p = daemon.cli("rollback", "-r", "tank/a@one")
    assert "destroyed tank/a@two" in p.stdout
    assert read_export(a.uri, MiB) == pattern("a1", MiB)
    assert read_export(b.uri, MiB) == pattern("b1", MiB)
    daemon.restart()
    assert read_export(a.uri, MiB) == pattern("a1", MiB)


@pytest.mark.skipif(_why_no_fs() is not None, reason=_why_no_fs() or "")
def test_ext4_snapshot_mount_rollback_and_clone(daemon, make_volume, tmp_path):
    vol = make_volume("fs", "256M", compression="lz4")
    rng = random.Random(7)
    log = tmp_path / "nbdfuse.log"

    def fsync_image(image):
        fd = os.open(image, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    with nbdfuse(vol.uri, tmp_path / "mnt", log) as image:
        run(["mkfs.ext4", "-q", "-F", image], timeout=300)
        with loop_mount(image, tmp_path / "fs") as fs:
            before = _write_tree(fs, rng, 80)
        fsync_image(image)
    daemon.cli("snapshot", "tank/fs@before")
    with nbdfuse(vol.uri, tmp_path / "mnt", log) as image:
        with loop_mount(image, tmp_path / "fs") as fs:
            for rel in sorted(before)[:30]:
                (fs / rel).unlink()
            (fs / "new-after-snapshot.txt").write_text("after\n")
            after = _read_tree(fs)
        fsync_image(image)
    assert after != before

    # The snapshot export, mounted read-only, shows the old files.
    with nbdfuse(daemon.uri("tank/fs@before"), tmp_path / "smnt", log, read_only=True) as image:
        (tmp_path / "sfs").mkdir()
        run(["mount", "-o", "loop,ro,noload", image, tmp_path / "sfs"])
        try:
            assert _read_tree(tmp_path / "sfs") == before
        finally:
            run(["umount", tmp_path / "sfs"])

    # A clone boots a second filesystem from the snapshot; the original is untouched.
    daemon.cli("clone", "tank/fs@before", "tank/fs2")
    with nbdfuse(daemon.uri("tank/fs2"), tmp_path / "cmnt", log) as image:
        with loop_mount(image, tmp_path / "cfs") as fs:
            assert _read_tree(fs) == before
            (fs / "clone-only.txt").write_text("clone\n")
        fsync_image(image)
    assert daemon.prop("tank/fs2", "origin") == "tank/fs@before"

    # Rollback (the clone stays: it depends on the snapshot, not on what came after).
    daemon.cli("rollback", "tank/fs@before")
    with nbdfuse(vol.uri, tmp_path / "mnt", log) as image:
        fsck = run(["e2fsck", "-f", "-n", image], check=False, timeout=300)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
        with loop_mount(image, tmp_path / "fs") as fs:
            assert _read_tree(fs) == before


OPS = ["snapshot", "destroy", "rollback", "clone", "rename"]


@pytest.mark.parametrize("point", ["action_before_meta", "action_after_meta"])
@pytest.mark.parametrize("op", OPS)
def test_kill_during_snapshot_commands(make_daemon, disks, op, point):
    """The daemon aborts inside the txg commit that carries the command; after
    a restart the command either happened entirely or not at all, nothing
    acknowledged is lost, and destroying everything frees every byte."""
    d = make_daemon()
    d.ignore_panics = True
    d.cli("pool", "create", "-s", "1G", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "32M", "tank/v")
    uri = d.uri("tank/v")
    a, b = pattern("A", 4 * MiB), pattern("B", 2 * MiB)
    write_export(uri, 0, a)
    d.cli("snapshot", "tank/v@s1")
    write_export(uri, 0, b)  # flushed: must survive
    if op == "destroy":
        d.cli("snapshot", "tank/v@s2")
    d.stop()
    d.start(env={"CISTERN_FAULT_TXG_CRASH": point})
    cmd = {
        "snapshot": ["snapshot", "tank/v@s2"],
        "destroy": ["destroy", "tank/v@s1"],
        "rollback": ["rollback", "tank/v@s1"],
        "clone": ["clone", "tank/v@s1", "tank/c"],
        "rename": ["rename", "tank/v@s1", "@renamed"],
    }[op]
    p = d.cli(*cmd, check=False)
    assert p.returncode != 0, "the daemon should have aborted during the command"
    d.proc.wait(30)
    d.start()
    happened = point == "action_after_meta"
    head = read_export(uri, 4 * MiB)
    if op == "rollback" and happened:
        assert head == a
    else:
        assert head == b + a[2 * MiB :]
    snaps = d.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split()
    if op == "destroy":
        assert ("tank/v@s1" in snaps) != happened
    elif op == "rename":
        assert ("tank/v@s1" in snaps) != happened and ("tank/v@renamed" in snaps) == happened, snaps
        assert read_export(d.uri("tank/v@renamed" if happened else "tank/v@s1"), 4 * MiB) == a
    else:
        assert "tank/v@s1" in snaps
        assert read_export(d.uri("tank/v@s1"), 4 * MiB) == a
    if op == "snapshot":
        assert ("tank/v@s2" in snaps) == happened
        if happened:
            assert read_export(d.uri("tank/v@s2"), 4 * MiB) == b + a[2 * MiB :]
    if op == "clone":
        has = "tank/c" in d.cli("list", "-H", "-o", "name").stdout.split()
        assert has == happened
        if happened:
            assert read_export(d.uri("tank/c"), 4 * MiB) == a
            d.cli("destroy", "tank/c")
    d.cli("destroy", "-r", "tank/v")
    assert allocated(d) == 0, "space leaked or double counted after the crash"


def test_promote_lets_the_origin_go(daemon, make_volume):
    gold = make_volume("gold", "16M")
    write_export(gold.uri, 0, pattern("golden", 4 * MiB))
    daemon.cli("snapshot", "tank/gold@v1")
    write_export(gold.uri, 0, pattern("gold-later", MiB))
    daemon.cli("clone", "tank/gold@v1", "tank/vm")
    write_export(daemon.uri("tank/vm"), 2 * MiB, pattern("vm", MiB))
    p = daemon.cli("destroy", "-r", "tank/gold", check=False)
    assert p.returncode != 0 and "tank/vm" in p.stderr  # a clone depends on it
    daemon.cli("promote", "tank/vm")
    snaps = daemon.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split()
    assert snaps == ["tank/vm@v1"]
    assert daemon.prop("tank/gold", "origin") == "tank/vm@v1"
    daemon.cli("destroy", "tank/gold")
    want = pattern("golden", 4 * MiB)
    want = want[: 2 * MiB] + pattern("vm", MiB) + want[3 * MiB :]
    assert read_export(daemon.uri("tank/vm"), 4 * MiB) == want
    assert read_export(daemon.uri("tank/vm@v1"), 4 * MiB) == pattern("golden", 4 * MiB)
    daemon.restart()
    assert read_export(daemon.uri("tank/vm"), 4 * MiB) == want
    daemon.cli("destroy", "-r", "tank/vm")
    assert allocated(daemon) == 0
