"""A pool that lives in an S3 bucket (issue 18, decision 0039), against a
real S3 server: versitygw on 127.0.0.1 (scripts/test.sh installs it).

Every write acknowledged by FLUSH must read back on whoever owns the pool
next; a taken-over owner is fenced and acknowledges nothing more."""

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

import helpers
from conftest import cistern_bin, free_ports, popen, port_open

GW_KEY, GW_SECRET = "testkey", "testsecret"


def _versitygw() -> str | None:
    for p in (os.environ.get("VERSITYGW"), shutil.which("versitygw"), "/work/cache/go-bin/versitygw"):
        if p and Path(p).is_file():
            return p
    return None


@pytest.fixture
def gateway(tmp_path):
    """versitygw with a posix backend; yields its port (bucket `bkt` exists)."""
    binary = _versitygw()
    if binary is None:
        assert "CI" not in os.environ, "versitygw is not installed (scripts/test.sh installs it)"
        pytest.skip("versitygw not installed")
    root = tmp_path / "gw"
    (root / "bkt").mkdir(parents=True)
    (port,) = free_ports(1)
    log = open(tmp_path / "versitygw.log", "wb")
    proc = popen(
        [binary, "--access", GW_KEY, "--secret", GW_SECRET, "--port", f"127.0.0.1:{port}", "posix", root],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    helpers.wait_until(lambda: port_open(port), 20, what="versitygw listening")
    yield port
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def bucket_config(port: int) -> str:
    return f"""
[bucket]
endpoint = "http://127.0.0.1:{port}"
region = "us-east-1"
access_key_id = "{GW_KEY}"
secret_access_key = "{GW_SECRET}"
cache_size = {1 << 30}
"""


URL = "s3://bkt/pools/tank"


def make_pool(d, url=URL):
    d.cli("pool", "create", "tank", url, timeout=120)
    d.cli("create", "-V", "256M", "tank/vol", timeout=60)


def write_flushed(uri: str, writes: list[tuple[int, bytes]]):
    """Writes each block and FLUSHes after it; returns what was acknowledged."""
    acked = []
    with helpers.connected(uri) as h:
        for off, data in writes:
            h.pwrite(data, off)
            h.flush()
            acked.append((off, data))
    return acked


def check_reads(uri: str, acked):
    final = {}
    for off, data in acked:  # a later write to the same offset wins
        final[off] = data
    with helpers.connected(uri) as h:
        for off, data in final.items():
            assert h.pread(len(data), off) == data, f"acknowledged write at {off} lost"


def blocks(seed: str, n: int, size: int = 4096, stride: int = 1 << 20):
    return [(i * stride, helpers.pattern(f"{seed}{i}", size)) for i in range(n)]


def assert_fenced(owner, late):
    """The woken old owner's write + FLUSH on `late` fails (is never
    acknowledged), and it says "fenced" in its log."""
    fenced_ack = []

    def try_late():
        try:
            late.pwrite(b"L" * 4096, 200 << 20)
            late.flush()
            fenced_ack.append(True)
        except Exception:  # noqa: BLE001 - any error is "not acknowledged"
            fenced_ack.append(False)

    t = threading.Thread(target=try_late)
    t.start()
    t.join(60)
    assert fenced_ack == [False], "the fenced owner acknowledged a FLUSH"
    helpers.wait_until(lambda: "fenced" in owner.log_text(), 30, what="fenced in the old owner's log")


def test_flushed_writes_survive_kill9_and_come_back_from_the_bucket(make_daemon, gateway):
    d = make_daemon("owner", config=bucket_config(gateway))
    make_pool(d)
    st = d.cli("pool", "status", "tank").stdout
    assert URL in st, st
    uri = d.uri("tank/vol")
    acked = write_flushed(uri, blocks("a", 16))
    # A large write goes through segment objects.
    big = helpers.pattern("big", 8 << 20)
    acked += write_flushed(uri, [(64 << 20, big)])
    d.kill9()
    # The cache is rebuilt from the bucket at every open.
    shutil.rmtree(d.state_dir / "bucket")
    d.start()
    check_reads(uri, acked)


def test_takeover_fences_a_stopped_owner_which_acknowledges_nothing_more(make_daemon, gateway):
    owner = make_daemon("owner", config=bucket_config(gateway))
    make_pool(owner)
    uri = owner.uri("tank/vol")
    acked = write_flushed(uri, blocks("a", 8))
    owner.cli("snapshot", "tank/vol@before")
    snap_data = acked[:]
    # Overwrites offset 0 after the snapshot: the clone must still show "a0".
    acked += write_flushed(uri, blocks("b", 8, stride=(1 << 20) + 8192))
    # A client connected to the owner before it stops, to try writing after.
    late = helpers.connect(uri)
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        standby = make_daemon("standby", config=bucket_config(gateway))
        t0 = time.monotonic()
        standby.cli("pool", "takeover", "tank", URL, timeout=120)
        took = time.monotonic() - t0
        print(f"takeover took {took:.1f}s")
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    # The old owner wakes up: a write + FLUSH must fail, never be acknowledged.
    assert_fenced(owner, late)
    status = owner.cli("pool", "status", "tank", check=False)
    assert "fenced" in (status.stdout + status.stderr), status.stdout
    # Everything acknowledged reads back on the new owner; the snapshot too.
    suri = standby.uri("tank/vol")
    check_reads(suri, acked)
    with helpers.connected(suri) as h:
        assert h.pread(4096, 200 << 20) != b"L" * 4096
    assert "tank/vol@before" in standby.cli("list", "-t", "snapshot").stdout
    standby.cli("clone", "tank/vol@before", "tank/before")
    check_reads(standby.uri("tank/before"), snap_data)
    # The new owner keeps serving writes.
    more = write_flushed(suri, blocks("c", 4, stride=3 << 20))
    check_reads(suri, more)
    try:
        helpers.close(late)
    except Exception:  # noqa: BLE001
        pass
    owner.kill9()
    t0 = time.monotonic()
    assert standby.stop(timeout=60) == 0
    took = time.monotonic() - t0
    assert took < 20, f"the new owner took {took:.0f}s to shut down\n{standby.log_tail(60)}"


def test_takeover_after_kill9_of_the_owner(make_daemon, gateway):
    owner = make_daemon("owner", config=bucket_config(gateway))
    make_pool(owner)
    acked = write_flushed(owner.uri("tank/vol"), blocks("k", 12))
    owner.kill9()
    standby = make_daemon("standby", config=bucket_config(gateway))
    standby.cli("pool", "takeover", "tank", URL, timeout=120)
    check_reads(standby.uri("tank/vol"), acked)
    # The killed owner restarting cannot resume: the pool is not its own any more.
    owner.start()
    assert "tank" not in owner.cli("pool", "list", "-H").stdout
    assert "owned by" in owner.log_text()


def test_two_daemons_creating_on_an_empty_bucket_exactly_one_owns_it(make_daemon, gateway):
    a = make_daemon("a", config=bucket_config(gateway))
    b = make_daemon("b", config=bucket_config(gateway))
    url = "s3://bkt/pools/race"
    procs = [
        popen(
            [cistern_bin(), "pool", "create", "tank", url],
            env=d.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for d in (a, b)
    ]
    codes = [p.wait(120) for p in procs]
    assert codes.count(0) == 1, codes
    owners = [d for d in (a, b) if "tank" in d.cli("pool", "list", "-H").stdout]
    assert len(owners) == 1


# -- warm standby (decision 0048) -------------------------------------------------


def start_standby(make_daemon, gateway, name="standby", extra=""):
    """A daemon started with `serve --standby tank URL`."""
    # Idle looks back off to 1 s (default 5 s, decision 0067): the tests wait
    # for the standby right after idle moments.
    config = bucket_config(gateway) + "standby_poll_max_ms = 1000\n" + extra
    d = make_daemon(name, config=config, start=False)
    d.serve_args = ["--standby", "tank", URL]
    d.start()
    return d


def log_claims(gw_root: Path, prefix="pools/tank"):
    """Claim records in the pool's log as versitygw stores them (kind byte at 10)."""
    logdir = gw_root / "bkt" / prefix / "log"
    return sum(1 for f in logdir.iterdir() if f.is_file() and f.read_bytes()[10:11] == b"\x01")


def log_len(gw_root: Path, prefix="pools/tank"):
    return sum(1 for f in (gw_root / "bkt" / prefix / "log").iterdir() if f.is_file())


def standby_next(d) -> int:
    for line in d.metrics().splitlines():
        if line.startswith("cistern_bucket_standby_next_record{"):
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("no standby metric")


def test_warm_standby_tails_then_takes_over_a_stopped_owner(make_daemon, gateway, tmp_path):
    gw_root = tmp_path / "gw"
    owner = make_daemon("owner", config=bucket_config(gateway))
    make_pool(owner)
    uri = owner.uri("tank/vol")
    acked = write_flushed(uri, blocks("a", 8))
    owner.cli("snapshot", "tank/vol@before")
    standby = start_standby(make_daemon, gateway)
    st = standby.cli("pool", "status", "tank").stdout
    assert "STANDBY" in st and URL in st, st
    assert 'cistern_bucket_standby{pool="tank"' in standby.metrics()
    # It follows what the owner writes after it started.
    acked += write_flushed(uri, blocks("b", 8, stride=(1 << 20) + 8192))
    helpers.wait_until(lambda: standby_next(standby) > log_len(gw_root) - 1, 30, what="the standby catching up")
    # It wrote nothing to the bucket: the only claim is the owner's.
    assert log_claims(gw_root) == 1
    late = helpers.connect(uri)
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        out = standby.cli("pool", "takeover", "tank", timeout=120).stdout
        took = time.monotonic() - t0
        print(f"warm takeover took {took:.2f}s")
        assert URL in out, out
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    assert "replayed" in standby.log_text()
    assert log_claims(gw_root) == 2
    assert_fenced(owner, late)
    suri = standby.uri("tank/vol")
    check_reads(suri, acked)
    with helpers.connected(suri) as h:
        assert h.pread(4096, 200 << 20) != b"L" * 4096
    assert "tank/vol@before" in standby.cli("list", "-t", "snapshot").stdout
    assert "ONLINE" in standby.cli("pool", "status", "tank").stdout
    assert "cistern_bucket_standby{" not in standby.metrics()
    more = write_flushed(suri, blocks("c", 4, stride=3 << 20))
    check_reads(suri, more)
    try:
        helpers.close(late)
    except Exception:  # noqa: BLE001
        pass
    owner.kill9()
    # Stopped while the gateway is still up (it goes first at teardown).
    assert standby.stop(timeout=60) == 0


def test_automatic_takeover_after_kill9_but_not_of_an_idle_or_busy_live_owner(make_daemon, gateway, tmp_path):
    # No heartbeat_ms: the owner beats every quarter of takeover_after_secs
    # (750 ms, decision 0071) and says so in the heartbeat object.
    auto = "takeover_after_secs = 3\n"
    owner = make_daemon("owner", config=bucket_config(gateway) + auto)
    make_pool(owner)
    acked = write_flushed(owner.uri("tank/vol"), blocks("k", 12))
    standby = start_standby(make_daemon, gateway, extra=auto)
    beat = (tmp_path / "gw" / "bkt" / "pools" / "tank" / "heartbeat").read_text()
    assert beat.split()[-1] == "every_ms=750", beat
    # An idle owner keeps its heartbeat object fresh: no takeover.
    time.sleep(4.5)
    assert "STANDBY" in standby.cli("pool", "status", "tank").stdout
    # A busy owner skips its beats (its log records are its liveness), for
    # longer than the takeover delay: still no takeover.
    busy = time.monotonic() + 4.5
    n = 0
    while time.monotonic() < busy:
        acked += write_flushed(owner.uri("tank/vol"), [(n * 4096, helpers.pattern(f"busy{n}", 4096))])
        n += 1
        time.sleep(0.2)
    assert "STANDBY" in standby.cli("pool", "status", "tank").stdout
    assert "tank" in owner.cli("pool", "list", "-H").stdout
    acked += write_flushed(owner.uri("tank/vol"), blocks("m", 4, stride=5 << 20))
    owner.kill9()
    helpers.wait_until(
        lambda: "ONLINE" in standby.cli("pool", "status", "tank", check=False).stdout,
        60,
        what="the automatic takeover",
    )
    helpers.wait_until(
        lambda: "took the pool over automatically" in standby.log_text(), 30, what="the takeover logged"
    )
    check_reads(standby.uri("tank/vol"), acked)
    assert standby.stop(timeout=60) == 0


def test_two_standbys_racing_to_take_over_exactly_one_owns(make_daemon, gateway, tmp_path):
    auto = "takeover_after_secs = 2\nheartbeat_ms = 300\n"
    # The owner says how often it beats (decision 0071): with the default
    # (a minute) the standbys would wait two minutes before taking over.
    owner = make_daemon("owner", config=bucket_config(gateway) + auto)
    make_pool(owner)
    acked = write_flushed(owner.uri("tank/vol"), blocks("r", 6))
    a = start_standby(make_daemon, gateway, "sa", extra=auto)
    b = start_standby(make_daemon, gateway, "sb", extra=auto)
    owner.kill9()

    def owners():
        return [d for d in (a, b) if "ONLINE" in d.cli("pool", "status", "tank", check=False).stdout]

    helpers.wait_until(lambda: len(owners()) >= 1, 60, what="one standby taking over")
    time.sleep(3)  # the loser's attempt has ended by now
    won = owners()
    assert len(won) == 1, [d.log_tail(30) for d in (a, b)]
    check_reads(won[0].uri("tank/vol"), acked)
    # The new owner writes on and stays the owner.
    more = write_flushed(won[0].uri("tank/vol"), blocks("s", 3, stride=7 << 20))
    check_reads(won[0].uri("tank/vol"), more)
    assert owners() == won
    for d in (a, b):
        assert d.stop(timeout=60) == 0


def test_lost_put_answers_never_turn_into_a_lie(make_daemon, gateway):
    from http_fault_proxy import HttpFaultProxy

    seen = {"log_puts": 0}

    def decide(method, path):
        # Every other log record's answer is lost after the object landed.
        if method == "PUT" and "/log/" in path:
            seen["log_puts"] += 1
            if seen["log_puts"] % 2 == 0:
                return "drop"
        return "pass"

    proxy = HttpFaultProxy(gateway, decide)
    try:
        cfg = bucket_config(gateway).replace(f"http://127.0.0.1:{gateway}", proxy.url)
        owner = make_daemon("owner", config=cfg)
        make_pool(owner)
        acked, failed = [], 0
        with helpers.connected(owner.uri("tank/vol")) as h:
            for off, data in blocks("p", 16, stride=(1 << 20) + 4096):
                try:
                    h.pwrite(data, off)
                    h.flush()
                    acked.append((off, data))
                except Exception:  # noqa: BLE001 - not acknowledged: allowed
                    failed += 1
                    break
        assert proxy.counts["drop"] >= 3, proxy.counts
        print(f"acknowledged {len(acked)}, failed {failed}, proxy {proxy.counts}")
        owner.kill9()
        other = make_daemon("other", config=bucket_config(gateway))
        other.cli("pool", "takeover", "tank", URL, timeout=120)
        check_reads(other.uri("tank/vol"), acked)
        assert other.stop(timeout=60) == 0
    finally:
        proxy.close()


def _no_fs():
    from test_filesystem import _why_no_fs

    return _why_no_fs()


@pytest.mark.skipif(_no_fs() is not None, reason=_no_fs() or "")
def test_ext4_on_a_bucket_pool_survives_a_warm_takeover(make_daemon, gateway, tmp_path):
    import random

    from conftest import run
    from test_filesystem import _read_tree, _write_tree, loop_mount, nbdfuse

    owner = make_daemon("owner", config=bucket_config(gateway))
    make_pool(owner)
    standby = start_standby(make_daemon, gateway)
    log = tmp_path / "nbdfuse.log"
    with nbdfuse(owner.uri("tank/vol"), tmp_path / "mnt", log) as image:
        run(["mkfs.ext4", "-q", "-F", image], timeout=300)
        with loop_mount(image, tmp_path / "fs") as fs:
            tree = _write_tree(fs, random.Random(48), 60)
        fd = os.open(image, os.O_RDWR)
        try:
            os.fsync(fd)  # FLUSH: from here the filesystem is acknowledged
        finally:
            os.close(fd)
    owner.kill9()
    standby.cli("pool", "takeover", "tank", timeout=120)
    with nbdfuse(standby.uri("tank/vol"), tmp_path / "mnt2", log) as image:
        fsck = run(["e2fsck", "-f", "-n", image], check=False, timeout=300)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr
        with loop_mount(image, tmp_path / "fs2") as fs:
            assert _read_tree(fs) == tree
    assert standby.stop(timeout=60) == 0


def _physical(d) -> int:
    out = d.cli("pool", "list", "-H", "-p", "-o", "name,physical", "tank").stdout.split()
    assert out[0] == "tank" and out[1].isdigit(), out
    return int(out[1])


def _bucket_bytes(root: Path, prefix: str) -> int:
    return sum(p.stat().st_size for p in (root / prefix).rglob("*") if p.is_file())


def test_compaction_shrinks_the_bucket_and_figures_agree(make_daemon, gateway, tmp_path):
    """Physical bytes in `pool list -p`, the API and the metric; compaction
    (decision 0049) folds the log into a checkpoint and the bucket shrinks,
    with every acknowledged write and the snapshot intact after kill -9."""
    cfg = bucket_config(gateway) + "compact_interval_secs = 1\ncompact_grace_secs = 0\n"
    d = make_daemon("owner", config=bucket_config(gateway) + "compact_interval_secs = 0\n")
    make_pool(d)
    uri = d.uri("tank/vol")
    # Many small FLUSHed writes: one inline log record each, rewritten twice.
    acked = []
    for rnd in range(3):
        acked += write_flushed(uri, blocks(f"r{rnd}", 120, stride=64 << 10))
    d.cli("snapshot", "tank/vol@s")
    snap = acked[-120:]
    acked += write_flushed(uri, blocks("late", 8, stride=3 << 20))
    gw_root = tmp_path / "gw" / "bkt"
    before = _bucket_bytes(gw_root, "pools/tank")
    helpers.wait_until(lambda: _physical(d) > 0, 30, what="a physical figure")
    # Compaction off: restart with it on (every second, no grace).
    d.stop()
    d.config_path.write_text(cfg)
    d.start()

    def bucket():
        return next(p for p in d.api("GET", "/v1/pools") if p["name"] == "tank")["bucket"]

    helpers.wait_until(lambda: bucket()["checkpoints"] >= 1 and bucket()["deleted_bytes"] > 0, 90, what="a compaction")
    # Copy-on-write leaves freed blocks live in the bucket (no TRIM at the
    # device, decision 0049): what goes is the folded log and dead segments.
    helpers.wait_until(lambda: _bucket_bytes(gw_root, "pools/tank") < before, 60, what=f"the bucket to shrink from {before}")
    after = _bucket_bytes(gw_root, "pools/tank")
    helpers.wait_until(lambda: abs(_physical(d) - _bucket_bytes(gw_root, "pools/tank")) <= (256 << 10), 30, what="pool list to agree")
    assert "cistern_pool_bucket_physical_bytes{pool=\"tank\"}" in d.metrics()
    assert "physical" in d.cli("pool", "status", "tank").stdout
    print(f"bucket bytes {before} -> {after}")
    d.kill9()
    shutil.rmtree(d.state_dir / "bucket")
    d.start()
    check_reads(d.uri("tank/vol"), acked)
    d.cli("clone", "tank/vol@s", "tank/s")
    check_reads(d.uri("tank/s"), snap)


def test_a_bucket_pool_of_an_earlier_build_still_opens(make_daemon, tmp_path):
    """A bucket as an earlier build left it (fixtures/bucket-pool-v1.tar.gz,
    made by tests/fixture_bucket_pool.py: segments, a checkpoint, then log
    records of FLUSHed writes and a kill -9) is taken over by this build with
    every acknowledged write and the snapshot, and scrubs clean."""
    fixture = Path(__file__).resolve().parent.parent / "crates/vdev/tests/fixtures/bucket-pool-v1.tar.gz"
    where = tmp_path / "bucket"
    where.mkdir()
    subprocess.run(["tar", "-xzf", str(fixture), "-C", str(where)], check=True)
    d = make_daemon()
    d.cli("pool", "takeover", "tank", f"file://{where}", timeout=120)
    at_a = bytes((i * 7) % 251 for i in range(4 << 20))
    now = at_a[: 1 << 20] + b"\xab" * 65536 + at_a[(1 << 20) + 65536 :]
    with helpers.connected(d.uri("tank/vol")) as h:
        assert h.pread(4 << 20, 0) == now
    with helpers.connected(d.uri("tank/vol@a")) as h:
        assert h.pread(4 << 20, 0) == at_a
    d.cli("pool", "scrub", "-w", "tank", timeout=120)
    st = d.cli_json("pool", "status", "tank")["pools"]["tank"]
    assert st["scan"]["errors"] == 0 and not st["data_errors"], st


def test_a_bounded_cache_reads_back_from_the_bucket_and_reports_itself(make_daemon, tmp_path):
    """`[bucket] cache_bytes` (decision 0054): a pool written past its bound
    reads back equal on a fresh cache, whose figures `pool status` and the
    metrics show, with what it holds under the bound."""
    bound = 8 << 20
    d = make_daemon(config=f"[bucket]\ncache_size = {256 << 20}\ncache_bytes = {bound}\n")
    d.cli("pool", "create", "tank", f"file://{tmp_path / 'bucket'}", timeout=60)
    d.cli("create", "-V", "64M", "-o", "compression=off", "tank/vol")
    data = helpers.pattern("bounded", 32 << 20)
    with helpers.connected(d.uri("tank/vol")) as h:
        for off in range(0, len(data), 1 << 20):
            h.pwrite(data[off : off + (1 << 20)], off)
        h.flush()
    d.kill9()
    shutil.rmtree(d.state_dir / "bucket")
    d.start()
    with helpers.connected(d.uri("tank/vol")) as h:
        for off in range(0, len(data), 4 << 20):
            assert h.pread(4 << 20, off) == data[off : off + (4 << 20)], f"MiB {off >> 20}"
    st = d.cli("pool", "status", "tank").stdout
    assert " cache: " in st and "misses" in st, st
    m = {line.split()[0]: float(line.split()[1]) for line in d.metrics().splitlines()
         if line.startswith("cistern_pool_bucket_cache") and 'pool="tank"' in line}
    assert m['cistern_pool_bucket_cache_misses_total{pool="tank"}'] > 0, m
    assert m['cistern_pool_bucket_cache_fetched_bytes_total{pool="tank"}'] >= 32 << 20, m
    assert m['cistern_pool_bucket_cache_held_bytes{pool="tank"}'] <= bound + (4 << 20), m
