"""`cistern send` / `cistern receive` between two daemons on loopback: the
stream goes through files and pipes as with zfs; every snapshot on the
target reads back equal bit for bit; bad streams are refused and change
nothing."""

from __future__ import annotations

import hashlib
import random
import subprocess
import time

import pytest

from conftest import cistern_bin, run
from helpers import MiB, connected

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
def pair(make_daemon, tmp_path):
    """Two daemons: `src` with pool tank, `dst` with pool backup."""
    src, dst = make_daemon("src"), make_daemon("dst")
    for d, pool in ((src, "tank"), (dst, "backup")):
        disks = tmp_path / f"{pool}-disks"
        disks.mkdir()
        d.cli("pool", "create", "-s", "1G", pool, disks / "d0")
    return src, dst


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
