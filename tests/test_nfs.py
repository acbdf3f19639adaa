"""NFSv3 through libnfs-utils (nfs-cp, nfs-ls, nfs-cat) against the real
daemon (`[nfs] listen`). libnfs looks for the portmapper on port 111 unless
told the ports: the URLs carry `nfsport=` and `mountport=` (both the
daemon's one NFS port; libnfs 4.0, Debian 12)."""

from __future__ import annotations

import os
import shutil

import pytest

from conftest import free_ports, run
from helpers import MiB, sha256_file

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("nfs-cp", "nfs-ls", "nfs-cat")),
    reason="libnfs-utils (nfs-cp, nfs-ls, nfs-cat) is not installed",
)


class Nfs:
    def __init__(self, daemon, port: int):
        self.d = daemon
        self.port = port

    def url(self, path: str) -> str:
        return f"nfs://127.0.0.1{path}?nfsport={self.port}&mountport={self.port}&version=3"

    def cp(self, src, dst, check=True):
        return run(["nfs-cp", src, dst], check=check, timeout=120)

    def ls(self, path: str, check=True):
        return run(["nfs-ls", self.url(path)], check=check, timeout=60)

    def cat(self, path: str) -> bytes:
        import subprocess

        p = subprocess.run(["nfs-cat", self.url(path)], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode(errors="replace")
        return p.stdout


def create_filesystem(daemon, name: str, **props):
    # The CLI makes volumes and buckets; filesystems through the API.
    daemon.api(
        "POST",
        "/v1/datasets",
        {"name": name, "volsize": 0, "kind": "filesystem", "properties": list(props.items())},
    )


@pytest.fixture
def nfs(make_daemon, disks):
    (port,) = free_ports(1)
    d = make_daemon(config=f'[nfs]\nlisten = "127.0.0.1:{port}"\n')
    d.cli("pool", "create", "-s", "2G", "tank", "mirror", disks / "d0", disks / "d1")
    create_filesystem(d, "tank/fs1", sharenfs="rw,no_root_squash")
    return Nfs(d, port)


def test_copy_list_and_read_back_across_a_restart(nfs, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * MiB + 123))
    nfs.cp(big, nfs.url("/tank/fs1/big.bin"))
    for i in range(20):
        small = tmp_path / f"s{i}.txt"
        small.write_text(f"small file {i}\n" * (i + 1))
        nfs.cp(small, nfs.url(f"/tank/fs1/s{i}.txt"))
    listing = nfs.ls("/tank/fs1").stdout
    assert "big.bin" in listing and "s19.txt" in listing, listing
    assert str(3 * MiB + 123) in listing, listing
    back = tmp_path / "back.bin"
    nfs.cp(nfs.url("/tank/fs1/big.bin"), back)
    assert sha256_file(back) == sha256_file(big)
    assert nfs.cat("/tank/fs1/s3.txt") == b"small file 3\n" * 4

    # The daemon restarts (same port, new write verifier): all still there.
    nfs.d.stop()
    nfs.d.start()
    back.unlink()
    nfs.cp(nfs.url("/tank/fs1/big.bin"), back)
    assert sha256_file(back) == sha256_file(big)
    assert nfs.cat("/tank/fs1/s19.txt") == b"small file 19\n" * 20


def test_snapshots_are_read_only_exports(nfs, tmp_path):
    f = tmp_path / "v1.txt"
    f.write_text("version 1\n")
    nfs.cp(f, nfs.url("/tank/fs1/doc.txt"))
    nfs.d.cli("snapshot", "tank/fs1@monday")
    g = tmp_path / "v2.txt"
    g.write_text("version 2, longer\n")
    nfs.cp(g, nfs.url("/tank/fs1/new.txt"))
    snap = "/tank/fs1/.zfs/snapshot/monday"
    assert nfs.cat(f"{snap}/doc.txt") == b"version 1\n"
    listing = nfs.ls(snap).stdout
    assert "doc.txt" in listing and "new.txt" not in listing, listing
    p = nfs.cp(g, nfs.url(f"{snap}/x.txt"), check=False)
    assert p.returncode != 0
    assert "ROFS" in p.stdout + p.stderr, p.stdout + p.stderr
    # The `@` spelling names the same snapshot.
    assert nfs.cat("/tank/fs1@monday/doc.txt") == b"version 1\n"


def test_sharenfs_decides_who_gets_in(nfs, tmp_path):
    f = tmp_path / "f.txt"
    f.write_text("x\n")
    # `on`: loopback read-write, root squashed to nobody (the root is 0755 root).
    nfs.d.cli("set", "sharenfs=on", "tank/fs1")
    nfs.ls("/tank/fs1")
    p = nfs.cp(f, nfs.url("/tank/fs1/f.txt"), check=False)
    assert p.returncode != 0 and "ACCES" in p.stdout + p.stderr, p.stdout + p.stderr
    # Only another network: loopback may not mount.
    nfs.d.cli("set", "sharenfs=rw=192.0.2.0/24", "tank/fs1")
    assert nfs.ls("/tank/fs1", check=False).returncode != 0
    # off: not exported at all.
    nfs.d.cli("set", "sharenfs=off", "tank/fs1")
    assert nfs.ls("/tank/fs1", check=False).returncode != 0
    # A typo is refused when set, naming the option; the share is unchanged.
    p = nfs.d.cli("set", "sharenfs=rw,no_root_sqash", "tank/fs1", check=False)
    assert p.returncode != 0 and "no_root_sqash" in p.stderr, p.stderr
    assert nfs.d.prop("tank/fs1", "sharenfs") == "off"
    assert nfs.d.panics() == []
    # Inherited as zfs: set on the pool's root, the child is shared.
    nfs.d.cli("inherit", "sharenfs", "tank/fs1")
    nfs.d.cli("set", "sharenfs=rw,no_root_squash", "tank")
    nfs.cp(f, nfs.url("/tank/fs1/f.txt"))
    assert nfs.cat("/tank/fs1/f.txt") == b"x\n"


def test_a_copy_nfs_cp_finished_survives_kill9(nfs, tmp_path):
    # nfs-cp writes UNSTABLE and COMMITs before it returns: the COMMIT is
    # the intent log, so the file is whole after kill -9 and a restart.
    data = tmp_path / "data.bin"
    data.write_bytes(os.urandom(8 * MiB + 5))
    nfs.cp(data, nfs.url("/tank/fs1/data.bin"))
    nfs.d.kill9()
    nfs.d.start()
    back = tmp_path / "back.bin"
    nfs.cp(nfs.url("/tank/fs1/data.bin"), back)
    assert sha256_file(back) == sha256_file(data)
