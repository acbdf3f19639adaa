"""A real filesystem on a volume: nbdfuse exposes the export as a file,
mkfs.ext4 formats it, the kernel loop-mounts it, and a tree of files must
come back bit for bit after the daemon restarts."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import popen, run
from helpers import KiB, MiB, sha256_file, wait_until


def _why_no_fs() -> str | None:
    if os.geteuid() != 0:
        return "needs root for mount -o loop"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse is missing"
    for tool in ("nbdfuse", "fusermount3", "mkfs.ext4", "e2fsck", "losetup"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices (/dev/loop-control missing)"
    p = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"no free loop device: {p.stderr.strip()}"
    return None


pytestmark = pytest.mark.skipif(_why_no_fs() is not None, reason=_why_no_fs() or "")


@contextlib.contextmanager
def nbdfuse(uri: str, mnt: Path, log: Path, read_only: bool = False):
    """Mounts `uri` as the file mnt/nbd; unmounts (fusermount3 -u) on exit."""
    mnt.mkdir(exist_ok=True)
    pidfile = mnt.parent / f"{mnt.name}.pid"
    pidfile.unlink(missing_ok=True)
    with open(log, "ab") as lf:
        p = popen(["nbdfuse", *(["-r"] if read_only else []), "-P", pidfile, mnt, uri], stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: pidfile.exists() or p.poll() is not None, 30, what="nbdfuse ready")
        assert p.poll() is None, f"nbdfuse exited with {p.returncode}: {log.read_text(errors='replace')}"
        yield mnt / "nbd"
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


@contextlib.contextmanager
def loop_mount(image: Path, target: Path):
    target.mkdir(exist_ok=True)
    run(["mount", "-o", "loop", image, target])
    try:
        yield target
    finally:
        p = subprocess.run(["umount", str(target)], capture_output=True, text=True)
        if p.returncode != 0:  # never leave a mount behind
            time.sleep(1)
            subprocess.run(["umount", "-l", str(target)], capture_output=True)


def _write_tree(root: Path, rng: random.Random, n_files: int) -> dict[str, str]:
    sums = {}
    dirs = [root]
    for i in range(20):
        d = rng.choice(dirs) / f"dir{i}"
        d.mkdir()
        dirs.append(d)
    for i in range(n_files):
        size = rng.choice([0, 1, 100, 4095, 4096, 4097, 16 * KiB, 65 * KiB]) if i % 3 else rng.randrange(0, 2 * MiB)
        # Half the files compressible (text-like), half random.
        if i % 2:
            data = rng.randbytes(size)
        else:
            data = (f"line {i} " * (size // 7 + 1)).encode()[:size]
        path = rng.choice(dirs) / f"f{i:04d}.bin"
        path.write_bytes(data)
        sums[str(path.relative_to(root))] = sha256_file(path)
    # Some overwrites and deletions too.
    for rel in rng.sample(sorted(sums), 20):
        p = root / rel
        if rng.random() < 0.5:
            p.unlink()
            del sums[rel]
        else:
            with open(p, "r+b") as f:
                f.seek(0, os.SEEK_END)
                f.write(rng.randbytes(10000))
            sums[rel] = sha256_file(p)
    return sums


def _read_tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            rel = str(p.relative_to(root))
            if rel.startswith("lost+found"):
                continue
            out[rel] = sha256_file(p)
    return out


@pytest.mark.parametrize("stop", ["sigterm", "sigkill_after_fsync"])
def test_ext4_on_volume_survives_restart(make_volume, tmp_path, stop):
    vol = make_volume("fs", "1G", compression="lz4")
    d = vol.daemon
    rng = random.Random(42)
    fuse_log = tmp_path / "nbdfuse.log"
    with nbdfuse(vol.uri, tmp_path / "mnt", fuse_log) as image:
        assert image.stat().st_size == 1 << 30
        run(["mkfs.ext4", "-q", "-F", image], timeout=300)
        with loop_mount(image, tmp_path / "fs") as fs:
            sums = _write_tree(fs, rng, 300)
            assert len(sums) >= 280
        # ext4 is unmounted: make nbdfuse push everything and FLUSH the export.
        fd = os.open(image, os.O_RDWR)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    if stop == "sigterm":
        assert d.stop() == 0
    else:
        d.kill9()
    d.start()
    with nbdfuse(vol.uri, tmp_path / "mnt", fuse_log) as image:
        fsck = run(["e2fsck", "-f", "-n", image], check=False, timeout=300)
        assert fsck.returncode == 0, f"e2fsck found problems:\n{fsck.stdout}\n{fsck.stderr}"
        with loop_mount(image, tmp_path / "fs") as fs:
            got = _read_tree(fs)
    missing = sorted(set(sums) - set(got))
    extra = sorted(set(got) - set(sums))
    changed = sorted(k for k in sums if k in got and got[k] != sums[k])
    assert not missing and not extra and not changed, (
        f"{len(missing)} missing {missing[:5]}, {len(extra)} unexpected {extra[:5]}, "
        f"{len(changed)} with different content {changed[:5]}"
    )
