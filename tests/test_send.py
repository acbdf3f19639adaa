"""`cistern send` / `cistern receive` between two daemons on loopback: the
stream goes through files and pipes as with zfs; every snapshot on the
target reads back equal bit for bit; bad streams are refused and change
nothing."""

from __future__ import annotations

import hashlib
import json
import os
import select
import socket
import random
import subprocess
import time
from pathlib import Path

import pytest

from conftest import cistern_bin, run
from helpers import MiB, connected, two_daemons

SIZE = 64 * MiB


def nbd_sha(d, name: str, size: int = SIZE) -> str:
    h = hashlib.sha256()
    with connected(d.uri(name)) as c:
        for off in range(0, size, 4 * MiB):
            h.update(c.pread(min(4 * MiB, size - off), off))
    return h.hexdigest()


def scribble(d, name: str, rng: random.Random, n: int, size: int = SIZE):
    with connected(d.uri(name)) as c:
        for _ in range(n):
            off = rng.randrange(0, size // 4096) * 4096
            c.pwrite(rng.randbytes(rng.choice([4096, 65536])), min(off, size - 65536))
        c.flush()


@pytest.fixture
def pair(make_daemon, disks):
    """Two daemons: `src` with pool tank, `dst` with pool backup."""
    return two_daemons(make_daemon, disks)


def send_to_file(d, path, *args):
    with open(path, "wb") as f:
        p = subprocess.run([cistern_bin(), "send", *args], stdout=f, stderr=subprocess.PIPE, env=d.env(), timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    return path.read_bytes()


def receive_from(d, data: bytes, *args, check=True):
    p = subprocess.run([cistern_bin(), "receive", *args], input=data, capture_output=True, env=d.env(), timeout=300)
    if check:
        assert p.returncode == 0, p.stderr.decode()
    return p


def test_volume_full_then_incremental_via_cli(pair, tmp_path):
    src, dst = pair
    rng = random.Random(14)
    src.cli("create", "-V", "64M", "tank/vm")
    scribble(src, "tank/vm", rng, 300)
    src.cli("snapshot", "tank/vm@a")
    # A terminal is refused; -nv estimates without sending.
    est = src.cli("send", "-nvP", "tank/vm@a").stdout
    assert est.splitlines()[-1].startswith("size\t"), est
    full = send_to_file(src, tmp_path / "full", "tank/vm@a")
    assert abs(int(est.splitlines()[-1].split("\t")[1]) - len(full)) < len(full) // 10
    out = receive_from(dst, full, "-v", "backup/vm")
    assert "backup/vm@a" in out.stdout.decode()
    assert nbd_sha(dst, "backup/vm@a") == nbd_sha(src, "tank/vm@a")

    scribble(src, "tank/vm", rng, 20)
    src.cli("snapshot", "tank/vm@b")
    scribble(src, "tank/vm", rng, 20)
    src.cli("snapshot", "tank/vm@c")
    incr = send_to_file(src, tmp_path / "incr", "-I", "@a", "tank/vm@c")
    assert len(incr) < len(full) // 3, (len(incr), len(full))
    receive_from(dst, incr, "backup/vm")
    names = dst.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split()
    assert names == ["backup/vm@a", "backup/vm@b", "backup/vm@c"], names
    for s in "abc":
        assert nbd_sha(dst, f"backup/vm@{s}") == nbd_sha(src, f"tank/vm@{s}"), s


def test_damaged_stream_is_refused_and_target_unchanged(pair, tmp_path):
    src, dst = pair
    rng = random.Random(7)
    src.cli("create", "-V", "64M", "tank/vm")
    scribble(src, "tank/vm", rng, 100)
    src.cli("snapshot", "tank/vm@a")
    full = send_to_file(src, tmp_path / "full", "tank/vm@a")
    bad = bytearray(full)
    bad[len(bad) // 2] ^= 0x01
    p = receive_from(dst, bytes(bad), "backup/vm", check=False)
    assert p.returncode != 0 and b"checksum mismatch" in p.stderr, p.stderr
    assert dst.cli("list", "backup/vm", check=False).returncode != 0
    p = receive_from(dst, full[: len(full) * 2 // 3], "backup/vm", check=False)
    assert p.returncode != 0 and b"truncated" in p.stderr, p.stderr
    assert dst.cli("list", "backup/vm", check=False).returncode != 0
    receive_from(dst, full, "backup/vm")
    before = nbd_sha(dst, "backup/vm")
    scribble(src, "tank/vm", rng, 30)
    src.cli("snapshot", "tank/vm@b")
    incr = send_to_file(src, tmp_path / "incr", "-i", "tank/vm@a", "tank/vm@b")
    bad = bytearray(incr)
    bad[-40] ^= 0x80
    p = receive_from(dst, bytes(bad), "backup/vm", check=False)
    assert p.returncode != 0, p.stderr
    assert nbd_sha(dst, "backup/vm") == before
    assert dst.cli("list", "backup/vm@b", check=False).returncode != 0
    receive_from(dst, incr, "backup/vm")
    assert nbd_sha(dst, "backup/vm@b") == nbd_sha(src, "tank/vm@b")


def read_until_eof(f, timeout: float) -> int:
    """Bytes read from pipe `f` until EOF; fails after `timeout` s without it."""
    n, deadline = 0, time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "the pipe never ended"
        if select.select([f], [], [], left)[0]:
            chunk = os.read(f.fileno(), 1 << 20)
            if not chunk:
                return n
            n += len(chunk)


def test_local_stream_socket(pair, tmp_path):
    """A CLI on the daemon's host hands its stdout/stdin to the daemon over a
    private Unix socket (token checked) instead of relaying the stream; over
    HTTP (CISTERN_SEND_LOCAL=0) the bytes are the same; a killed CLI ends
    the daemon's side of the transfer."""
    src, dst = pair
    src.cli("create", "-V", "64M", "tank/vm")
    scribble(src, "tank/vm", random.Random(3), 600)
    src.cli("snapshot", "tank/vm@a")
    info = src.api("GET", "/v1/send/local")
    sock = Path(info["socket"])
    assert sock.stat().st_mode & 0o777 == 0o600 and sock.parent.stat().st_mode & 0o777 == 0o700
    # A wrong token is refused before the stream descriptor is touched.
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(30)
        s.connect(str(sock))
        f = s.makefile("rb")
        assert json.loads(f.readline())["id"] == info["id"]
        r, w = os.pipe()
        req = {"token": "0" * 64, "send": {"snapshot": "tank/vm@a"}}
        socket.send_fds(s, [json.dumps(req).encode() + b"\n"], [w])
        os.close(w)
        reply = json.loads(f.readline())
        assert reply["error"]["status"] == 401, reply
        with os.fdopen(r, "rb") as rf:
            assert read_until_eof(rf, 10) == 0
    local = send_to_file(src, tmp_path / "local", "tank/vm@a")
    assert "send (local)" in src.log_text()
    with open(tmp_path / "http", "wb") as f:
        env = dict(src.env(), CISTERN_SEND_LOCAL="0")
        subprocess.run([cistern_bin(), "send", "tank/vm@a"], stdout=f, env=env, check=True, timeout=120)
    assert (tmp_path / "http").read_bytes() == local
    # kill -9 of the send CLI while the daemon waits on a full pipe.
    p = subprocess.Popen([cistern_bin(), "send", "tank/vm@a"], stdout=subprocess.PIPE, env=src.env())
    got = len(p.stdout.read(64 << 10))
    p.kill()
    p.wait(30)
    got += read_until_eof(p.stdout, 30)
    assert got < len(local), "the daemon sent the whole stream to a killed CLI"
    p.stdout.close()
    # kill -9 of the receive CLI mid-stream: the receive fails, nothing is left.
    p = subprocess.Popen([cistern_bin(), "receive", "backup/vm"], stdin=subprocess.PIPE, env=dst.env())
    p.stdin.write(local[: len(local) // 2])
    p.stdin.flush()
    time.sleep(0.5)
    p.kill()
    p.wait(30)
    p.stdin.close()
    deadline = time.monotonic() + 30
    while dst.cli("list", "backup/vm", check=False).returncode == 0:
        assert time.monotonic() < deadline, "the receive of a killed CLI never ended"
        time.sleep(0.2)
    assert "receive (local)" in dst.log_text()
    receive_from(dst, local, "-v", "backup/vm")
    assert nbd_sha(dst, "backup/vm@a") == nbd_sha(src, "tank/vm@a")
    assert "receive -v backup/vm" in dst.cli("pool", "history", "backup").stdout


def test_send_refuses_a_terminal_and_bad_names(pair):
    src, _ = pair
    src.cli("create", "-V", "16M", "tank/vm")
    src.cli("snapshot", "tank/vm@a")
    # `script` gives the command a terminal as stdout.
    p = run(["script", "-qec", f"{cistern_bin()} --api {src.api_url} send tank/vm@a", "/dev/null"], check=False, env=src.env())
    assert p.returncode != 0 and "terminal" in p.stdout, p.stdout
    p = src.cli("send", "-n", "tank/vm@nope", check=False)
    assert p.returncode != 0 and "does not exist" in p.stderr, p.stderr
    p = src.cli("send", "-n", "-i", "@a", "tank/vm@a", check=False)
    assert p.returncode != 0 and "earlier" in p.stderr, p.stderr


def get_token(d, ds: str) -> str:
    return d.cli("get", "-H", "-o", "value", "receive_resume_token", ds).stdout.strip()


def snapshots(d) -> list[str]:
    return d.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split()


@pytest.mark.parametrize("resumable", [False, True])
def test_kill9_of_the_receiver_mid_stream(make_daemon, tmp_path, resumable):
    """The receiving daemon dies (SIGKILL) with half an incremental stream
    in: after the restart the target is its old self (snapshots and head);
    with -s it has a resume token and `send -t` completes the transfer."""
    src = make_daemon("src")
    # Small txgs: parts of the stream reach the disk before the kill.
    dst = make_daemon("dst", config="[engine]\ndirty_max_bytes = \"4M\"\n")
    for d, pool in ((src, "tank"), (dst, "backup")):
        disks = tmp_path / f"{pool}-disks"
        disks.mkdir()
        d.cli("pool", "create", "-s", "1G", pool, disks / "d0")
    rng = random.Random(99)
    src.cli("create", "-V", "64M", "tank/vm")
    scribble(src, "tank/vm", rng, 400)
    src.cli("snapshot", "tank/vm@a")
    full = send_to_file(src, tmp_path / "full", "tank/vm@a")
    receive_from(dst, full, "backup/vm")
    old_head = nbd_sha(dst, "backup/vm")
    with connected(src.uri("tank/vm")) as c:
        for off in range(0, SIZE, MiB):
            c.pwrite(rng.randbytes(MiB), off)
        c.flush()
    src.cli("snapshot", "tank/vm@b")
    incr = send_to_file(src, tmp_path / "incr", "-i", "@a", "tank/vm@b")

    args = [cistern_bin(), "receive", *(["-s"] if resumable else []), "backup/vm"]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dst.env())
    try:
        p.stdin.write(incr[: len(incr) * 3 // 5])
        p.stdin.flush()
        time.sleep(1.5)
        dst.kill9()
    finally:
        try:
            p.stdin.close()
        except BrokenPipeError:
            pass
        p.wait(60)
    assert p.returncode != 0
    dst.start()
    assert snapshots(dst) == ["backup/vm@a"]
    assert nbd_sha(dst, "backup/vm@a") == nbd_sha(src, "tank/vm@a")
    token = get_token(dst, "backup/vm")
    if not resumable:
        assert token == "-", token
        assert nbd_sha(dst, "backup/vm") == old_head, "head not back to @a"
        receive_from(dst, incr, "backup/vm")
    else:
        assert token.startswith("1-"), token
        rest = send_to_file(src, tmp_path / "rest", "-t", token)
        assert len(rest) < len(incr) * 9 // 10, (len(rest), len(incr))
        receive_from(dst, rest, "-s", "backup/vm")
        assert get_token(dst, "backup/vm") == "-"
    assert snapshots(dst) == ["backup/vm@a", "backup/vm@b"]
    assert nbd_sha(dst, "backup/vm@b") == nbd_sha(src, "tank/vm@b")


def test_receive_abort(pair, tmp_path):
    src, dst = pair
    src.cli("create", "-V", "16M", "tank/vm")
    scribble(src, "tank/vm", random.Random(1), 50, size=16 * MiB)
    src.cli("snapshot", "tank/vm@a")
    full = send_to_file(src, tmp_path / "full", "tank/vm@a")
    p = receive_from(dst, full[: len(full) // 2], "-s", "backup/vm", check=False)
    assert p.returncode != 0 and b"send -t" in p.stderr, p.stderr
    assert get_token(dst, "backup/vm").startswith("1-")
    dst.cli("receive", "-A", "backup/vm")
    assert dst.cli("list", "backup/vm", check=False).returncode != 0
    p = dst.cli("receive", "-A", "backup/vm", check=False)
    assert p.returncode != 0


def test_bucket_filled_through_s3_round_trips(make_s3, tmp_path):
    """A bucket filled with boto3, sent full then -I incremental to a
    second daemon: every object of every snapshot GETs back equal there."""
    src, dst = make_s3("src"), make_s3("dst")
    s3s, s3d = src.client(), dst.client()
    s3s.create_bucket(Bucket="photos")
    rng = random.Random(3)
    want = {}
    for i in range(30):
        body = rng.randbytes(rng.choice([100, 5000, 300_000]))
        s3s.put_object(Bucket="photos", Key=f"k/{i}", Body=body, Metadata={"n": str(i)})
        want[f"k/{i}"] = body
    src.cli("snapshot", f"{src.dataset('photos')}@s1")
    snaps = {"s1": dict(want)}
    for i in range(0, 10):
        body = rng.randbytes(7000)
        s3s.put_object(Bucket="photos", Key=f"k/{i}", Body=body)
        want[f"k/{i}"] = body
    for i in range(10, 15):
        s3s.delete_object(Bucket="photos", Key=f"k/{i}")
        del want[f"k/{i}"]
    src.cli("snapshot", f"{src.dataset('photos')}@s2")
    snaps["s2"] = dict(want)
    s3s.put_object(Bucket="photos", Key="late", Body=b"x")
    src.cli("snapshot", f"{src.dataset('photos')}@s3")
    want["late"] = b"x"
    snaps["s3"] = dict(want)

    full = send_to_file(src.daemon, tmp_path / "full", f"{src.dataset('photos')}@s1")
    receive_from(dst.daemon, full, dst.dataset("photos"))
    incr = send_to_file(src.daemon, tmp_path / "incr", "-I", "@s1", f"{src.dataset('photos')}@s3")
    receive_from(dst.daemon, incr, dst.dataset("photos"))

    def objects(client, bucket):
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
        return {k: client.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}

    for snap, expect in snaps.items():
        got = objects(s3d, dst.snapshot_bucket("photos", snap))
        assert got == expect, f"@{snap}: {sorted(got)} vs {sorted(expect)}"
    assert objects(s3d, "photos") == want
    assert s3d.head_object(Bucket="photos", Key="k/20")["Metadata"] == {"n": "20"}


def test_filesystem_round_trips(pair, tmp_path):
    """A filesystem written through FUSE (a tree with links, specials,
    modes), sent full then incremental: both snapshots on the second
    daemon read back equal through its own FUSE mount."""
    import test_fuse

    if test_fuse._why_not() is not None:
        pytest.skip(test_fuse._why_not())
    src, dst = pair
    ms, md = tmp_path / "ms", tmp_path / "md"
    src.cli("create", "tank/home")

    def mounted(d, ds, mnt, fn):
        d.cli("mount", ds, mnt)
        try:
            return fn()
        finally:
            d.cli("unmount", "-f", mnt, check=False)
            if test_fuse.is_mounted(mnt):
                subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)

    mounted(src, "tank/home", ms, lambda: test_fuse.make_tree(ms / "t", seed=4, files=120))
    src.cli("snapshot", "tank/home@1")

    def modify():
        files = sorted((ms / "t").rglob("*.bin"))
        for p in files[:10]:
            p.write_bytes(random.Random(str(p)).randbytes(9000))
        for p in files[10:20]:
            p.unlink()
        (ms / "t" / "new-dir").mkdir()
        (ms / "t" / "new-dir" / "n").write_text("new")

    mounted(src, "tank/home", ms, modify)
    src.cli("snapshot", "tank/home@2")
    want = mounted(src, "tank/home", ms, lambda: {s: test_fuse.tree_digest(ms / ".zfs" / "snapshot" / s / "t") for s in "12"})
    assert want["1"] != want["2"]

    full = send_to_file(src, tmp_path / "full", "tank/home@1")
    receive_from(dst, full, "backup/home")
    incr = send_to_file(src, tmp_path / "incr", "-i", "@1", "tank/home@2")
    receive_from(dst, incr, "backup/home")
    got = mounted(dst, "backup/home", md, lambda: {s: test_fuse.tree_digest(md / ".zfs" / "snapshot" / s / "t") for s in "12"})
    assert got == want


def test_ext4_volume_round_trips(pair, tmp_path):
    """ext4 on a volume (nbdfuse + mkfs.ext4 + loop mount), sent full and
    incremental: the target's snapshots read back equal (NBD sha256), pass
    e2fsck and hold the same files."""
    import test_filesystem as tf

    if tf._why_no_fs() is not None:
        pytest.skip(tf._why_no_fs())
    src, dst = pair
    size = 128 * MiB
    src.cli("create", "-V", "128M", "tank/fs")
    log = tmp_path / "nbdfuse.log"
    rng = random.Random(5)

    def write(n):
        with tf.nbdfuse(src.uri("tank/fs"), tmp_path / "mnt", log) as image:
            if n == 0:
                run(["mkfs.ext4", "-q", "-F", image], timeout=300)
            with tf.loop_mount(image, tmp_path / "fs") as fs:
                (fs / f"round{n}").mkdir()
                sums = tf._write_tree(fs / f"round{n}", rng, 60)
            fd = os.open(image, os.O_RDWR)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return sums

    write(0)
    src.cli("snapshot", "tank/fs@1")
    write(1)
    src.cli("snapshot", "tank/fs@2")
    receive_from(dst, send_to_file(src, tmp_path / "full", "tank/fs@1"), "backup/fs")
    receive_from(dst, send_to_file(src, tmp_path / "incr", "-i", "@1", "tank/fs@2"), "backup/fs")
    for s in "12":
        assert nbd_sha(dst, f"backup/fs@{s}", size) == nbd_sha(src, f"tank/fs@{s}", size), s
    with tf.nbdfuse(dst.uri("backup/fs@2"), tmp_path / "dmnt", log, read_only=True) as image:
        fsck = run(["e2fsck", "-f", "-n", image], check=False, timeout=300)
        assert fsck.returncode == 0, fsck.stdout + fsck.stderr


def test_bookmark_as_incremental_source(pair, tmp_path):
    """`cistern bookmark`, `list -t bookmark`, `send -i #NAME` after the
    snapshot is destroyed, `destroy DS#NAME` (as zfs)."""
    src, dst = pair
    rng = random.Random(40)
    src.cli("create", "-V", "64M", "tank/vm")
    scribble(src, "tank/vm", rng, 100)
    src.cli("snapshot", "tank/vm@a")
    receive_from(dst, send_to_file(src, tmp_path / "full", "tank/vm@a"), "backup/vm")
    src.cli("bookmark", "tank/vm@a", "#a")
    src.cli("bookmark", "tank/vm@a", "tank/vm#a2")
    bad = src.cli("bookmark", "tank/vm@a", "tank/vm#a", check=False)
    assert bad.returncode != 0 and "exists" in bad.stderr, bad.stderr
    src.cli("destroy", "tank/vm@a")
    rows = src.cli("list", "-H", "-p", "-t", "bookmark", "-o", "name,type,createtxg").stdout.splitlines()
    assert [r.split("\t")[:2] for r in rows] == [["tank/vm#a", "bookmark"], ["tank/vm#a2", "bookmark"]], rows
    assert int(rows[0].split("\t")[2]) > 0
    # Not in the default listing; with snapshots on request.
    assert "#" not in src.cli("list", "-H", "-o", "name").stdout
    both = src.cli("list", "-H", "-o", "name", "-t", "snapshot,bookmark", "tank/vm").stdout.split()
    assert both == ["tank/vm#a", "tank/vm#a2"], both

    scribble(src, "tank/vm", rng, 20)
    with connected(src.uri("tank/vm")) as c:
        c.trim(8 * MiB, 0)
        c.flush()
    src.cli("snapshot", "tank/vm@b")
    incr = send_to_file(src, tmp_path / "incr", "-i", "#a", "tank/vm@b")
    receive_from(dst, incr, "backup/vm")
    assert nbd_sha(dst, "backup/vm@b") == nbd_sha(src, "tank/vm@b")
    assert send_to_file(src, tmp_path / "incr2", "-i", "tank/vm#a2", "tank/vm@b") == incr

    src.cli("destroy", "tank/vm#a")
    assert src.cli("list", "-H", "-o", "name", "-t", "bookmark").stdout.split() == ["tank/vm#a2"]
    gone = src.cli("send", "-i", "#a", "tank/vm@b", check=False)
    assert gone.returncode != 0 and "tank/vm#a" in gone.stderr, gone.stderr


def test_recursive_send_of_a_tree(pair, tmp_path):
    """`send -R`: a filesystem with a volume and a filesystem below it,
    with snapshots and properties; incremental -R with a new child; a
    child destroyed on the source goes on the target only with -F."""
    src, dst = pair
    rng = random.Random(41)
    src.cli("create", "-o", "com.example:note=kept", "tank/top")
    src.cli("create", "-V", "64M", "-o", "compression=lz4", "tank/top/vol")
    src.cli("create", "tank/top/fs")
    scribble(src, "tank/top/vol", rng, 50)
    src.cli("snapshot", "-r", "tank/top@a")
    full = send_to_file(src, tmp_path / "full", "-R", "tank/top@a")
    out = receive_from(dst, full, "-v", "backup/top").stdout.decode()
    names = dst.cli("list", "-H", "-o", "name", "-t", "all", "-r", "backup/top").stdout.split()
    assert names == ["backup/top", "backup/top@a", "backup/top/fs", "backup/top/fs@a",
                     "backup/top/vol", "backup/top/vol@a"], (names, out)
    assert dst.props("backup/top")["com.example:note"] == "kept"
    assert dst.props("backup/top/vol")["compression"] == "lz4"
    assert nbd_sha(dst, "backup/top/vol@a") == nbd_sha(src, "tank/top/vol@a")

    src.cli("create", "-V", "64M", "tank/top/new")
    scribble(src, "tank/top/new", rng, 20)
    src.cli("destroy", "-r", "tank/top/fs")
    src.cli("snapshot", "-r", "tank/top@b")
    incr = send_to_file(src, tmp_path / "incr", "-R", "-i", "@a", "tank/top@b")
    receive_from(dst, incr, "backup/top")
    assert nbd_sha(dst, "backup/top/new@b") == nbd_sha(src, "tank/top/new@b")
    assert "backup/top/fs" in dst.cli("list", "-H", "-o", "name", "-r", "backup/top").stdout.split()
    src.cli("snapshot", "-r", "tank/top@c")
    incr = send_to_file(src, tmp_path / "incr2", "-R", "-I", "@b", "tank/top@c")
    receive_from(dst, incr, "-F", "backup/top")
    left = dst.cli("list", "-H", "-o", "name", "-r", "backup/top").stdout.split()
    assert left == ["backup/top", "backup/top/new", "backup/top/vol"], left


def test_streams_of_an_earlier_build_still_receive(make_daemon, disks, tmp_path):
    """Streams written by an earlier build (fixtures/send-streams-v1.tar.gz,
    made by tests/fixture_send_streams.py: plain v1 full and incremental, raw
    and recursive v2) are received by this one, equal to what was sent."""
    fixture = Path(__file__).resolve().parent.parent / "crates/dataset/tests/fixtures/send-streams-v1.tar.gz"
    s = tmp_path / "streams"
    s.mkdir()
    subprocess.run(["tar", "-xzf", str(fixture), "-C", str(s)], check=True)
    d = make_daemon()
    d.cli("pool", "create", "-s", "256M", "backup", disks / "d0")

    def pattern(n: int) -> bytes:
        return bytes((i * 7) % 251 for i in range(n))

    def sha(b: bytes) -> str:
        return hashlib.sha256(b).hexdigest()

    at_a = pattern(2 * MiB)
    at_b = b"\xab" * 65536 + at_a[65536:]
    receive_from(d, (s / "vol-a.full").read_bytes(), "backup/vol")
    receive_from(d, (s / "vol-ab.incr").read_bytes(), "backup/vol")
    receive_from(d, (s / "vol-b.raw").read_bytes(), "backup/raw")
    receive_from(d, (s / "tree-s.rec").read_bytes(), "backup/tree")
    assert nbd_sha(d, "backup/vol@a", 2 * MiB) == sha(at_a)
    for snap in ["backup/vol@b", "backup/raw@b"]:
        assert nbd_sha(d, snap, 2 * MiB) == sha(at_b), snap
    assert d.props("backup/raw")["compression"] == "lz4"
    assert d.props("backup/tree")["com.example:note"] == "kept"
    assert nbd_sha(d, "backup/tree/kid@s", MiB) == sha(pattern(MiB))
