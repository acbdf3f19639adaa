"""Snapshot policies through the real binary: `policy run [-n]` and its
reasons, holds and manual snapshots surviving pruning, hooks (failure and
timeout), the scheduler across kill -9, and kill -9 inside a pruning batch
(one txg: all of it or none)."""

from __future__ import annotations

import datetime
import time

import pytest

from conftest import run
from helpers import MiB, connected, pattern
from test_snapshots import allocated

OFF = "[engine]\npolicy_tick_secs = 0\n"
VM = """
[policy.vm]
schedule = "daily"
keep = "daily=2"
"""


def write(d, vol: str, seed: str, size: int = MiB):
    with connected(d.uri(vol)) as h:
        h.pwrite(pattern(seed, size), 0)
        h.flush()


def snapshots(d, ds: str = "tank/v") -> list[str]:
    out = d.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split()
    return sorted(n.split("@", 1)[1] for n in out if n.startswith(ds + "@"))


def metric(d, name: str) -> float:
    text = d.metrics()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def today() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")


def setup_volume(d, disks, old: int = 5):
    """tank/v with `old` automatic snapshots from 2020 (data written between
    them, so pruning frees space), one manual snapshot and one held."""
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "8M", "tank/v")
    for i in range(1, old + 1):
        write(d, "tank/v", f"gen{i}")
        d.cli("snapshot", f"tank/v@auto-2020-01-0{i}T0000Z")
    d.cli("snapshot", "tank/v@before-upgrade")
    d.cli("hold", "keep", "tank/v@auto-2020-01-01T0000Z")


def test_policy_run_dry_run_then_run(make_daemon, disks):
    d = make_daemon(config=OFF + VM)
    setup_volume(d, disks)
    before = snapshots(d)
    d.cli("set", "snapshot:policy=vm", "tank")
    assert "inherited from tank" in d.cli("get", "snapshot:policy", "tank/v").stdout

    show = d.cli("policy", "show", "tank/v").stdout
    assert "snapshot:policy=vm (inherited from tank)" in show, show
    assert "daily=2" in show and "next run:" in show

    dry = d.cli("policy", "run", "-n", "tank/v").stdout
    lines = dry.splitlines()
    created = [l for l in lines if l.startswith("would create")]
    assert len(created) == 1 and "tank/v@auto-" in created[0], dry
    destroyed = sorted(l.split()[2] for l in lines if l.startswith("would destroy"))
    assert destroyed == [f"tank/v@auto-2020-01-0{i}T0000Z" for i in (2, 3, 4)], dry
    assert all("no rule keeps it" in l for l in lines if l.startswith("would destroy"))
    assert any("auto-2020-01-05T0000Z" in l and "daily=2" in l for l in lines), dry
    assert any("auto-2020-01-01T0000Z" in l and "held" in l for l in lines), dry
    assert any("before-upgrade" in l and "never pruned" in l for l in lines), dry
    assert "would reclaim" in dry
    assert any(l.strip().startswith("daily=2") and "keeps    2" in l for l in lines), dry
    assert snapshots(d) == before, "a dry run changed something"

    free_before = allocated(d)
    d.cli("policy", "run", "tank/v")
    after = snapshots(d)
    assert "before-upgrade" in after and "auto-2020-01-01T0000Z" in after
    assert "auto-2020-01-05T0000Z" in after
    assert not any(f"auto-2020-01-0{i}T0000Z" in after for i in (2, 3, 4))
    new = [s for s in after if s.startswith("auto-" + today())]
    assert len(new) == 1, after
    assert allocated(d) < free_before, "pruning freed nothing"
    hist = d.cli("policy", "history", "-H").stdout.splitlines()
    assert len(hist) == 1 and "\tmanual\t" in hist[0] and "\t3\t" in hist[0], hist
    assert metric(d, "cistern_policy_snapshots_total") == 1
    assert metric(d, "cistern_policy_pruned_snapshots_total") == 3
    assert metric(d, "cistern_policy_pruned_bytes_total") > 0
    # The held snapshot is still refused by destroy; the policy never tried.
    assert d.cli("destroy", "tank/v@auto-2020-01-01T0000Z", check=False).returncode != 0
    # The property set nearest the dataset decides: a local schedule beats
    # the parent's policy; a local none opts out.
    d.cli("set", "snapshot:schedule=hourly", "tank/v")
    show = d.cli("policy", "show", "tank/v").stdout
    assert "snapshot:schedule=hourly (local)" in show and "schedule:hourly" in show, show
    assert "tank/v" in d.cli("policy", "list", "-H").stdout.split("schedule:hourly")[1]
    # No policy: a clear error.
    d.cli("set", "snapshot:policy=none", "tank/v")
    p = d.cli("policy", "run", "tank/v", check=False)
    assert p.returncode != 0 and "no snapshot policy applies" in p.stderr


def test_hooks_failure_and_timeout_skip_the_snapshot(make_daemon, disks, tmp_path):
    marker = tmp_path / "post-ran"
    cfg = OFF + f"""
[policy.failing]
schedule = "hourly"
pre_hook = "exit 3"
[policy.slow]
schedule = "hourly"
pre_hook = "sleep 30"
hook_timeout_secs = 0.5
[policy.good]
schedule = "hourly"
pre_hook = "test \\"$CISTERN_SNAPSHOT\\" != ''"
post_hook = "echo $CISTERN_SNAPSHOT > {marker}"
"""
    d = make_daemon(config=cfg)
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "8M", "tank/v")
    d.cli("set", "snapshot:policy=failing", "tank/v")
    p = d.cli("policy", "run", "tank/v", check=False)
    assert p.returncode != 0 and "pre-hook 'exit 3' failed" in p.stderr, p.stderr
    d.cli("set", "snapshot:policy=slow", "tank/v")
    t0 = time.monotonic()
    p = d.cli("policy", "run", "tank/v", check=False)
    assert p.returncode != 0 and "timed out" in p.stderr, p.stderr
    assert time.monotonic() - t0 < 10
    assert snapshots(d) == []
    assert metric(d, "cistern_policy_failures_total") == 2
    hist = d.cli("policy", "history", "-H").stdout
    assert "exit 3" in hist and "timed out" in hist
    d.cli("set", "snapshot:policy=good", "tank/v")
    d.cli("policy", "run", "tank/v")
    (snap,) = snapshots(d)
    assert marker.read_text().strip() == f"tank/v@{snap}"


def test_scheduler_takes_one_snapshot_per_slot_across_kill9(make_daemon, disks):
    d = make_daemon(config="[engine]\npolicy_tick_secs = 0.2\n")
    day = today()
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "8M", "tank/v")
    d.cli("set", "snapshot:schedule=daily", "tank/v")
    deadline = time.monotonic() + 15
    while not snapshots(d) and time.monotonic() < deadline:
        time.sleep(0.1)
    first = snapshots(d)
    assert len(first) == 1 and first[0].startswith("auto-"), first
    d.kill9()
    d.start()
    time.sleep(1.5)  # several ticks: the slot is done, nothing more to take
    if today() != day:
        pytest.skip("crossed midnight UTC: a new daily slot began")
    assert snapshots(d) == first
    show = d.cli("policy", "show", "tank/v").stdout
    assert "schedule:daily" in show and "not due" in show, show


@pytest.mark.parametrize("point", ["action_before_meta", "action_after_meta"])
def test_kill9_inside_a_pruning_batch(make_daemon, disks, point):
    """The scheduler prunes 6 snapshots in one txg; the daemon aborts inside
    that commit. After a restart all 6 are gone or none is, the next run
    finishes the job, and destroying everything frees every byte."""
    d = make_daemon(config=OFF + VM)
    d.ignore_panics = True
    setup_volume(d, disks, old=7)
    # Today's slot is already done, so the run only prunes.
    d.cli("snapshot", f"tank/v@auto-{today()}T0000Z")
    d.cli("set", "snapshot:policy=vm", "tank/v")
    d.stop()
    d.config_path.write_text("[engine]\npolicy_tick_secs = 0.3\n" + VM)
    d.start(env={"CISTERN_FAULT_TXG_CRASH": point}, wait=False)
    d.proc.wait(30)
    assert d.proc.returncode != 0, "the daemon should have aborted inside the pruning commit"
    assert "fault injection: aborting" in d.log_text()
    d.config_path.write_text(OFF + VM)
    d.start()
    left = snapshots(d)
    doomed = [f"auto-2020-01-0{i}T0000Z" for i in range(2, 7)]
    gone = [s for s in doomed if s not in left]
    assert gone == ([] if point == "action_before_meta" else doomed), left
    # The scheduler finishes (or repeats nothing) after the restart.
    d.stop()
    d.config_path.write_text("[engine]\npolicy_tick_secs = 0.2\n" + VM)
    d.start()
    deadline = time.monotonic() + 15
    while any(s in snapshots(d) for s in doomed) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = snapshots(d)
    assert left == sorted(
        ["auto-2020-01-01T0000Z", "auto-2020-01-07T0000Z", f"auto-{today()}T0000Z", "before-upgrade"]
    ), left
    d.cli("release", "keep", "tank/v@auto-2020-01-01T0000Z")
    d.cli("destroy", "-r", "tank/v")
    assert allocated(d) == 0, "space leaked or double counted after the crash"


def test_capacity_threshold_prunes_oldest_automatic_first(make_daemon, disks):
    """Past `capacity`, the oldest automatic snapshots go until the pool is
    below it; the grid would keep them all; held and manual ones stay."""
    d = make_daemon(config=OFF)
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "64M", "tank/v")
    for i in range(1, 7):
        write(d, "tank/v", f"cap{i}", 8 * MiB)  # each snapshot alone holds 8 MiB
        d.cli("snapshot", f"tank/v@auto-2020-01-0{i}T0000Z")
        if i == 2:
            d.cli("snapshot", "tank/v@manual")
    d.cli("hold", "keep", "tank/v@auto-2020-01-01T0000Z")
    size, alloc = map(int, d.cli("pool", "list", "-Hp", "-o", "size,alloc").stdout.split())
    # A threshold that needs about two snapshots' worth (16 MiB) freed. The
    # manual snapshot shares auto-02's data: destroying auto-02 frees nothing.
    limit = round((alloc - 13 * MiB) * 100 / size, 1)
    d.stop()
    d.config_path.write_text(OFF + f'[policy.tm]\nschedule = "daily"\nkeep = "hourly=all"\ncapacity = {limit}\n')
    d.start()
    d.cli("set", "snapshot:policy=tm", "tank/v")
    dry = d.cli("policy", "run", "-n", "tank/v").stdout
    doomed = [l.split()[2] for l in dry.splitlines() if l.startswith("would destroy")]
    assert doomed == [f"tank/v@auto-2020-01-0{i}T0000Z" for i in (2, 3, 4)], dry
    assert all("capacity" in l for l in dry.splitlines() if l.startswith("would destroy"))
    d.cli("policy", "run", "tank/v")
    left = snapshots(d)
    assert "auto-2020-01-01T0000Z" in left and "manual" in left, left
    assert not any(f"auto-2020-01-0{i}T0000Z" in left for i in (2, 3, 4)), left
    assert "auto-2020-01-05T0000Z" in left, "pruned more than needed"
    size, alloc = map(int, d.cli("pool", "list", "-Hp", "-o", "size,alloc").stdout.split())
    assert alloc * 100 / size <= limit


@pytest.mark.parametrize("point", ["action_before_meta", "action_after_meta"])
def test_kill9_inside_a_scheduled_snapshot(make_daemon, disks, point):
    """The daemon aborts inside the commit of a scheduled snapshot (before its
    last-run record is written). After a restart there is exactly one
    automatic snapshot for the slot: the one that made it, or a new one."""
    d = make_daemon(config=OFF)
    d.ignore_panics = True
    day = today()
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "8M", "tank/v")
    write(d, "tank/v", "data")
    d.cli("set", "snapshot:schedule=daily", "tank/v")
    d.stop()
    d.config_path.write_text("[engine]\npolicy_tick_secs = 0.3\n")
    d.start(env={"CISTERN_FAULT_TXG_CRASH": point}, wait=False)
    d.proc.wait(30)
    assert "fault injection: aborting" in d.log_text()
    d.config_path.write_text("[engine]\npolicy_tick_secs = 0.2\n")
    d.start()
    deadline = time.monotonic() + 15
    while not snapshots(d) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)  # more ticks: nothing more to take
    if today() != day:
        pytest.skip("crossed midnight UTC: a new daily slot began")
    left = snapshots(d)
    assert len(left) == 1 and left[0].startswith("auto-"), left


# ------------------------------------------------------------ event snapshots

EVENTS = """[engine]
policy_tick_secs = 0.2
[policy.once]
schedule = "none"
keep = "last=100"
events = ["nbd-disconnect"]
event_min_interval = "1h"
[policy.flap]
schedule = "none"
keep = "last=100"
events = ["nbd-disconnect"]
event_min_interval = "2s"
"""


def created(d, ds: str) -> dict[str, int]:
    """Snapshot short name -> creation (Unix seconds)."""
    out = d.cli("list", "-Hp", "-t", "snapshot", "-o", "name,creation", ds).stdout
    return {n.split("@", 1)[1]: int(c) for n, c in (l.split("\t") for l in out.splitlines())}


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_nbd_disconnect_after_writing_takes_one_snapshot(make_daemon, disks, tmp_path):
    """nbdcopy (several connections) into a volume, then disconnect: one
    snapshot. Clients that only read or look: none. A flapping writer within
    the minimum interval: no more."""
    d = make_daemon(config=EVENTS)
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "16M", "tank/v")
    d.cli("set", "snapshot:policy=once", "tank/v")
    # Connect and disconnect without writing: reads, a look, a flush.
    run(["nbdcopy", d.uri("tank/v"), "null:"], timeout=60)
    run(["nbdinfo", d.uri("tank/v")], timeout=60)
    with connected(d.uri("tank/v")) as h:
        h.pread(4096, 0)
        h.flush()
    time.sleep(1)  # several event polls
    assert snapshots(d) == []
    src = tmp_path / "src.img"
    src.write_bytes(pattern("backup", 4 * MiB))
    run(["nbdcopy", "--flush", "--connections=4", str(src), d.uri("tank/v")], timeout=60)
    wait_for(lambda: snapshots(d), 10, "the event snapshot")
    time.sleep(1)  # several event polls: nothing more
    (snap,) = snapshots(d)
    assert snap.startswith("auto-" + today()), snap
    # What it holds is what nbdcopy wrote.
    got = tmp_path / "got.img"
    run(["nbdcopy", d.uri(f"tank/v@{snap}"), str(got)], timeout=60)
    assert got.read_bytes()[: 4 * MiB] == src.read_bytes()

    # A flapping writer: 20 connect/write/disconnect cycles, all inside the
    # 1 h interval: still one snapshot (the next one waits out the interval).
    for i in range(20):
        write(d, "tank/v", f"flap{i}", 64 * 1024)
    time.sleep(1)
    assert snapshots(d) == [snap]
    hist = d.cli("policy", "history", "-H", "tank/v").stdout.splitlines()
    assert len(hist) == 1 and "\tonce\tnbd-disconnect\t" in hist[0], hist
    show = d.cli("policy", "show", "tank/v").stdout
    assert "events:     nbd-disconnect (at most one snapshot per 1h)" in show, show
    assert "no schedule" in show, show
    assert metric(d, "cistern_policy_event_snapshots_total") == 1
    assert metric(d, "cistern_policy_events_deferred_total") >= 1


def test_flapping_writer_gets_at_most_one_per_interval(make_daemon, disks):
    """Connect/write/disconnect over and over with a 2 s interval: a snapshot
    at the first disconnect, then at most one per interval; the one deferred
    to the end of an interval holds the last client's data."""
    d = make_daemon(config=EVENTS)
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "16M", "tank/v")
    d.cli("set", "snapshot:policy=flap", "tank/v")
    t0 = time.time()
    for i in range(20):  # over 5 s: more than two intervals
        write(d, "tank/v", f"flap{i}", 64 * 1024)
        time.sleep(0.25)
    elapsed = time.time() - t0
    last = pattern("flap19", 64 * 1024)
    # The last write is captured by the deferred snapshot, within one interval.
    def has_last():
        s = snapshots(d)
        if not s:
            return False
        newest = max(s, key=lambda n: created(d, "tank/v")[n])
        with connected(d.uri(f"tank/v@{newest}")) as h:
            return h.pread(len(last), 0) == last
    wait_for(has_last, 15, "a snapshot holding the last write")
    time.sleep(2.5)  # another interval: no further disconnect, nothing more
    times = sorted(created(d, "tank/v").values())
    assert 2 <= len(times) <= 2 + int(elapsed / 2), (times, elapsed)
    assert all(b - a >= 2 for a, b in zip(times, times[1:])), times


def test_bucket_quiet_after_writes_takes_one_snapshot(make_s3):
    """S3 PUTs, then nothing for `s3_quiet`: one snapshot holding them all."""
    s3 = make_s3()
    s3.require_cistern("bucket snapshots")
    d = s3.daemon
    d.stop()
    d.config_path.write_text(
        d.config_path.read_text()
        + """[engine]
policy_tick_secs = 0.2
[policy.bucket]
schedule = "none"
keep = "last=10"
events = ["s3-quiet"]
s3_quiet = "2s"
event_min_interval = "1s"
"""
    )
    d.start()
    s3.wait_ready()
    c = s3.client()
    c.create_bucket(Bucket="photos")
    d.cli("set", "snapshot:policy=bucket", "tank/photos")
    for i in range(5):
        c.put_object(Bucket="photos", Key=f"img{i}", Body=pattern(f"img{i}", 10_000))
    last_put = time.time()
    wait_for(lambda: snapshots(d, "tank/photos"), 15, "the quiet-bucket snapshot")
    (snap,) = snapshots(d, "tank/photos")
    assert created(d, "tank/photos")[snap] >= int(last_put) + 1, "taken before the bucket was quiet"
    time.sleep(2.5)  # no writes since: nothing more
    assert snapshots(d, "tank/photos") == [snap]
    c.delete_object(Bucket="photos", Key="img0")
    wait_for(lambda: len(snapshots(d, "tank/photos")) == 2, 15, "a second quiet snapshot")
    # The run is recorded in its own transaction right after its snapshot.
    history = lambda: d.cli("policy", "history", "-H").stdout.splitlines()
    wait_for(lambda: len(history()) >= 2, 15, "the second run in the history")
    hist = history()
    assert [l.split("\t")[3] for l in hist] == ["s3-quiet", "s3-quiet"], hist
    # The first one holds every object put before the quiet time.
    d.cli("rollback", "-r", f"tank/photos@{snap}")
    keys = [o["Key"] for o in c.list_objects_v2(Bucket="photos")["Contents"]]
    assert sorted(keys) == [f"img{i}" for i in range(5)], keys


def test_history_survives_restart_and_kill9(make_daemon, disks):
    d = make_daemon(config=OFF + VM)
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "8M", "tank/v")
    d.cli("set", "snapshot:policy=vm", "tank/v")
    d.cli("policy", "run", "tank/v")
    before = d.cli("policy", "history", "-H").stdout
    assert len(before.splitlines()) == 1
    d.stop()
    d.start()
    assert d.cli("policy", "history", "-H").stdout == before
    d.cli("policy", "run", "tank/v")
    two = d.cli("policy", "history", "-H").stdout
    assert len(two.splitlines()) == 2 and two.startswith(before)
    d.kill9()
    d.start()
    assert d.cli("policy", "history", "-H").stdout == two
    assert d.cli("policy", "history", "-H", "tank/other").stdout == ""
    runs = d.cli_json("policy", "history")
    assert [r["trigger"] for r in runs] == ["manual", "manual"]
    assert all(r["created"].startswith("auto-") for r in runs)


def test_list_marks_automatic_snapshots(make_daemon, disks):
    """`cistern:auto`: the policy that made (and prunes) a snapshot, `-` for
    manual ones; in the default `list -t snapshot`, -o, -H, -p and --json."""
    d = make_daemon(config=OFF + VM)
    setup_volume(d, disks, old=2)
    d.cli("set", "snapshot:policy=vm", "tank")
    rows = d.cli("list", "-H", "-o", "name,cistern:auto", "-t", "snapshot").stdout.splitlines()
    assert rows == [
        "tank/v@auto-2020-01-01T0000Z\tvm",
        "tank/v@auto-2020-01-02T0000Z\tvm",
        "tank/v@before-upgrade\t-",
    ], rows
    table = d.cli("list", "-t", "snapshot").stdout.splitlines()
    assert table[0].split()[-1] == "CISTERN:AUTO", table
    assert table[1].split()[-1] == "vm" and table[-1].split()[-1] == "-", table
    assert d.cli("list", "-Hp", "-t", "snapshot").stdout.splitlines()[-1].endswith("\t-")
    js = {x["name"]: x for x in d.cli_json("list", "-t", "snapshot")}
    prop = {p["name"]: p for p in js["tank/v@auto-2020-01-01T0000Z"]["properties"]}["cistern:auto"]
    assert prop["value"] == "vm" and prop["source"] == "-"
    assert d.prop("tank/v@before-upgrade", "cistern:auto") == "-"
    # Volumes and their listings keep their columns.
    assert d.cli("list", "-H", "tank/v").stdout.count("\t") == 3
    p = d.cli("set", "cistern:auto=vm", "tank/v@before-upgrade", check=False)
    assert p.returncode != 0 and "read-only" in p.stderr
    # Opting out: nothing is automatic any more.
    d.cli("set", "snapshot:policy=none", "tank/v")
    rows = d.cli("list", "-H", "-o", "cistern:auto", "-t", "snapshot").stdout.split()
    assert rows == ["-", "-", "-"], rows


def test_capacity_counts_space_the_pruned_set_frees(make_daemon, disks):
    """Blocks shared by two automatic snapshots are freed only when both go:
    capacity pruning uses what destroying the set frees (dead lists), so it
    stops as soon as that is enough, never at a held or manual one."""
    d = make_daemon(config=OFF)
    d.cli("pool", "create", "-s", "256M", "tank", "mirror", disks / "d0", disks / "d1")
    d.cli("create", "-V", "64M", "tank/v")
    gens = [["a1"], ["a2", "m"], ["a3", "a4"], ["a5"], ["a6"]]
    names = {f"a{i}": f"auto-2020-01-0{i}T0000Z" for i in range(1, 7)} | {"m": "manual"}
    for i, snaps in enumerate(gens):
        write(d, "tank/v", f"set{i}", 8 * MiB)
        for s in snaps:
            d.cli("snapshot", f"tank/v@{names[s]}")
    d.cli("hold", "keep", f"tank/v@{names['a1']}")
    size, alloc = map(int, d.cli("pool", "list", "-Hp", "-o", "size,alloc").stdout.split())
    # Needs one generation (8 MiB) freed: a2 alone frees nothing (m shares
    # it), a2+a3 nothing (a4 shares), a2+a3+a4 frees gen 3.
    limit = round((alloc - 5 * MiB) * 100 / size, 1)
    d.stop()
    d.config_path.write_text(OFF + f'[policy.tm]\nschedule = "daily"\nkeep = "hourly=all"\ncapacity = {limit}\n')
    d.start()
    d.cli("set", "snapshot:policy=tm", "tank/v")
    dry = d.cli("policy", "run", "-n", "tank/v").stdout
    doomed = [l.split()[2] for l in dry.splitlines() if l.startswith("would destroy")]
    assert doomed == [f"tank/v@{names[s]}" for s in ("a2", "a3", "a4")], dry
    d.cli("policy", "run", "tank/v")
    left = snapshots(d)
    for s in ("a1", "m", "a5", "a6"):
        assert names[s] in left, (s, left)
    size, alloc = map(int, d.cli("pool", "list", "-Hp", "-o", "size,alloc").stdout.split())
    assert alloc * 100 / size <= limit
