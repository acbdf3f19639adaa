"""One owner per pool (decision 0010): the state directory's lock, owners in
the labels, import refused while another daemon holds the pool, the MMP
activity check behind `import -f`, daemons racing for one pool, and the fence
that stops a daemon whose pool was taken over. Everything through the real
binary; two hosts are played by two CISTERN_HOSTID values."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time

import nbd
import pytest

from conftest import Daemon, cistern_bin, popen
from helpers import MiB, connected, pattern, wait_until

# Short MMP timings keep the suite fast: claim 0.2 s, forced-import watch 1 s,
# owner lease 0.6 s. The default (1 s) logic is covered by the Rust tests.
INTERVAL_MS = 200
HOST_A = "00000000000000a1"
HOST_B = "00000000000000b2"


def env(host: str | None = None) -> dict:
    e = {"CISTERN_MMP_INTERVAL_MS": str(INTERVAL_MS)}
    if host:
        e["CISTERN_HOSTID"] = host
    return e


def first_pool(daemon, disks):
    daemon.cli("pool", "create", "-s", "1G", "tank", "mirror", disks / "d0", disks / "d1")
    daemon.cli("create", "-V", "64M", "-o", "volblocksize=4K", "tank/vol0")


def write_flushed(uri: str, offset: int, data: bytes):
    with connected(uri) as h:
        h.pwrite(data, offset)
        h.flush()


def read(uri: str, offset: int, n: int) -> bytes:
    with connected(uri) as h:
        return h.pread(n, offset)


def pools(daemon) -> list[str]:
    return [p["name"] for p in daemon.cli_json("pool", "list")]


def test_second_daemon_on_one_state_dir_exits_naming_the_holder(make_daemon, disks, tmp_path):
    a = make_daemon("a", env=env())
    first_pool(a, disks)
    second = Daemon(a.state_dir, tmp_path / "second.log", env=env())
    second.start(wait=False)
    try:
        rc = second.proc.wait(timeout=30)
    finally:
        if second.alive():
            second.kill9()
    log = second.log_text()
    assert rc != 0
    assert f"state directory {a.state_dir}" in log and f"in use by another cistern daemon (pid {a.pid})" in log, log
    # The first daemon never noticed.
    assert pools(a) == ["tank"]
    write_flushed(a.uri("tank/vol0"), 0, b"x" * 4096)


def test_labels_say_who_holds_the_pool_and_create_calls_it_active(make_daemon, disks):
    a = make_daemon("a", env=env())
    first_pool(a, disks)
    b = make_daemon("b", env=env())
    for force in ([], ["-f"]):
        p = b.cli("pool", "create", *force, "other", "mirror", disks / "d0", disks / "d1", check=False)
        assert p.returncode != 0
        assert "is part of active pool 'tank'" in p.stderr, p.stderr
        assert "exported" not in p.stderr, p.stderr
        assert f"pid {a.pid}" in p.stderr, p.stderr
    # Not offered for import either way, and refused by name.
    p = b.cli("pool", "import", "-d", disks, "tank", check=False)
    assert p.returncode != 0
    host = open("/proc/sys/kernel/hostname").read().strip()
    assert (
        f"cannot import 'tank': pool may be in use from another system (host {host}, pid {a.pid}), use -f to import anyway"
        in p.stderr
    ), p.stderr
    # Exported: the label says EXPORTED and the pool moves without -f.
    a.cli("pool", "export", "tank")
    p = b.cli("pool", "create", "other", "mirror", disks / "d0", disks / "d1", check=False)
    assert "is part of exported pool 'tank'" in p.stderr, p.stderr
    b.cli("pool", "import", "-d", disks, "tank")
    assert pools(b) == ["tank"]


def test_forced_import_waits_for_a_silent_owner(make_daemon, disks):
    a = make_daemon("a", env=env(HOST_A))
    first_pool(a, disks)
    uri_a = a.uri("tank/vol0")
    acked = pattern("a-before", 1 * MiB)
    write_flushed(uri_a, 0, acked)
    b = make_daemon("b", env=env(HOST_B))
    # Another host holds it: refused without -f...
    p = b.cli("pool", "import", "-d", disks, "tank", check=False)
    assert "pool may be in use from another system (host" in p.stderr and f"pid {a.pid}" in p.stderr, p.stderr
    # ...and with -f while A is alive and writing: its MMP sequence advances.
    with connected(uri_a) as h:
        proc = b.cli("pool", "import", "-f", "-d", disks, "tank", check=False, timeout=60)
        for i in range(8):
            h.pwrite(pattern(f"a-{i}", 4096), 2 * MiB + i * 4096)
            h.flush()
    assert proc.returncode != 0
    assert re.search(r"cannot import 'tank': pool is active on host \S+ \(pid %d\): its MMP sequence advanced" % a.pid, proc.stderr), proc.stderr
    assert pools(b) == []
    assert "forced import: watching the MMP slots" in b.log_text()
    # A dies: another host cannot know, so -f is still needed, and waits (1 s here).
    a.kill9()
    p = b.cli("pool", "import", "-d", disks, "tank", check=False)
    assert "use -f to import anyway" in p.stderr, p.stderr
    t0 = time.monotonic()
    b.cli("pool", "import", "-f", "-d", disks, "tank")
    assert time.monotonic() - t0 >= 5 * INTERVAL_MS / 1000
    uri_b = b.uri("tank/vol0")
    assert read(uri_b, 0, len(acked)) == acked
    for i in range(8):
        assert read(uri_b, 2 * MiB + i * 4096, 4096) == pattern(f"a-{i}", 4096)
    # B now owns it: A restarted on its old state dir refuses to import it.
    a.start()
    assert pools(a) == []
    assert "pool may be in use from another system" in a.log_text()


def test_owner_that_was_taken_over_stops_writing(make_daemon, disks):
    """A stalled owner (SIGSTOP) whose pool was taken with -f wakes up fenced:
    its FLUSH fails and it overwrites nothing of the new owner's."""
    a = make_daemon("a", env=env(HOST_A))
    first_pool(a, disks)
    uri_a = a.uri("tank/vol0")
    write_flushed(uri_a, 0, pattern("a", 64 * 1024))
    b = make_daemon("b", env=env(HOST_B))
    h = nbd.NBD()
    h.connect_uri(uri_a)
    try:
        os.kill(a.pid, signal.SIGSTOP)
        try:
            b.cli("pool", "import", "-f", "-d", disks, "tank", timeout=60)
            uri_b = b.uri("tank/vol0")
            mine = pattern("b", 4 * MiB)
            write_flushed(uri_b, 0, mine)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        # The loser is never acknowledged: its FLUSH fails, and once it has
        # noticed the takeover it takes no write at all.
        with pytest.raises(nbd.Error):
            h.pwrite(pattern("stale", 4 * MiB), 0)
            h.flush()
        wait_until(lambda: "taken over by host" in a.log_text(), 10, what="fence logged")
        with pytest.raises(nbd.Error):
            h.pwrite(pattern("stale", 4096), 0)
    finally:
        try:
            h.shutdown()
        except nbd.Error:
            pass
    wait_until(lambda: "taken over by host" in a.log_text(), 10, what="fence logged")
    assert "this daemon stops writing the pool" in a.log_text()
    # Give A's txg thread every chance to write; B's data stays intact.
    time.sleep(1.5)
    assert read(uri_b, 0, len(mine)) == mine
    # SIGTERM: A shuts down cleanly without touching the pool.
    assert a.stop() == 0
    assert "closed without a final commit: the pool was taken over" in a.log_text()
    assert read(uri_b, 0, len(mine)) == mine
    b.kill9()
    b.start()
    assert read(b.uri("tank/vol0"), 0, len(mine)) == mine
    p = b.cli("pool", "scrub", "-w", "tank", check=False, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("kill", ["winner", "loser"])
def test_daemons_racing_for_a_pool_exactly_one_wins(make_daemon, disks, tmp_path, kill):
    """Two daemons (other state dirs) start at once, both with the pool in
    their cache file: one serves it, the other logs why not; a writer on the
    loser is never acknowledged; the winner's acknowledged data survive kill -9
    of either."""
    seed = make_daemon("seed", env=env())
    first_pool(seed, disks)
    seed.stop()
    rounds = 3
    for r in range(rounds):
        racers = [make_daemon(f"r{r}-{i}", env=env(), start=False) for i in range(2)]
        for d in racers:
            d.state_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy(seed.state_dir / "pools.json", d.state_dir / "pools.json")
        for d in racers:
            d.start(wait=False)
        for d in racers:
            d.wait_ready(60)
        serving = [d for d in racers if pools(d) == ["tank"]]
        assert len(serving) == 1, [d.log_tail(20) for d in racers]
        winner = serving[0]
        loser = next(d for d in racers if d is not winner)
        assert pools(loser) == []
        log = loser.log_text()
        assert "cannot import pool from cache file" in log and "pool may be in use from another system" in log, loser.log_tail(30)
        # The loser has nothing to write to.
        with pytest.raises(nbd.Error):
            write_flushed(loser.uri("tank/vol0"), 0, b"L" * 4096)
        data = pattern(f"round-{r}", 1 * MiB)
        write_flushed(winner.uri("tank/vol0"), r * MiB, data)
        if kill == "winner":
            winner.kill9()
            # Same host, the holder's pid is dead: no -f needed.
            loser.cli("pool", "import", "-d", disks, "tank")
            survivor = loser
        else:
            loser.kill9()
            survivor = winner
        for i in range(r + 1):
            assert read(survivor.uri("tank/vol0"), i * MiB, MiB) == pattern(f"round-{i}", MiB)
        survivor.stop()
        if survivor.alive():
            survivor.kill9()
        # The next round's racers start from the survivor's cache.
        shutil.copy(survivor.state_dir / "pools.json", seed.state_dir / "pools.json")


def test_kill9_restart_on_the_same_state_dir_imports_without_force(make_daemon, disks):
    a = make_daemon("a", env=env())
    first_pool(a, disks)
    data = pattern("k9", 256 * 1024)
    write_flushed(a.uri("tank/vol0"), 0, data)
    old = a.pid
    a.kill9()
    a.start()
    assert pools(a) == ["tank"]
    assert read(a.uri("tank/vol0"), 0, len(data)) == data
    assert "pool may be in use" not in a.log_text()
    assert a.pid != old


def test_two_imports_at_once_exactly_one_wins(make_daemon, disks):
    seed = make_daemon("seed", env=env())
    first_pool(seed, disks)
    seed.cli("pool", "export", "tank")
    for r in range(3):
        racers = [make_daemon(f"i{r}-{i}", env=env()) for i in range(2)]
        procs = [popen_cli(d, "pool", "import", "-d", disks, "tank") for d in racers]
        results = [p.communicate(timeout=60) + (p.returncode,) for p in procs]
        ok = [d for d, (_, _, rc) in zip(racers, results) if rc == 0]
        assert len(ok) == 1, results
        for _, err, rc in results:
            if rc != 0:
                assert "pool may be in use from another system" in err, err
        assert [pools(d) for d in racers].count(["tank"]) == 1
        winner = ok[0]
        write_flushed(winner.uri("tank/vol0"), r * MiB, pattern(f"imp-{r}", MiB))
        winner.cli("pool", "export", "tank")
        for d in racers:
            d.stop()
    seed.cli("pool", "import", "-d", disks, "tank")
    for r in range(3):
        assert read(seed.uri("tank/vol0"), r * MiB, MiB) == pattern(f"imp-{r}", MiB)


def popen_cli(daemon, *args):
    return popen(
        [cistern_bin(), *args],
        env=daemon.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
