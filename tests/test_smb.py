"""SMB shares: the daemon's private smbd serves filesystems with sharesmb or
timemachine set, and the real smbclient puts, gets and lists files on them
over 127.0.0.1.

Until the daemon FUSE-mounts filesystems at their mountpoint, the share's
path is a plain directory the test makes; DAEMON_MOUNTS switches to the real
mount (the files are then checked through it)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from conftest import free_ports, run

# The one line to change once `mountpoint` is FUSE-mounted by the daemon.
DAEMON_MOUNTS = True

USER, PASSWORD = "root", "cistern-smb-test"


def _why_not() -> str | None:
    for tool in ("smbd", "smbclient", "smbpasswd"):
        if not shutil.which(tool, path=os.environ.get("PATH", "") + ":/usr/sbin"):
            return f"{tool} is not installed (samba, smbclient)"
    if not Path("/usr/lib/x86_64-linux-gnu/samba/vfs/fruit.so").exists() and not list(
        Path("/usr/lib").glob("*/samba/vfs/fruit.so")
    ):
        return "Samba's VFS modules are not installed (samba-vfs-modules)"
    if os.geteuid() != 0:
        return "smbd serves other users' files only as root"
    return None


needs_samba = pytest.mark.skipif(_why_not() is not None, reason=_why_not() or "")


class Smb:
    """A daemon with [smb] on its own port, pool `tank`, and helpers."""

    def __init__(self, make_daemon, tmp_path: Path):
        (self.port,) = free_ports(1)
        self.d = make_daemon(config=f'[smb]\nlisten = "127.0.0.1:{self.port}"\ntimemachine_quiet_secs = 1\n')
        disks = tmp_path / "disks"
        disks.mkdir()
        self.d.cli("pool", "create", "-s", "2G", "tank", "mirror", disks / "d0", disks / "d1")
        self.mnt = tmp_path / "mnt"
        self.mnt.mkdir()
        self.d.cli("set", f"mountpoint={self.mnt}", "tank")
        self.conf = self.d.state_dir / "smb" / "smb.conf"
        # The daemon writes its smb.conf at start; accounts live in its private passdb.
        run(["smbpasswd", "-c", self.conf, "-a", "-s", USER], input=f"{PASSWORD}\n{PASSWORD}\n")

    def create_fs(self, name: str) -> Path:
        """A filesystem dataset; returns its mountpoint (made by hand until the daemon mounts)."""
        self.d.api("POST", "/v1/datasets", {"name": name, "volsize": 0, "kind": "filesystem"})
        path = self.mnt / name.split("/", 1)[1]
        if not DAEMON_MOUNTS:
            path.mkdir(parents=True)
        return path

    def client(self, share: str, commands: str, check: bool = True):
        return run(
            ["smbclient", f"//127.0.0.1/{share}", "-p", self.port, "-U", f"{USER}%{PASSWORD}", "-c", commands],
            check=check,
            timeout=60,
        )

    def connects(self, share: str) -> bool:
        p = self.client(share, "ls", check=False)
        if p.returncode == 0:
            return True
        assert "NT_STATUS_BAD_NETWORK_NAME" in p.stdout + p.stderr, p.stdout + p.stderr
        return False


@pytest.fixture
def smb(make_daemon, tmp_path) -> Smb:
    return Smb(make_daemon, tmp_path)


def _our_processes(conf: Path) -> list[str]:
    """smbd / samba-dcerpcd processes started on this smb.conf."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        args = [a.decode(errors="replace") for a in cmd if a]
        if any(str(conf) in a for a in args) and state != "Z":
            out.append(f"{p.name} {' '.join(args)}")
    return out


@needs_samba
def test_put_get_ls_on_a_share(smb, tmp_path):
    home = smb.create_fs("tank/home")
    smb.d.cli("set", "sharesmb=on", "tank/home")
    data = os.urandom(3 << 20) + b"end"
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    smb.client("tank_home", f"mkdir docs; put {src} docs/report.bin")
    listing = smb.client("tank_home", "ls docs/*").stdout
    line = next(l for l in listing.splitlines() if "report.bin" in l)
    assert str(len(data)) in line.split(), listing
    back = tmp_path / "back.bin"
    smb.client("tank_home", f"get docs/report.bin {back}")
    assert back.read_bytes() == data
    # And the filesystem holds it where the share points.
    assert (home / "docs" / "report.bin").read_bytes() == data
    shares = run(["smbclient", "-L", "127.0.0.1", "-p", smb.port, "-U", f"{USER}%{PASSWORD}"]).stdout
    assert "tank_home" in shares and "Cistern dataset tank/home" in shares


@needs_samba
def test_set_share_unshare_take_effect_without_restart(smb):
    smb.create_fs("tank/a")
    smb.create_fs("tank/b")
    smb.d.cli("set", "sharesmb=on", "tank/a")
    assert smb.connects("tank_a") and not smb.connects("tank_b")
    smb.d.cli("set", "sharesmb=name=Bee", "tank/b")
    assert smb.connects("Bee")
    smb.d.cli("set", "sharesmb=off", "tank/a")
    assert not smb.connects("tank_a")
    smb.d.cli("inherit", "sharesmb", "tank/a")  # back to off (default)
    assert not smb.connects("tank_a")
    smb.d.cli("set", "sharesmb=on", "tank/a")
    # unshare lasts until share; the property is untouched.
    smb.d.cli("unshare", "tank/a")
    assert not smb.connects("tank_a") and smb.connects("Bee")
    assert smb.d.prop("tank/a", "sharesmb") == "on"
    p = smb.d.cli("unshare", "tank/a", check=False)
    assert p.returncode != 0 and "not currently shared" in p.stderr
    smb.d.cli("share", "tank/a")
    assert smb.connects("tank_a")
    smb.d.cli("unshare", "-a")
    assert not smb.connects("tank_a") and not smb.connects("Bee")
    smb.d.cli("share", "-a")
    assert smb.connects("tank_a") and smb.connects("Bee")
    # Clear errors for what cannot be shared.
    smb.create_fs("tank/c")
    p = smb.d.cli("share", "tank/c", check=False)
    assert p.returncode != 0 and "'sharesmb' not set" in p.stderr, p.stderr
    p = smb.d.cli("set", "sharesmb=name=a/b", "tank/c", check=False)
    assert p.returncode == 0  # checked when shared, as zfs
    p = smb.d.cli("share", "tank/c", check=False)
    assert p.returncode != 0 and "contains '/'" in p.stderr, p.stderr
    # A share the other ones did not lose.
    assert smb.connects("tank_a")


@needs_samba
def test_time_machine_share_reports_its_size_limit(smb):
    smb.create_fs("tank/tm")
    smb.d.cli("set", "timemachine=on", "tank/tm")
    smb.d.cli("set", "tm_max_size=32M", "tank/tm")
    # timemachine=on shares without sharesmb; the limit is the disk size Macs see.
    out = smb.client("tank_tm", "ls").stdout
    footer = next(l for l in out.splitlines() if "blocks of size" in l).split()
    assert int(footer[0]) * int(footer[4].rstrip(".")) == 32 << 20, out
    conf = smb.conf.read_text()
    assert "fruit:time machine = yes" in conf and f"fruit:time machine max size = {32 << 20}" in conf


@needs_samba
def test_smbd_stops_with_the_daemon_and_after_kill9(smb):
    smb.create_fs("tank/home")
    smb.d.cli("set", "sharesmb=on", "tank/home")
    # -L starts samba-dcerpcd, which leaves smbd's process group.
    run(["smbclient", "-L", "127.0.0.1", "-p", smb.port, "-U", f"{USER}%{PASSWORD}"])
    assert _our_processes(smb.conf)
    smb.d.kill9()
    # A new daemon takes the port back from the orphaned smbd.
    smb.d.start()
    assert smb.connects("tank_home")
    assert smb.d.stop() == 0
    deadline = time.monotonic() + 15
    while _our_processes(smb.conf) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _our_processes(smb.conf) == []


def test_without_smbd_the_daemon_says_so_once_and_serves_on(make_daemon, tmp_path):
    d = make_daemon(config='[smb]\nsmbd = "/nonexistent/smbd"\nbonjour = false\n')
    disks = tmp_path / "disks"
    disks.mkdir()
    d.cli("pool", "create", "-s", "1G", "tank", disks / "d0")
    (tmp_path / "mnt").mkdir()
    d.cli("set", f"mountpoint={tmp_path / 'mnt'}", "tank")
    d.cli("set", "sharesmb=on", "tank")
    d.cli("set", "sharesmb=name=T", "tank")
    d.cli("share", "-a")
    assert d.log_text().count("smbd is not installed") == 1, d.log_tail()
    assert d.prop("tank", "sharesmb") == "name=T"
