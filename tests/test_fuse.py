"""Filesystem datasets through the daemon's FUSE mount, used with real tools:
cp -a, rsync -a, find, stat, ln, mkfifo, setfattr/getfattr, truncate,
fallocate; snapshots under .zfs/snapshot; rollback, destroy and kill -9
while mounted."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import random
import re
import shutil
import stat
import subprocess
import termios
import time
from pathlib import Path

import pytest

from conftest import popen, run
from helpers import MiB, wait_until


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the daemon mounts as root in this suite"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    for tool in ("fusermount3", "rsync", "setfattr", "getfattr", "fallocate", "mkfifo"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


def is_mounted(d: Path) -> bool:
    want = str(d)
    with open("/proc/self/mountinfo") as f:
        return any(l.split(" ")[4] == want for l in f)


@pytest.fixture
def fs(daemon, pool, tmp_path):
    """tank/home mounted at tmp_path/mnt by `cistern mount`; unmounted after."""
    mnt = tmp_path / "mnt"
    daemon.cli("create", f"{pool}/home")  # no -V: a filesystem, as zfs
    daemon.cli("mount", f"{pool}/home", mnt)
    assert is_mounted(mnt)
    yield mnt
    daemon.cli("unmount", "-f", mnt, check=False)
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def tree_digest(root: Path) -> dict[str, tuple]:
    """Every entry below root: type, mode, size, content hash or link target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_size, st.st_nlink,
                            hashlib.sha256(p.read_bytes()).hexdigest(), int(st.st_mtime))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("o", stat.S_IFMT(st.st_mode))
    return out


def make_tree(root: Path, seed: int = 1, files: int = 300):
    rng = random.Random(seed)
    root.mkdir(parents=True)
    dirs = [root]
    for i in range(files):
        if rng.random() < 0.15:
            d = rng.choice(dirs) / f"dir{i}"
            d.mkdir()
            os.chmod(d, rng.choice([0o755, 0o700, 0o775]))
            dirs.append(d)
            continue
        size = rng.choice([0, 1, 100, 4095, 4096, 5000, 70_000, 300_000])
        p = rng.choice(dirs) / f"file{i}.bin"
        p.write_bytes(rng.randbytes(size))
        os.chmod(p, rng.choice([0o644, 0o600, 0o755, 0o444]))
    (root / "link-to-file").symlink_to("file1.bin")
    (root / "dangling").symlink_to("nowhere/at/all")
    first = next(p for p in root.rglob("*.bin"))
    os.link(first, root / "hardlink.bin")
    os.mkfifo(root / "fifo")


def test_cp_and_rsync_round_trip(fs, tmp_path):
    src = tmp_path / "src"
    make_tree(src)
    want = tree_digest(src)
    run(["cp", "-a", src, fs / "cp"])
    assert tree_digest(fs / "cp") == want
    run(["rsync", "-aH", f"{src}/", f"{fs}/rsync/"])
    assert tree_digest(fs / "rsync") == want
    # ... and out again.
    run(["cp", "-a", fs / "cp", tmp_path / "back-cp"])
    assert tree_digest(tmp_path / "back-cp") == want
    run(["rsync", "-aH", f"{fs}/rsync/", f"{tmp_path}/back-rsync/"])
    assert tree_digest(tmp_path / "back-rsync") == want
    # find sees the same names, and a second rsync has nothing to send.
    names = sorted(run(["find", "."], cwd=src).stdout.split())
    assert sorted(run(["find", "."], cwd=fs / "cp").stdout.split()) == names
    p = run(["rsync", "-aHi", "--dry-run", f"{src}/", f"{fs}/rsync/"])
    assert p.stdout.strip() == "", p.stdout


def test_links_specials_xattrs_truncate_rename(fs):
    a = fs / "a"
    a.write_bytes(b"hello")
    os.link(a, fs / "b")
    sa, sb = a.stat(), (fs / "b").stat()
    assert sa.st_ino == sb.st_ino and sa.st_nlink == 2
    os.symlink("a", fs / "s")
    assert os.readlink(fs / "s") == "a" and (fs / "s").read_bytes() == b"hello"
    os.mkfifo(fs / "p")
    assert stat.S_ISFIFO((fs / "p").lstat().st_mode)
    os.mknod(fs / "dev", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert (fs / "dev").lstat().st_rdev == os.makedev(1, 3)

    run(["setfattr", "-n", "user.colour", "-v", "blue", a])
    assert "user.colour=\"blue\"" in run(["getfattr", "-d", a]).stdout
    big = "x" * 3000  # getfattr probes the size first
    run(["setfattr", "-n", "user.big", "-v", big, a])
    assert run(["getfattr", "--only-values", "-n", "user.big", a]).stdout == big
    run(["setfattr", "-x", "user.colour", a])
    assert "colour" not in run(["getfattr", "-d", a]).stdout
    assert run(["getfattr", "-n", "user.none", a], check=False).returncode != 0

    run(["truncate", "-s", "1M", a])
    assert a.stat().st_size == MiB and (fs / "b").read_bytes()[:5] == b"hello"
    assert (fs / "b").read_bytes()[5:] == bytes(MiB - 5)
    run(["truncate", "-s", "2", a])
    assert a.read_bytes() == b"he"
    run(["fallocate", "-l", "3M", fs / "falloc"])
    assert (fs / "falloc").stat().st_size == 3 * MiB
    run(["fallocate", "-p", "-o", "0", "-l", "1", a])  # punch hole keeps the size
    assert a.read_bytes() == b"\0e"

    # rename over an existing file replaces it atomically; the old one goes.
    (fs / "new").write_bytes(b"new")
    (fs / "old").write_bytes(b"old")
    old_ino = (fs / "old").stat().st_ino
    os.rename(fs / "new", fs / "old")
    assert (fs / "old").read_bytes() == b"new" and not (fs / "new").exists()
    assert (fs / "old").stat().st_ino != old_ino
    os.mkdir(fs / "d1")
    (fs / "d1" / "f").write_text("in d1")
    os.rename(fs / "d1", fs / "d2")
    assert (fs / "d2" / "f").read_text() == "in d1"
    assert (fs / "d2").stat().st_nlink == 2 and fs.stat().st_nlink == 3

    # An open file that loses its name stays readable until closed.
    with open(fs / "open-unlinked", "w+b") as f:
        f.write(b"still here")
        f.flush()
        os.unlink(fs / "open-unlinked")
        f.seek(0)
        assert f.read() == b"still here"


def test_big_file_write_read(fs, tmp_path):
    data = random.Random(7).randbytes(64 * MiB)
    src = tmp_path / "big"
    src.write_bytes(data)
    run(["cp", src, fs / "big"])
    run(["sync", "-f", fs / "big"])
    assert hashlib.sha256((fs / "big").read_bytes()).digest() == hashlib.sha256(data).digest()
    # Overwrite the middle in place.
    with open(fs / "big", "r+b") as f:
        f.seek(10 * MiB + 3)
        f.write(b"X" * 100_000)
    want = data[: 10 * MiB + 3] + b"X" * 100_000 + data[10 * MiB + 3 + 100_000:]
    assert hashlib.sha256((fs / "big").read_bytes()).digest() == hashlib.sha256(want).digest()
    df = os.statvfs(fs)
    assert df.f_blocks > 0 and df.f_bfree > 0


def test_unknown_ioctl_is_enotty_and_not_logged(daemon, fs):
    """An ioctl the filesystem does not know is ENOTTY, as on a disk
    filesystem (Python's open asks every file isatty); fuser's default logged
    each one at WARN as not implemented."""
    p = fs / "t"
    p.write_text("x")
    with open(p, "rb") as f:
        assert not os.isatty(f.fileno())
        with pytest.raises(OSError) as e:
            fcntl.ioctl(f.fileno(), termios.TCGETS, bytes(64))
        assert e.value.errno == errno.ENOTTY
    assert p.read_text() == "x"
    assert "Not Implemented" not in daemon.log_text()


def test_inode_numbers_stable_across_remount_and_restart(daemon, pool, tmp_path):
    mnt = tmp_path / "home"
    daemon.cli("create", "-t", "filesystem", "-o", f"mountpoint={mnt}", f"{pool}/home")
    wait_until(lambda: is_mounted(mnt), 30, what="mounted at create")
    (mnt / "d").mkdir()
    (mnt / "d" / "f").write_text("x")
    (mnt / "g").write_text("y")
    before = {p: os.lstat(mnt / p).st_ino for p in ("d", "d/f", "g")}
    before_root = os.stat(mnt).st_ino
    daemon.cli("unmount", f"{pool}/home")
    assert not is_mounted(mnt)
    # a clean unmount warns about nothing (fuser's unmount when its session is
    # dropped, after ours, used to log "Unmount failed: Invalid argument")
    warned = [l for l in daemon.log_text().splitlines() if re.search(r" (WARN|ERROR) .*[Uu]nmount", l)]
    assert not warned, warned
    daemon.cli("mount", f"{pool}/home")
    assert {p: os.lstat(mnt / p).st_ino for p in before} == before
    daemon.restart()
    wait_until(lambda: is_mounted(mnt), 30, what="mounted again at start")
    assert {p: os.lstat(mnt / p).st_ino for p in before} == before
    assert os.stat(mnt).st_ino == before_root
    # `cistern mount` lists it as zfs mount does.
    out = daemon.cli("mount").stdout
    assert f"{pool}/home\t{mnt}" in out, out


def test_fsync_survives_kill9(daemon, pool, tmp_path):
    mnt = tmp_path / "home"
    daemon.cli("create", "-t", "filesystem", "-o", f"mountpoint={mnt}", f"{pool}/home")
    wait_until(lambda: is_mounted(mnt), 30, what="mounted")
    data = random.Random(3).randbytes(3 * MiB + 17)
    script = (
        "import os,sys\n"
        f"fd = os.open({str(mnt / 'durable')!r}, os.O_CREAT | os.O_WRONLY, 0o644)\n"
        "d = sys.stdin.buffer.read()\n"
        "os.write(fd, d); os.fsync(fd); os.close(fd)\n"
        f"d2 = os.open({str(mnt)!r}, os.O_RDONLY); os.fsync(d2)\n"
        "print('synced', flush=True)\n"
    )
    p = subprocess.run(["python3", "-c", script], input=data, capture_output=True, timeout=120)
    assert p.returncode == 0 and b"synced" in p.stdout, p.stderr
    daemon.kill9()
    try:
        # The connection died with the daemon.
        with pytest.raises(OSError) as e:
            os.stat(mnt / "durable")
        assert e.value.errno == errno.ENOTCONN
        daemon.start()
        wait_until(lambda: is_mounted(mnt) and (mnt / "durable").exists(), 60, what="remounted")
        assert (mnt / "durable").read_bytes() == data
        daemon.cli("unmount", mnt)
    finally:
        if is_mounted(mnt) and not daemon.alive():
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_snapshot_directory(daemon, pool, fs):
    (fs / "f").write_text("one")
    (fs / "sub").mkdir()
    (fs / "sub" / "g").write_text("deep")
    daemon.cli("snapshot", f"{pool}/home@first")
    (fs / "f").write_text("two")
    (fs / "later").write_text("new")
    # Hidden from the listing (snapdir=hidden), reachable by name.
    assert ".zfs" not in os.listdir(fs)
    assert os.listdir(fs / ".zfs") == ["snapshot"]
    assert os.listdir(fs / ".zfs" / "snapshot") == ["first"]
    snap = fs / ".zfs" / "snapshot" / "first"
    assert (snap / "f").read_text() == "one"
    assert (snap / "sub" / "g").read_text() == "deep"
    assert not (snap / "later").exists()
    assert sorted(os.listdir(snap)) == ["f", "sub"]
    # Same object, its own inode number in the snapshot.
    assert (snap / "f").stat().st_ino != (fs / "f").stat().st_ino
    with pytest.raises(OSError) as e:
        (snap / "x").write_text("no")
    assert e.value.errno == errno.EROFS
    with pytest.raises(OSError) as e:
        open(snap / "f", "w")
    assert e.value.errno == errno.EROFS
    # A new snapshot appears without remounting; snapdir=visible shows .zfs.
    daemon.cli("snapshot", f"{pool}/home@second")
    wait_until(lambda: sorted(os.listdir(fs / ".zfs" / "snapshot")) == ["first", "second"], 10,
               what="new snapshot listed")
    assert (fs / ".zfs" / "snapshot" / "second" / "f").read_text() == "two"
    daemon.cli("set", "snapdir=visible", f"{pool}/home")
    wait_until(lambda: ".zfs" in os.listdir(fs), 10, what=".zfs visible")
    assert "find: " not in run(["find", fs / ".zfs" / "snapshot"], check=False).stderr


def test_rollback_while_mounted_serves_the_old_data(daemon, pool, fs):
    (fs / "f").write_bytes(b"A" * 10_000)
    (fs / "d").mkdir()
    daemon.cli("snapshot", f"{pool}/home@s")
    with open(fs / "f", "r+b") as f:
        f.write(b"B" * 5_000)
    (fs / "created-later").write_text("x")
    (fs / "d" / "inside").write_text("y")
    # Read everything once so the kernel caches pages, attributes and names.
    assert (fs / "f").read_bytes()[:5000] == b"B" * 5000
    assert (fs / "created-later").exists() and (fs / "d" / "inside").exists()
    keep = open(fs / "f", "rb")  # an open file does not block a rollback
    daemon.cli("rollback", f"{pool}/home@s")
    assert (fs / "f").read_bytes() == b"A" * 10_000
    assert not (fs / "created-later").exists()
    assert os.listdir(fs / "d") == []
    assert sorted(os.listdir(fs)) == ["d", "f"]
    keep.seek(0)
    assert keep.read(3) == b"AAA"
    keep.close()


def test_destroy_refused_while_mounted(daemon, pool, fs):
    (fs / "f").write_text("x")
    p = daemon.cli("destroy", f"{pool}/home", check=False)
    assert p.returncode != 0 and "busy" in p.stderr, p.stderr
    assert (fs / "f").read_text() == "x"
    # Busy unmount refuses; -f detaches.
    with open(fs / "f") as held:
        p = daemon.cli("unmount", fs, check=False)
        assert p.returncode != 0 and "busy" in p.stderr, p.stderr
        assert is_mounted(fs)
        held.read()
    daemon.cli("destroy", "-f", f"{pool}/home")
    assert not is_mounted(fs)
    assert daemon.cli("mount").stdout.strip() == ""


def test_set_mountpoint_moves_the_mount(daemon, pool, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    daemon.cli("create", "-t", "filesystem", f"{pool}/fs")
    daemon.cli("set", f"mountpoint={a}", f"{pool}/fs")
    wait_until(lambda: is_mounted(a), 30, what="mounted at a")
    (a / "x").write_text("moved")
    daemon.cli("set", f"mountpoint={b}", f"{pool}/fs")
    assert not is_mounted(a) and is_mounted(b)
    assert (b / "x").read_text() == "moved"
    # Inherited below: a child mounts under it.
    daemon.cli("create", "-t", "filesystem", f"{pool}/fs/kid")
    wait_until(lambda: is_mounted(b / "kid"), 30, what="child mounted")
    daemon.cli("umount", "-a")
    assert not is_mounted(b) and not is_mounted(b / "kid")
    daemon.cli("mount", "-a")
    assert is_mounted(b) and is_mounted(b / "kid")
    daemon.cli("set", "mountpoint=none", f"{pool}/fs")
    assert not is_mounted(b) and not is_mounted(b / "kid")
    # Export unmounts; import mounts again.
    daemon.cli("set", f"mountpoint={a}", f"{pool}/fs")
    assert is_mounted(a)
    daemon.cli("pool", "export", pool)
    assert not is_mounted(a)


def test_a_full_quota_is_reported_at_fsync_not_lost(daemon, pool, fs):
    """With the writeback cache, write(2) returns before the data reaches the
    engine: a write-back refused by the quota must fail fsync and close."""
    daemon.cli("set", "quota=4M", f"{pool}/home")
    data = os.urandom(8 << 20)
    fd = os.open(fs / "big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        with pytest.raises(OSError) as e:
            os.write(fd, data)
            os.fsync(fd)
        assert e.value.errno in (errno.EDQUOT, errno.ENOSPC, errno.EIO), e.value
    finally:
        try:
            os.close(fd)
        except OSError:
            pass  # close reports it too
    daemon.cli("set", "quota=none", f"{pool}/home")
    (fs / "small").write_bytes(b"fits now")
    assert (fs / "small").read_bytes() == b"fits now"
