"""The zpool/zfs-style CLI against a running daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import cistern_bin, free_ports, port_open, run
from helpers import MiB, connected, nbdinfo_json, parse_get, pattern


def _names(obj) -> list[str]:
    """Names in a --json answer: a list of objects with "name" (or a dict
    holding such a list, or keyed by name)."""
    if isinstance(obj, list):
        return [o["name"] if isinstance(o, dict) and "name" in o
                else (o.get("summary", {}).get("name") if isinstance(o, dict) else o) for o in obj]
    if isinstance(obj, dict):
        for v in obj.values():
            if isinstance(v, list):
                return _names(v)
        return list(obj)
    raise AssertionError(f"unexpected JSON: {obj!r}")


def _first_col(out: str) -> list[str]:
    return [l.split("\t")[0] for l in out.splitlines() if l.strip()]


def _fails(p, *patterns, code=None):
    msg = p.stdout + p.stderr
    assert p.returncode != 0, f"expected failure, got exit 0: {msg}"
    if code is not None:
        assert p.returncode == code, f"exit {p.returncode}, expected {code}: {msg}"
    assert "panicked" not in msg, msg
    for pat in patterns:
        assert re.search(pat, msg, re.I), f"error message lacks /{pat}/: {msg!r}"
    return msg


# ------------------------------------------------------------------ daemon / connection


def test_cli_without_daemon_says_so(tmp_path):
    (port,) = free_ports(1)
    env = dict(os.environ, CISTERN_API=f"http://127.0.0.1:{port}")
    p = run([cistern_bin(), "pool", "list"], check=False, env=env)
    msg = _fails(p, r"127\.0\.0\.1:%d" % port, code=1)
    assert re.search(r"daemon|connect|running|refused", msg, re.I), msg
    # --api beats the environment.
    p = run([cistern_bin(), "--api", f"http://127.0.0.1:{port}", "list"], check=False)
    _fails(p, r"127\.0\.0\.1:%d" % port)


def test_version_and_help():
    p = run([cistern_bin(), "--version"])
    assert re.search(r"\d+\.\d+\.\d+", p.stdout)
    p = run([cistern_bin(), "--help"])
    for sub in ("serve", "quickstart", "pool", "create", "list", "get", "set", "destroy"):
        assert sub in p.stdout, f"`{sub}` missing from --help"


def test_serve_fails_cleanly_on_a_busy_port(daemon, tmp_path):
    # The NBD port is taken by the running daemon: a second one must fail, not hang.
    p = run([cistern_bin(), "serve", "--state-dir", tmp_path / "other", "--nbd", daemon.nbd_addr,
             "--api", f"127.0.0.1:{free_ports(1)[0]}"], check=False, timeout=60)
    _fails(p, str(daemon.nbd_port))


def test_sigterm_as_soon_as_a_port_opens_shuts_down_cleanly(tmp_path):
    # A service manager may stop the daemon right after starting it. Once a
    # port is open the signal is the daemon's: it finishes starting, then
    # shuts down cleanly (exit 0), never ended by SIGTERM's default action.
    nbd_port, api_port = free_ports(2)
    log = tmp_path / "serve.log"
    with open(log, "wb") as f:
        p = subprocess.Popen([cistern_bin(), "serve", "--state-dir", tmp_path / "state",
                              "--nbd", f"127.0.0.1:{nbd_port}", "--api", f"127.0.0.1:{api_port}"],
                             stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not port_open(nbd_port):
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.001)
        p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert rc == 0, (rc, log.read_text())
    assert "SIGTERM: shutting down" in log.read_text()


# ------------------------------------------------------------------ pools


def test_pool_lifecycle(daemon, disks, tmp_path):
    d = daemon
    d.cli("pool", "create", "-s", "1G", "tank", "mirror", disks / "a0", disks / "a1")
    d.cli("pool", "create", "-s", "512M", "scratch", disks / "s0", disks / "s1")  # a stripe
    assert (disks / "a0").stat().st_size == 1 << 30
    allocated = (disks / "a0").stat().st_blocks * 512
    assert allocated < (1 << 30) // 4, f"device files should be sparse ({allocated} bytes allocated)"
    assert set(_first_col(d.cli("pool", "list", "-H").stdout)) == {"tank", "scratch"}
    assert set(_names(d.cli_json("pool", "list"))) == {"tank", "scratch"}
    human = d.cli("pool", "list").stdout
    assert re.search(r"^NAME\s", human), human
    st = d.cli("pool", "status", "tank").stdout
    assert "mirror" in st and "ONLINE" in st and str(disks / "a0") in st and str(disks / "a1") in st, st
    st_json = d.cli_json("pool", "status", "scratch")
    assert str(disks / "s0") in str(st_json) and str(disks / "s1") in str(st_json)
    # Duplicates and bad specs are refused.
    _fails(d.cli("pool", "create", "-s", "1G", "tank", disks / "x0", check=False), "tank", code=1)
    _fails(d.cli("pool", "create", "bad", tmp_path / "does-not-exist", check=False), "does-not-exist")
    _fails(d.cli("pool", "create", "-s", "1G", "inuse", disks / "a0", check=False), "a0")  # device of tank
    _fails(d.cli("pool", "status", "nope", check=False), "nope", code=1)
    # A volume, some data, then export / import.
    d.cli("create", "-V", "64M", "tank/v")
    with connected(d.uri("tank/v")) as h:
        h.pwrite(pattern(1, 1 * MiB), 3 * MiB)
    d.cli("pool", "export", "tank")
    assert _first_col(d.cli("pool", "list", "-H").stdout) == ["scratch"]
    assert "tank/v" not in [e["export-name"] for e in nbdinfo_json(d.uri(), "--list")["exports"]]
    _fails(d.cli("get", "all", "tank/v", check=False), "tank")
    found = d.cli("pool", "import", "-d", disks).stdout
    assert "tank" in found and "scratch" not in found, found
    d.cli("pool", "import", "-d", disks, "tank")
    assert set(_first_col(d.cli("pool", "list", "-H").stdout)) == {"tank", "scratch"}
    with connected(d.uri("tank/v")) as h:
        assert h.pread(1 * MiB, 3 * MiB) == pattern(1, 1 * MiB)
    # Pools come back after a daemon restart.
    d.restart()
    assert set(_first_col(d.cli("pool", "list", "-H").stdout)) == {"tank", "scratch"}
    # Destroy: gone, and not importable any more.
    d.cli("pool", "destroy", "scratch")
    assert _first_col(d.cli("pool", "list", "-H").stdout) == ["tank"]
    assert "scratch" not in d.cli("pool", "import", "-d", disks).stdout
    _fails(d.cli("pool", "import", "-d", disks, "scratch", check=False), "scratch")
    _fails(d.cli("pool", "destroy", "scratch", check=False), "scratch", code=1)


def test_pool_size_and_health_columns(daemon, disks):
    daemon.cli("pool", "create", "-s", "1G", "tank", "mirror", disks / "a0", disks / "a1")
    (pool,) = daemon.cli_json("pool", "list")
    size = pool.get("size") or pool.get("summary", {}).get("size")
    assert 0.75 * (1 << 30) <= size <= 1 << 30, pool  # a mirror of two 1G devices holds ~1G
    assert (pool.get("health") or pool.get("summary", {}).get("health")) == "ONLINE"


# ------------------------------------------------------------------ datasets


def test_dataset_lifecycle(daemon, pool):
    d = daemon
    d.cli("create", "-V", "1G", "tank/a")
    d.cli("create", "-V", "100M", "-o", "volblocksize=4K", "-o", "compression=zstd", "tank/b")
    names = _first_col(d.cli("list", "-H", "-t", "volume").stdout)
    assert names == ["tank/a", "tank/b"], names
    assert set(_names(d.cli_json("list", "-t", "volume"))) == {"tank/a", "tank/b"}
    assert "tank" in _first_col(d.cli("list", "-H", "-t", "all").stdout)
    cols = d.cli("list", "-H", "-p", "-o", "name,volsize", "-t", "volume").stdout
    assert cols.splitlines() == [f"tank/a\t{1 << 30}", f"tank/b\t{100 * MiB}"], cols
    pa, pb = d.props("tank/a"), d.props("tank/b")
    for prop in ("volsize", "used", "logicalused", "referenced", "available", "compressratio",
                 "compression", "checksum", "volblocksize"):
        assert prop in pa, f"`get all` lacks {prop}: {sorted(pa)}"
    assert int(pa["volsize"]) == 1 << 30
    assert int(pa["volblocksize"]) == 16384
    assert pa["checksum"] in ("blake3", "on")
    assert int(pb["volblocksize"]) == 4096 and pb["compression"] == "zstd"
    # -H without -p: human values, 4 tab-separated columns like zfs get.
    line = d.cli("get", "-H", "volsize", "tank/a").stdout.strip()
    assert line.split("\t")[:3] == ["tank/a", "volsize", "1G"], line
    human = d.cli("get", "all", "tank/a").stdout
    assert re.search(r"^NAME\s+PROPERTY\s+VALUE\s+SOURCE", human), human
    # set, then get shows the new value and its source.
    d.cli("set", "compression=gzip-3", "tank/a")
    line = d.cli("get", "-H", "compression", "tank/a").stdout.strip().split("\t")
    assert line[2] == "gzip-3" and line[3] == "local", line
    d.cli("destroy", "tank/b")
    assert _first_col(d.cli("list", "-H", "-t", "volume").stdout) == ["tank/a"]
    _fails(d.cli("destroy", "tank/b", check=False), "tank/b", code=1)


def test_growing_volsize_is_seen_by_nbd(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/g")
    with connected(d.uri("tank/g")) as h:
        h.pwrite(pattern(2, 64 * 1024), 64 * MiB - 64 * 1024)
    d.cli("set", "volsize=256M", "tank/g")
    assert int(d.prop("tank/g", "volsize")) == 256 * MiB
    assert nbdinfo_json(d.uri("tank/g"))["exports"][0]["export-size"] == 256 * MiB
    with connected(d.uri("tank/g")) as h:
        assert h.get_size() == 256 * MiB
        assert h.pread(64 * 1024, 64 * MiB - 64 * 1024) == pattern(2, 64 * 1024)
        assert h.pread(1 * MiB, 100 * MiB) == bytes(1 * MiB)
        h.pwrite(b"e" * 4096, 256 * MiB - 4096)
    d.restart()
    assert int(d.prop("tank/g", "volsize")) == 256 * MiB
    with connected(d.uri("tank/g")) as h:
        assert h.pread(4096, 256 * MiB - 4096) == b"e" * 4096


def test_shrinking_volsize_is_refused(cistern, daemon, pool):
    cistern("create", "-V", "256M", "tank/s")
    _fails(cistern("set", "volsize=128M", "tank/s", check=False), r"shrink|smaller|grow|reduc")
    assert int(daemon.prop("tank/s", "volsize")) == 256 * MiB


@pytest.mark.parametrize("size", ["12Q", "abc", "-1G", "1.5.3G", ""])
def test_bad_size_is_refused(daemon, pool, size):
    p = daemon.cli("create", f"-V={size}" if size.startswith("-") else "-V", *([] if size.startswith("-") else [size]),
                   "tank/bad", check=False)
    _fails(p, re.escape(repr(size)[1:-1]) if size else r"size")
    assert "tank/bad" not in _first_col(daemon.cli("list", "-H", "-t", "all").stdout)


def test_zero_and_unaligned_sizes(daemon, pool):
    _fails(daemon.cli("create", "-V", "0", "tank/z", check=False), r"size|zero|0")
    # A size that is not a multiple of volblocksize is refused or rounded up, never truncated.
    p = daemon.cli("create", "-V", "1000000", "tank/odd", check=False)
    if p.returncode == 0:
        assert int(daemon.prop("tank/odd", "volsize")) >= 1000000


@pytest.mark.parametrize("args,pattern_", [
    (["-o", "compression=bogus"], "bogus"),
    (["-o", "compression=zstd-20"], "zstd-20"),
    (["-o", "compression=gzip-0"], "gzip-0"),
    (["-o", "volblocksize=3K"], "volblocksize"),
    (["-o", "volblocksize=2M"], "volblocksize"),
    (["-o", "nosuchprop=1"], "nosuchprop"),
    (["-o", "checksum=crc99"], "crc99"),
    (["-o", "used=5"], "used"),
])
def test_bad_property_on_create(daemon, pool, args, pattern_):
    p = daemon.cli("create", "-V", "64M", *args, "tank/bp", check=False)
    _fails(p, pattern_)
    assert "tank/bp" not in _first_col(daemon.cli("list", "-H", "-t", "all").stdout)


def test_bad_property_on_set(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/v")
    _fails(d.cli("set", "compression=bogus", "tank/v", check=False), "bogus")
    _fails(d.cli("set", "nosuchprop=1", "tank/v", check=False), "nosuchprop")
    _fails(d.cli("set", "used=5", "tank/v", check=False), r"used")  # read-only statistic
    _fails(d.cli("set", "volblocksize=4K", "tank/v", check=False), r"volblocksize")  # fixed at creation
    _fails(d.cli("set", "compression", "tank/v", check=False), r"compression|=")
    assert d.prop("tank/v", "compression") != "bogus"


def test_unknown_dataset_and_pool(daemon, pool):
    d = daemon
    for args in (["get", "all", "tank/nope"], ["set", "compression=lz4", "tank/nope"],
                 ["destroy", "tank/nope"], ["get", "volsize", "nopool/x"]):
        _fails(d.cli(*args, check=False), r"nope|nopool", code=1)
    _fails(d.cli("create", "-V", "64M", "nopool/x", check=False), "nopool", code=1)
    _fails(d.cli("create", "-V", "64M", "tank/a/b/../c", check=False), r"name|invalid|tank/a")
    d.cli("create", "-V", "64M", "tank/dup")
    _fails(d.cli("create", "-V", "64M", "tank/dup", check=False), r"tank/dup.*exist|exist.*tank/dup", code=1)


def test_destroy_pool_with_volumes_and_open_connection(daemon, pool, disks):
    d = daemon
    d.cli("create", "-V", "64M", "tank/v")
    with connected(d.uri("tank/v")) as h:
        h.pwrite(b"x" * 4096, 0)
        # Destroying a volume someone has open: refused as busy, or the
        # connection's later requests fail. Either way no crash.
        p = d.cli("destroy", "tank/v", check=False)
        if p.returncode != 0:
            _fails(p, r"busy|open|in use")
    d.cli("pool", "destroy", "tank")
    assert _first_col(d.cli("pool", "list", "-H").stdout) == []
    assert d.alive()


def test_quickstart_creates_pool_and_volume(tmp_path):
    nbd_port, api_port, s3_port, nfs_port = free_ports(4)
    from conftest import Daemon, popen
    import subprocess
    import time
    state = tmp_path / "qs"
    log = open(tmp_path / "qs.log", "wb")
    p = popen([cistern_bin(), "quickstart", "--state-dir", state, "--nbd", f"127.0.0.1:{nbd_port}",
               "--api", f"127.0.0.1:{api_port}", "--s3", f"127.0.0.1:{s3_port}",
               "--nfs", f"127.0.0.1:{nfs_port}"], stdout=log, stderr=subprocess.STDOUT,
              stdin=subprocess.DEVNULL)
    env = dict(os.environ, CISTERN_API=f"http://127.0.0.1:{api_port}")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert p.poll() is None, (tmp_path / "qs.log").read_text()
            # The announcement is printed after the API answers: wait for its key lines too.
            if "S3 secret access key" in (tmp_path / "qs.log").read_text() and run(
                    [cistern_bin(), "list", "-H", "-t", "volume"], check=False, env=env).stdout.startswith("tank/vol0"):
                break
            time.sleep(0.2)
        out = (tmp_path / "qs.log").read_text()
        assert f"nbd://127.0.0.1:{nbd_port}/tank/vol0" in out, f"quickstart did not print the NBD URI:\n{out}"
        # The management command it prints works as printed, from here.
        manage = re.search(r"^Manage: (.+)$", out, re.M)
        assert manage, out
        r = subprocess.run(manage.group(1), shell=True, capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PATH="/usr/bin:/bin"))
        assert r.returncode == 0 and "tank/vol0" in r.stdout, (manage.group(1), r.stdout, r.stderr)
        info = nbdinfo_json(f"nbd://127.0.0.1:{nbd_port}/tank/vol0")
        assert info["exports"][0]["export-size"] == 4 << 30
        props = parse_get(run([cistern_bin(), "get", "-Hp", "all", "tank/vol0"], env=env).stdout)
        assert props["compression"] == "lz4"
        st = run([cistern_bin(), "pool", "status", "tank"], env=env).stdout
        assert "mirror" in st
        assert (state / "disks").is_dir()
        # S3: the endpoint, and a key for bucket0 printed this once.
        assert f"http://127.0.0.1:{s3_port}/bucket0" in out, out
        key = re.search(r"^S3 access key id: +(CIST\w+)$", out, re.M)
        secret = re.search(r"^S3 secret access key: +(\w{40}) ", out, re.M)
        assert key and secret, out
        users = json.loads(run([cistern_bin(), "user", "list", "--json"], env=env).stdout)
        assert users[0]["name"] == "quickstart" and users[0]["access_key"] == key.group(1)
        assert users[0]["grants"] == [{"bucket": "bucket0", "access": "rw"}]
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
    # A second quickstart on the same state dir reuses the pool (no error, no re-create).
    p = popen([cistern_bin(), "quickstart", "--state-dir", state, "--nbd", f"127.0.0.1:{nbd_port}",
               "--api", f"127.0.0.1:{api_port}", "--s3", f"127.0.0.1:{s3_port}",
               "--nfs", f"127.0.0.1:{nfs_port}"], stdout=open(tmp_path / "qs2.log", "wb"),
              stderr=subprocess.STDOUT,
              stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        ok = False
        while time.monotonic() < deadline and p.poll() is None:
            if "printed at the first start" in (tmp_path / "qs2.log").read_text() and run(
                    [cistern_bin(), "list", "-H", "-t", "volume"], check=False, env=env).stdout.startswith("tank/vol0"):
                ok = True
                break
            time.sleep(0.2)
        assert ok, (tmp_path / "qs2.log").read_text()
    finally:
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    # The second start names the endpoint again but never the secret.
    out2 = (tmp_path / "qs2.log").read_text()
    assert f"http://127.0.0.1:{s3_port}/bucket0" in out2 and "printed at the first start" in out2, out2
    assert secret.group(1) not in out2
