"""Replication jobs between two daemons on loopback (crates/replication,
decision 0034): push and pull of a volume and a bucket (equal bit for bit on
the target), incrementals, holds on the last common snapshot, pruning on both
sides with different grids, a diverged target refused then forced, read-only
targets, cut transfers that resume, the bandwidth limit, after-snapshot
triggers, retries, persistence across restarts, the CLI's errors."""

from __future__ import annotations

import hashlib
import json
import time

import pytest

from conftest import free_ports
from helpers import MiB, connected, fill_random, pattern, two_daemons, wait_until

# The job-running daemon's grids: `short` for the source, `long` for the target.
GRIDS = """
[engine]
policy_tick_secs = 0

[policy.short]
schedule = "none"
keep = "last=2"

[policy.long]
schedule = "none"
keep = "last=4"
"""


def write(d, vol: str, seed: str, size: int = MiB, offset: int = 0):
    with connected(d.uri(vol)) as h:
        h.pwrite(pattern(seed, size), offset)
        h.flush()


def digest(d, export: str) -> str:
    """sha256 of a whole volume or snapshot export, read over NBD."""
    h = hashlib.sha256()
    with connected(d.uri(export)) as c:
        size = c.get_size()
        off = 0
        while off < size:
            n = min(4 * MiB, size - off)
            h.update(c.pread(n, off))
            off += n
    return h.hexdigest()


def snapshots(d, ds: str) -> list[str]:
    """Short names, oldest first."""
    out = d.cli("list", "-H", "-p", "-o", "name,createtxg", "-t", "snapshot").stdout
    rows = [l.split("\t") for l in out.splitlines() if l.startswith(ds + "@")]
    rows.sort(key=lambda r: int(r[1]))
    return [r[0].split("@", 1)[1] for r in rows]


def holds(d, snap: str) -> list[str]:
    out = d.cli("holds", "-H", snap).stdout
    return [l.split("\t")[1] for l in out.splitlines() if l.strip()]


def pool(d, disks, name: str, size: str = "1G"):
    d.cli("pool", "create", "-s", size, name, "mirror", disks / f"{name}-a", disks / f"{name}-b")


def add(d, job: str, source: str, target: str, token_of, *extra):
    return d.cli(
        "replication", "add", job, "--source", source, "--target", target,
        "--token-file", token_of.state_dir / "api.token", *extra,
    )


def status(d, job: str) -> dict:
    return d.cli_json("replication", "status", job)


def run_job(d, job: str, *extra, check=True, timeout=300):
    return d.cli("replication", "run", *extra, job, check=check, timeout=timeout)


def metric(d, name: str) -> float:
    for line in d.metrics().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


@pytest.fixture
def pair(make_daemon, disks):
    """Two daemons: `src` (pool tank, volume tank/vm 32M) and `dst` (pool tank2)."""
    src, dst = two_daemons(make_daemon, disks, "tank", "tank2", mirror=True, config=GRIDS)
    src.cli("create", "-V", "32M", "tank/vm")
    return src, dst


# ---------------------------------------------------------------- no data path needed


def test_jobs_persist_and_bad_input_changes_nothing(make_daemon, disks, tmp_path):
    cfg = GRIDS + '\n[replication.fromconfig]\nsource = "tank/vm"\ntarget = "https://backup.example:10810/tank2/vm"\nschedule = "1h"\n'
    d = make_daemon("d", config=cfg)
    other = make_daemon("o")
    url = f"{other.api_url}/tank2/vm"
    bad = [
        (["--target", "http://backup.example:1/tank2/vm"], "--insecure"),
        (["--target", "https://b:1/tank2"], "POOL/DATASET"),
        (["--target", url, "--policy", "nope"], "nope"),
        (["--target", url, "--pull"], "--pull"),
        (["--target", url, "--bwlimit", "12Q"], "12Q"),
        (["--target", url, "--schedule", "fortnightly"], "fortnightly"),
    ]
    for args, words in bad:
        p = d.cli("replication", "add", "j1", "--source", "tank/vm", *args, check=False)
        assert p.returncode != 0 and words in p.stderr, (args, p.stderr)
    p = d.cli("replication", "add", "j1", "--source", f"{other.api_url}/tank/vm", "--target", "tank2/vm",
              "--after-snapshot", "--pull", check=False)
    assert p.returncode != 0 and "push" in p.stderr, p.stderr
    assert [j["name"] for j in d.cli_json("replication", "list")] == ["fromconfig"]

    # Its first run (at once: never attempted) fails, there is no tank/vm;
    # the retry it would start 30 s later could be running when `remove`
    # below comes (refused while running, a flake on a loaded machine).
    add(d, "j1", "tank/vm", url, other, "--schedule", "10m", "--bwlimit", "10M", "--policy", "long",
        "--retry", "3600")
    p = d.cli("replication", "add", "j1", "--source", "tank/vm", "--target", url, check=False)
    assert p.returncode != 0 and "exists" in p.stderr
    rows = [l.split("\t") for l in d.cli("replication", "list", "-H", "-o", "name,direction,target,schedule,origin").stdout.splitlines()]
    assert rows == [["fromconfig", "push", "https://backup.example:10810/tank2/vm", "every 1h", "config"],
                    ["j1", "push", url, "every 10m", "cli"]], rows
    st = status(d, "j1")
    assert st["bwlimit"] == 10 << 20 and st["policy"] == "long"
    d.cli("replication", "pause", "j1")
    # Kept across a restart and a kill -9.
    d.restart()
    assert status(d, "j1")["paused"] is True
    d.cli("replication", "resume", "j1")
    d.kill9()
    d.start()
    st = status(d, "j1")
    assert st["paused"] is False and st["origin"] == "cli"
    p = d.cli("replication", "remove", "fromconfig", check=False)
    assert p.returncode != 0 and "config" in p.stderr
    d.cli("replication", "remove", "j1")
    d.restart()
    assert [j["name"] for j in d.cli_json("replication", "list")] == ["fromconfig"]
    p = d.cli("replication", "status", "j1", check=False)
    assert p.returncode != 0 and "no replication job" in p.stderr
    # A bad [replication.NAME] table stops the daemon with its name.
    d.stop()
    d.config_path.write_text(GRIDS + '\n[replication.broken]\nsource = "tank/vm"\ntarget = "tank2/vm"\n')
    d.start(wait=False)
    wait_until(lambda: not d.alive(), 30, what="the daemon to refuse its config")
    assert "broken" in d.log_text()


def test_failures_are_retried_with_backoff_and_reported(make_daemon, disks):
    d = make_daemon("d", config=GRIDS)
    pool(d, disks, "tank")
    d.cli("create", "-V", "8M", "tank/vm")
    d.cli("snapshot", "tank/vm@s1")
    (port,) = free_ports(1)
    d.cli("replication", "add", "dead", "--source", "tank/vm", "--target", f"http://127.0.0.1:{port}/tank2/vm",
          "--schedule", "1h", "--retry", "1")
    # The first run is due at once, then retries after 1 s, 2 s, 4 s...
    wait_until(lambda: status(d, "dead")["failures"] >= 3, 30, what="three failed runs")
    st = status(d, "dead")
    assert st["state"] == "failing" and "cannot reach" in st["last_error"], st
    starts = [r["start"] for r in st["history"]]
    assert all(r["result"] == "failed" for r in st["history"])
    # Backoff: the gaps grow (1 s, then 2 s, ...), never a tight loop.
    assert starts[-1] - starts[0] >= 2, starts
    assert metric(d, 'cistern_replication_consecutive_failures{job="dead"}') >= 3
    assert metric(d, 'cistern_replication_runs_total{job="dead",result="failed"}') >= 3
    events = d.cli("pool", "events", "-H").stdout
    assert "replication_fail" in events and "replication_start" in events, events
    p = run_job(d, "dead", check=False)
    assert p.returncode != 0 and "cannot reach" in p.stderr


# ---------------------------------------------------------------- data path


def test_push_volume_full_then_incremental_readonly_and_held(pair):
    src, dst = pair
    write(src, "tank/vm", "one", 4 * MiB)
    src.cli("snapshot", "tank/vm@s1")
    add(src, "push", "tank/vm", f"{dst.api_url}/tank2/vm", dst)
    run_job(src, "push")
    assert snapshots(dst, "tank2/vm") == ["s1"]
    assert digest(dst, "tank2/vm@s1") == digest(src, "tank/vm@s1")
    assert dst.prop("tank2/vm", "readonly") == "on"
    assert holds(src, "tank/vm@s1") == ["replication:push"]
    assert holds(dst, "tank2/vm@s1") == ["replication:push"]
    # Incremental: two more snapshots with changes between.
    write(src, "tank/vm", "two", MiB, offset=8 * MiB)
    src.cli("snapshot", "tank/vm@s2")
    write(src, "tank/vm", "three", MiB, offset=20 * MiB)
    src.cli("snapshot", "tank/vm@s3")
    run_job(src, "push")
    assert snapshots(dst, "tank2/vm") == ["s1", "s2", "s3"]
    for s in ["s2", "s3"]:
        assert digest(dst, f"tank2/vm@{s}") == digest(src, f"tank/vm@{s}"), s
    assert digest(dst, "tank2/vm") == digest(src, "tank/vm@s3")
    # The hold moved to the new common snapshot, on both sides.
    assert holds(src, "tank/vm@s1") == [] and holds(dst, "tank2/vm@s1") == []
    assert holds(src, "tank/vm@s3") == ["replication:push"]
    assert holds(dst, "tank2/vm@s3") == ["replication:push"]
    p = dst.cli("destroy", "tank2/vm@s3", check=False)
    assert p.returncode != 0
    # Nothing new: up to date, nothing sent.
    st_before = status(src, "push")["bytes_total"]
    assert "up-to-date" in run_job(src, "push").stdout
    st = status(src, "push")
    assert st["bytes_total"] == st_before and st["last_common"] == "s3" and st["state"] == "ok"
    assert metric(src, 'cistern_replication_sent_bytes_total{job="push"}') == st["bytes_total"] > 4 * MiB
    # The read-only target still exports its snapshots and clones.
    dst.cli("clone", "tank2/vm@s2", "tank2/vm2")
    assert digest(dst, "tank2/vm2") == digest(src, "tank/vm@s2")
    events = src.cli("pool", "events", "-H").stdout
    assert "replication_finish" in events
    # The dashboard's page lists the job and its common snapshot.
    import urllib.request
    req = urllib.request.Request(src.api_url + "/replication", headers={"Authorization": f"Bearer {src.token}"})
    html = urllib.request.urlopen(req, timeout=10).read().decode()
    assert "<td>push</td>" in html and "@s3" in html and 'href="/replication"' in html, html


def test_pull_bucket_equal_objects(make_s3):
    import boto3  # noqa: F401

    a = make_s3("a")
    b = make_s3("b")
    c = a.client()
    c.create_bucket(Bucket="photos")
    objs = {f"img/{i}.jpg": pattern(f"o{i}", 1000 + i * 7919) for i in range(20)}
    for k, v in objs.items():
        c.put_object(Bucket="photos", Key=k, Body=v)
    a.cli("snapshot", "tank/photos@mon")
    b.cli("replication", "add", "pull", "--pull", "--source", f"{a.daemon.api_url}/tank/photos",
          "--target", "tank/photos", "--token-file", a.daemon.state_dir / "api.token")
    b.cli("replication", "run", "pull")
    c.delete_object(Bucket="photos", Key="img/3.jpg")
    c.put_object(Bucket="photos", Key="img/new.jpg", Body=b"new")
    a.cli("snapshot", "tank/photos@tue")
    b.cli("replication", "run", "pull")
    bc = b.client()
    for snap, expect in [("mon", objs), ("tue", {**{k: v for k, v in objs.items() if k != "img/3.jpg"}, "img/new.jpg": b"new"})]:
        name = b.snapshot_bucket("photos", snap)
        keys = sorted(o["Key"] for o in bc.list_objects_v2(Bucket=name).get("Contents", []))
        assert keys == sorted(expect), snap
        for k, v in expect.items():
            assert bc.get_object(Bucket=name, Key=k)["Body"].read() == v, (snap, k)
    assert b.cli("get", "-Hp", "-o", "value", "readonly", "tank/photos").stdout.strip() == "on"


def test_pruning_both_sides_keeps_the_common_snapshot(pair):
    src, dst = pair
    names = [f"auto-2026-11-2{i}T0000Z" for i in range(6)]
    for i, n in enumerate(names):
        write(src, "tank/vm", f"g{i}", MiB, offset=i * MiB)
        src.cli("snapshot", f"tank/vm@{n}")
    src.cli("snapshot", "tank/vm@manual")
    add(src, "prune", "tank/vm", f"{dst.api_url}/tank2/vm", dst, "--policy", "long", "--source-policy", "short")
    out = run_job(src, "prune").stdout
    # Source grid last=2, target grid last=4; manual snapshots are never pruned.
    assert snapshots(src, "tank/vm") == names[-2:] + ["manual"], out
    assert snapshots(dst, "tank2/vm") == names[-4:] + ["manual"]
    # The common snapshot is the manual one (newest); now make an automatic
    # one the common snapshot and let other pruners try to take it.
    src.cli("snapshot", "tank/vm@auto-2026-11-27T0000Z")
    run_job(src, "prune")
    common = "auto-2026-11-27T0000Z"
    assert status(src, "prune")["last_common"] == common
    for n in ["auto-2026-11-28T0000Z", "auto-2026-11-29T0000Z", "auto-2026-11-30T0000Z"]:
        src.cli("snapshot", f"tank/vm@{n}")
    # The source's own policy (last=2 through snapshot:policy) cannot take it...
    src.cli("set", "snapshot:policy=short", "tank/vm")
    src.cli("policy", "run", "tank/vm")
    assert common in snapshots(src, "tank/vm")
    # ...nor can destroy.
    assert src.cli("destroy", f"tank/vm@{common}", check=False).returncode != 0
    assert dst.cli("destroy", f"tank2/vm@{common}", check=False).returncode != 0
    # The chain holds: the next incremental starts at it.
    run_job(src, "prune")
    newest = snapshots(src, "tank/vm")[-1]
    assert snapshots(dst, "tank2/vm")[-1] == newest
    assert digest(dst, f"tank2/vm@{newest}") == digest(src, f"tank/vm@{newest}")
    # Released once the chain moved on (then pruned by the source's grid).
    assert common not in snapshots(src, "tank/vm") or holds(src, f"tank/vm@{common}") == []
    assert holds(src, f"tank/vm@{newest}") == ["replication:prune"]


def test_diverged_target_is_refused_then_forced(pair):
    src, dst = pair
    write(src, "tank/vm", "a", 2 * MiB)
    src.cli("snapshot", "tank/vm@s1")
    add(src, "div", "tank/vm", f"{dst.api_url}/tank2/vm", dst)
    run_job(src, "div")
    # Someone changes the backup: a write, a snapshot, another write.
    dst.cli("set", "readonly=off", "tank2/vm")
    write(dst, "tank2/vm", "oops", MiB)
    dst.cli("snapshot", "tank2/vm@local")
    write(dst, "tank2/vm", "oops2", MiB, offset=4 * MiB)
    write(src, "tank/vm", "b", MiB, offset=MiB)
    src.cli("snapshot", "tank/vm@s2")
    p = run_job(src, "div", check=False)
    assert p.returncode != 0
    assert "@local" in p.stderr and "written" in p.stderr and "@s1" in p.stderr, p.stderr
    assert snapshots(dst, "tank2/vm") == ["s1", "local"]
    st = status(src, "div")
    assert st["history"][-1]["error_kind"] == "Diverged"
    run_job(src, "div", "--force")
    assert snapshots(dst, "tank2/vm") == ["s1", "s2"]
    assert digest(dst, "tank2/vm") == digest(src, "tank/vm@s2")
    assert dst.prop("tank2/vm", "readonly") == "on"


def test_bandwidth_limit_is_honoured(pair):
    src, dst = pair
    write(src, "tank/vm", "bw", 8 * MiB)
    src.cli("snapshot", "tank/vm@s1")
    add(src, "slow", "tank/vm", f"{dst.api_url}/tank2/vm", dst, "--bwlimit", "2M")
    t = time.monotonic()
    run_job(src, "slow")
    took = time.monotonic() - t
    sent = status(src, "slow")["bytes_total"]
    assert sent >= 8 * MiB
    # 8 MiB at 2 MiB/s is 4 s; a generous lower bound.
    assert took >= 2.5, (took, sent)
    assert digest(dst, "tank2/vm@s1") == digest(src, "tank/vm@s1")


def test_after_snapshot_runs_after_each_automatic_snapshot(pair):
    src, dst = pair
    src.cli("set", "snapshot:policy=short", "tank/vm")
    add(src, "hook", "tank/vm", f"{dst.api_url}/tank2/vm", dst, "--after-snapshot")
    for i in range(2):
        write(src, "tank/vm", f"h{i}", MiB)
        src.cli("policy", "run", "tank/vm")
        newest = snapshots(src, "tank/vm")[-1]
        wait_until(lambda: newest in snapshots(dst, "tank2/vm") and status(src, "hook")["state"] == "ok",
                   60, what=f"{newest} on the target")
        assert digest(dst, f"tank2/vm@{newest}") == digest(src, f"tank/vm@{newest}")
    assert [r["trigger"] for r in status(src, "hook")["history"]] == ["after-snapshot"] * 2


@pytest.mark.parametrize("victim", ["receiver", "sender"])
def test_cut_transfer_recovers(pair, victim):
    """kill -9 of the receiving or the sending daemon mid-stream, twice: the
    job recovers by itself (retry) or with the next run, and ends equal; with
    resumable receives (a `receive_resume_token` on the target) the next run
    continues the stream instead of starting over."""
    src, dst = pair
    src.cli("destroy", "tank/vm")
    src.cli("create", "-V", "64M", "tank/vm")
    for i in range(3):
        write(src, "tank/vm", f"big{i}", 16 * MiB, offset=i * 16 * MiB)
    src.cli("snapshot", "tank/vm@s1")
    add(src, "cut", "tank/vm", f"{dst.api_url}/tank2/vm", dst, "--bwlimit", "8M", "--retry", "1")
    kill = dst if victim == "receiver" else src
    deadline = time.monotonic() + 120
    for _cut in range(2):
        if status(src, "cut")["state"] != "running":
            # A retry may start meanwhile: then this one is refused as busy.
            src.cli("replication", "run", "--no-wait", "cut", check=False)

        def moving():
            p = status(src, "cut").get("progress")
            return p is not None and p["bytes"] > 4 * MiB
        wait_until(moving, 60, what="the transfer to be under way")
        kill.kill9()
        kill.start()
    if victim == "sender":
        # The killed sender lost its run; the next one starts it again.
        src.cli("replication", "run", "--no-wait", "cut", check=False)
    wait_until(lambda: status(src, "cut")["state"] == "ok", 120, what="the job to finish")
    assert time.monotonic() < deadline
    st = status(src, "cut")
    assert snapshots(dst, "tank2/vm") == ["s1"]
    assert digest(dst, "tank2/vm@s1") == digest(src, "tank/vm@s1")
    assert dst.prop("tank2/vm", "readonly") == "on"
    if victim == "receiver":
        assert any(r["result"] == "failed" for r in st["history"]), st["history"]
    if "receive_resume_token" in dst.props("tank2/vm"):
        # Resumable receives: continued, not restarted.
        assert any(r["resumed"] for r in st["history"]), json.dumps(st["history"], indent=1)


def test_push_over_https_checks_the_certificate_and_the_token(make_daemon, disks, tmp_path, request):
    from test_tls import TlsDaemon, _ca, _key_and_csr, _sign

    pki = tmp_path / "pki"
    pki.mkdir()
    _ca(pki, "ca")
    _key_and_csr(pki, "server", "localhost")
    _sign(pki, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
          "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    cfg = GRIDS + f'[api]\ntls_cert = "{pki}/server-cert.pem"\ntls_key = "{pki}/server-key.pem"\n'
    dst = TlsDaemon(tmp_path / "tls-state", tmp_path / "tls.log", config=cfg)
    dst.ca = pki / "ca-cert.pem"
    request.addfinalizer(lambda: dst.stop(timeout=30))
    dst.start()
    src = make_daemon("src", config=GRIDS)
    pool(src, disks, "tank")
    pool(dst, disks, "tank2")
    src.cli("create", "-V", "8M", "tank/vm")
    write(src, "tank/vm", "tls", 2 * MiB)
    src.cli("snapshot", "tank/vm@s1")
    url = f"{dst.api_url}/tank2/vm"
    assert url.startswith("https://")
    # Without the CA the certificate is not trusted: nothing is sent.
    add(src, "noca", "tank/vm", url, dst)
    p = run_job(src, "noca", check=False)
    assert p.returncode != 0 and "certificate" in p.stderr.lower(), p.stderr
    # A wrong token is refused by the other daemon.
    bad = tmp_path / "bad.token"
    bad.write_text("0" * 64 + "\n")
    src.cli("replication", "add", "badtoken", "--source", "tank/vm", "--target", url,
            "--remote-ca", pki / "ca-cert.pem", "--token-file", bad)
    p = run_job(src, "badtoken", check=False)
    assert p.returncode != 0 and ("401" in p.stderr or "token" in p.stderr.lower()), p.stderr
    assert dst.cli("list", "-H", "-o", "name").stdout.split() == ["tank2"]
    # The CA and the token: sent, equal, read-only.
    add(src, "tls", "tank/vm", url, dst, "--remote-ca", pki / "ca-cert.pem")
    run_job(src, "tls")
    assert digest(dst, "tank2/vm@s1") == digest(src, "tank/vm@s1")
    assert dst.prop("tank2/vm", "readonly") == "on"


# ---------------------------------------------------------------- resume and stall through a proxy


def proxied_pair(make_daemon, disks, env=None):
    """`src` with a 32 MiB volume of random data and a snapshot; `dst` with
    small txgs (a resumable receive checkpoints every MiB)."""
    src, dst = two_daemons(make_daemon, disks, "tank", "tank2", mirror=True, config=GRIDS, small_txgs=True, env=env)
    src.cli("create", "-V", "32M", "-o", "compression=off", "tank/vm")
    fill_random(src, "tank/vm", 32 * MiB)
    src.cli("snapshot", "tank/vm@s1")
    return src, dst


def test_resumed_run_sends_only_the_rest(make_daemon, disks):
    """A push cut (connection reset by a proxy) after ~60% of the stream:
    the next run resumes from the target's token and its byte counter (run
    history, metrics) covers the rest of the stream, not all of it again."""
    from tcp_proxy import TcpProxy

    src, dst = proxied_pair(make_daemon, disks)
    size = int(src.cli("send", "-nvP", "tank/vm@s1").stdout.splitlines()[-1].split("\t")[1])
    cut_at = size * 6 // 10
    proxy = TcpProxy(dst.api_port, cut_at, "cut", "up")
    try:
        add(src, "r", "tank/vm", f"{proxy.url}/tank2/vm", dst, "--retry", "3600")
        assert run_job(src, "r", check=False).returncode != 0
        assert proxy.tripped.is_set()
        first = status(src, "r")
        assert first["history"][-1]["result"] == "failed", first["history"]
        token = dst.prop("tank2/vm", "receive_resume_token")
        assert token.startswith("1-"), token
        proxy.limit = None  # the next run gets through
        run_job(src, "r")
    finally:
        proxy.close()
    st = status(src, "r")
    last = st["history"][-1]
    assert last["result"] == "ok" and last["resumed"], last
    # The rest: what the cut left over plus at most the receiver's last
    # checkpoint interval and what was in flight (a few MiB) — never the whole.
    assert last["bytes"] <= size - cut_at + 6 * MiB, (last["bytes"], size, cut_at)
    assert last["bytes"] < size * 6 // 10, (last["bytes"], size)
    assert st["bytes_total"] == first["bytes_total"] + last["bytes"]
    assert metric(src, 'cistern_replication_sent_bytes_total{job="r"}') == st["bytes_total"]
    assert digest(dst, "tank2/vm@s1") == digest(src, "tank/vm@s1")
    assert dst.prop("tank2/vm", "receive_resume_token") in ("-", "")


@pytest.mark.parametrize("direction", ["push", "pull"])
def test_stalled_peer_times_out_with_a_clear_error(make_daemon, disks, direction):
    """The other daemon stops answering mid-stream (a proxy that holds the
    connection open and forwards nothing): the run fails after the stall
    timeout (CISTERN_STREAM_STALL_SECS, 3 s here) saying so, instead of
    hanging; the receiving side gives up too, and the next run completes."""
    from tcp_proxy import TcpProxy

    stall = {"CISTERN_STREAM_STALL_SECS": "3"}
    src, dst = proxied_pair(make_daemon, disks, env=stall)
    if direction == "push":
        # src pushes into dst's /v1/receive: the upload stalls.
        proxy = TcpProxy(dst.api_port, 8 * MiB, "hold", "up")
        runner, job_args = src, ("tank/vm", f"{proxy.url}/tank2/vm", dst)
    else:
        # dst pulls from src's /v1/send: the download stalls.
        proxy = TcpProxy(src.api_port, 8 * MiB, "hold", "down")
        runner, job_args = dst, (f"{proxy.url}/tank/vm", "tank2/vm", src)
    try:
        add(runner, "s", *job_args, "--retry", "3600")
        t = time.monotonic()
        p = run_job(runner, "s", check=False, timeout=120)
        took = time.monotonic() - t
        assert p.returncode != 0, p.stdout
        assert proxy.tripped.is_set()
        assert took < 60, took
        st = status(runner, "s")
        err = st["history"][-1]["error"] or ""
        assert st["history"][-1]["result"] == "failed" and st["state"] in ("failed", "failing"), st
        assert "timeout" in err or "3 s" in err or "stall" in err, err
        proxy.cut()
        proxy.limit = None
        # The receiving daemon gave up on the stalled stream as well: the
        # next run resumes into the target instead of finding it busy.
        wait_until(lambda: run_job(runner, "s", check=False).returncode == 0, 60, what="a run after the stall")
    finally:
        proxy.close()
    assert digest(dst, "tank2/vm@s1") == digest(src, "tank/vm@s1")
