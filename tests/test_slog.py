"""Separate intent-log devices (SLOG, decision 0030) and `pool iostat`.

The crash test under a FLUSH load with a log device (single and mirror) is
tests/test_crash.py::test_kill9_under_flush_fua_load[log*]."""

from __future__ import annotations


from helpers import connected, pattern

BS = 4096
# Long txgs: acknowledged writes live only in the log (and memory) until a
# commit, so what survives kill -9 came from the log device.
SLOW_TXG = "[engine]\ntxg_timeout_secs = 120\n"


def write_flushed(d, vol: str, seed: str, blocks: int):
    with connected(d.uri(vol)) as h:
        for i in range(blocks):
            h.pwrite(pattern(f"{seed}-{i}", BS), i * BS)
            h.flush()


def check(d, vol: str, seed: str, blocks: int):
    with connected(d.uri(vol)) as h:
        for i in range(blocks):
            assert h.pread(BS, i * BS) == pattern(f"{seed}-{i}", BS), f"block {i} of {seed} lost"


def iostat_api(d, pool: str) -> dict:
    return d.api("GET", f"/v1/pools/{pool}/iostat")


def pool_status(d, pool: str) -> dict:
    return d.cli_json("pool", "status", pool)["pools"][pool]


def log_write_ops(d, pool: str) -> int:
    return sum(dev["write_ops"] for g in iostat_api(d, pool)["logs"] for dev in g["devices"])


def test_log_mirror_takes_the_flushes_and_replays_after_kill9(make_daemon, disks):
    d = make_daemon(config=SLOW_TXG)
    d.cli("pool", "create", "-s", "256M", "tank", disks / "d0")
    d.cli("create", "-V", "16M", "tank/v")
    d.cli("pool", "add", "-s", "64M", "tank", "log", "mirror", disks / "l0", disks / "l1")
    status = d.cli("pool", "status", "tank").stdout
    assert "logs" in status and "mirror-1" in status and str(disks / "l1") in status, status
    js = pool_status(d, "tank")
    assert js["logs"][0]["kind"] == "log_mirror"
    assert [x["state"] for x in js["logs"][0]["devices"]] == ["ONLINE", "ONLINE"]
    before = log_write_ops(d, "tank")
    write_flushed(d, "tank/v", "a", 40)
    # One connection, one FLUSH after each write: each costs one log write per log device.
    assert log_write_ops(d, "tank") - before >= 2 * 40
    st = iostat_api(d, "tank")
    assert st["log_flushes"] >= 40 and st["log_records"] >= 40
    d.kill9()
    d.start()
    check(d, "tank/v", "a", 40)
    assert "logs" in d.cli("pool", "status", "tank").stdout


def test_create_with_log_and_remove_it_with_records_in_it(make_daemon, disks):
    d = make_daemon(config=SLOW_TXG)
    d.cli("pool", "create", "-s", "256M", "tank", disks / "d0", "log", disks / "l0")
    assert str(disks / "l0") in d.cli("pool", "status", "tank").stdout
    d.cli("create", "-V", "16M", "tank/v")
    # Acknowledged, on the log device only (no txg for 120 s).
    write_flushed(d, "tank/v", "a", 32)
    d.cli("pool", "remove", "tank", disks / "l0")
    js = pool_status(d, "tank")
    assert js["logs"] == [], js
    check(d, "tank/v", "a", 32)
    # The log is back on the pool's devices: sync writes still survive kill -9.
    write_flushed(d, "tank/v", "b", 8)
    d.kill9()
    d.start()
    check(d, "tank/v", "b", 8)
    with connected(d.uri("tank/v")) as h:
        for i in range(8, 32):
            assert h.pread(BS, i * BS) == pattern(f"a-{i}", BS)
    # The removed device is no longer part of the pool: it can make another one.
    d.cli("pool", "create", "tank2", disks / "l0")


def test_import_refuses_a_missing_log_device_unless_m(make_daemon, disks):
    d = make_daemon(config=SLOW_TXG)
    d.cli("pool", "create", "-s", "256M", "tank", disks / "d0", "log", disks / "l0")
    d.cli("create", "-V", "16M", "tank/v")
    write_flushed(d, "tank/v", "a", 4)
    d.kill9()
    (disks / "l0").rename(disks.parent / "l0.away")
    d.start()
    # The cached import refused it: its acknowledged writes are on the missing device.
    assert "tank" not in d.cli("pool", "list", "-H").stdout
    r = d.cli("pool", "import", "-d", disks, "tank", check=False)
    assert r.returncode != 0
    assert "log device is missing" in r.stderr + r.stdout and "-m" in r.stderr + r.stdout, r
    assert "tank" not in d.cli("pool", "list", "-H").stdout
    d.cli("pool", "import", "-m", "-d", disks, "tank")
    js = pool_status(d, "tank")
    assert js["logs"][0]["devices"][0]["state"] == "UNAVAIL", js
    guid = js["logs"][0]["devices"][0]["guid"]
    # Writes go on with the log on the pool's devices; the dead log is removed.
    write_flushed(d, "tank/v", "b", 4)
    d.cli("pool", "remove", "tank", str(guid))
    assert pool_status(d, "tank")["logs"] == []
    d.kill9()
    d.start()
    check(d, "tank/v", "b", 4)


def test_cleanly_exported_pool_imports_without_its_log_device(make_daemon, disks):
    d = make_daemon(config=SLOW_TXG)
    d.cli("pool", "create", "-s", "256M", "tank", disks / "d0", "log", disks / "l0")
    d.cli("create", "-V", "16M", "tank/v")
    write_flushed(d, "tank/v", "a", 4)
    d.cli("pool", "export", "tank")
    (disks / "l0").rename(disks.parent / "l0.away")
    d.cli("pool", "import", "-d", disks, "tank")
    check(d, "tank/v", "a", 4)


def test_iostat_output(make_daemon, disks):
    d = make_daemon()
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1",
          "log", disks / "l0")
    d.cli("create", "-V", "16M", "tank/v")
    rows = [r.split("\t") for r in d.cli("pool", "iostat", "-H", "-p", "tank").stdout.splitlines()]
    assert len(rows) == 1 and rows[0][0] == "tank" and len(rows[0]) == 7, rows
    assert all(f.isdigit() for f in rows[0][1:]), rows
    out = d.cli("pool", "iostat", "-v", "-H", "-p", "tank").stdout
    names = [r.split("\t")[0].strip() for r in out.splitlines()]
    for want in ["tank", "mirror-0", str(disks / "d0"), str(disks / "d1"), "logs", str(disks / "l0")]:
        assert want in names, out
    lat = d.cli("pool", "iostat", "-l", "-H", "-p", "tank").stdout.splitlines()
    # disk_wait read and write, and the pool's sync_wait
    assert len(lat[0].split("\t")) == 10, lat
    human = d.cli("pool", "iostat", "-v", "tank").stdout
    assert "capacity" in human and "operations" in human and "logs" in human, human
    before = iostat_api(d, "tank")
    write_flushed(d, "tank/v", "a", 10)
    after = iostat_api(d, "tank")
    assert log_write_ops(d, "tank") >= 10
    assert after["log_flushes"] - before["log_flushes"] >= 10
    # each of them counted its wait for the log (sync_wait)
    assert sum(after["log_wait_hist"]) - sum(before["log_wait_hist"]) >= 10, (before, after)
    assert after["log_wait_ns"] > before["log_wait_ns"]
    assert after["timestamp_ms"] >= before["timestamp_ms"]
    # Two reports one interval apart: the second one shows the period's writes.
    out = d.cli("pool", "iostat", "-v", "-H", "-p", "tank", "0.5", "2").stdout.splitlines()
    assert len(out) == 2 * len(names), out
    hist = d.cli("pool", "iostat", "-w", "tank").stdout
    assert "disk_wait" in hist and ("us" in hist or "ms" in hist), hist
    assert "sync_wait" in hist, hist
    lat = d.cli("pool", "iostat", "-l", "-H", "-p", "tank").stdout.splitlines()[0].split("\t")
    assert lat[9].isdigit() and int(lat[9]) > 0, lat
    metrics = d.metrics()
    assert f'cistern_vdev_write_ops_total{{pool="tank",device="{disks / "l0"}",class="log"}}' in metrics
    assert "cistern_pool_log_syncs_total" in metrics and "cistern_pool_log_flushes_total" in metrics
    assert "cistern_pool_log_wait_seconds_total" in metrics
    bad = d.cli("pool", "iostat", "tank", "-1", check=False)
    assert bad.returncode != 0


def test_stale_owner_never_writes_the_new_owners_log_device(make_daemon, disks):
    """Takeover with a log device: the new owner's acknowledged writes live
    only on the log device (no txg for 120 s). The old owner, stopped during
    the takeover, wakes and tries to FLUSH; whatever it does must not touch
    that log, so kill -9 of the new owner loses none of its writes."""
    import os
    import signal

    import nbd
    import pytest

    mmp = {"CISTERN_MMP_INTERVAL_MS": "200"}
    a = make_daemon("a", config=SLOW_TXG, env={**mmp, "CISTERN_HOSTID": "00000000000000a1"})
    a.cli("pool", "create", "-s", "256M", "tank", disks / "d0", "log", disks / "l0")
    a.cli("create", "-V", "16M", "tank/v")
    write_flushed(a, "tank/v", "a", 8)
    b = make_daemon("b", config=SLOW_TXG, env={**mmp, "CISTERN_HOSTID": "00000000000000b2"})
    h = nbd.NBD()
    h.connect_uri(a.uri("tank/v"))
    try:
        os.kill(a.pid, signal.SIGSTOP)
        try:
            b.cli("pool", "import", "-f", "-d", disks, "tank", timeout=60)
            write_flushed(b, "tank/v", "b", 32)
        finally:
            os.kill(a.pid, signal.SIGCONT)
        # The old owner is never acknowledged, however many FLUSHes it is sent.
        for i in range(16):
            with pytest.raises(nbd.Error):
                h.pwrite(pattern(f"stale-{i}", BS), i * BS)
                h.flush()
    finally:
        try:
            h.shutdown()
        except nbd.Error:
            pass
    b.kill9()
    b.start()
    check(b, "tank/v", "b", 32)
    a.kill9()
