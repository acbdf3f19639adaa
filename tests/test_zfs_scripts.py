"""Scripts written for zfs/zpool, run unchanged against Cistern.

The only change is the commands themselves: a directory on PATH holds `zfs`
and `zpool` shims that exec `cistern` and `cistern pool`. A `date` shim
fakes the clock (FAKE_NOW, Unix seconds) so that a cron-style script run ten
times in a row names ten different snapshots, as it would over ten hours.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from conftest import cistern_bin
from helpers import MiB, connected, pattern

# A snapshot rotation as found in zfs how-tos: take a snapshot named after
# the time, keep the newest $KEEP. Verbatim zfs/zpool commands.
ROTATE = r"""#!/bin/bash
DATASET=${1:-tank/vol}
KEEP=${2:-7}
POOL=${DATASET%%/*}

zpool list -H -o name | grep -qx "$POOL" || { echo "pool $POOL is not imported" >&2; exit 1; }
zfs snapshot "$DATASET@$(date +%Y%m%d_%H%M)"
zfs list -H -t snapshot -o name -s creation -r "$DATASET" | head -n -"$KEEP" | xargs -n1 zfs destroy
"""

# What sanoid and zfs-auto-snapshot ask before they act.
INSPECT = r"""#!/bin/bash
set -e
zfs get -Hrpt snapshot creation "$1"
echo ---
zfs list -Hpo name,used,avail
echo ---
zfs list -H -t snapshot -S creation -o name "$1" | head -n 1
echo ---
zfs list -H -o name,com.sun:auto-snapshot -t volume,filesystem
"""

HOUR = 3600
START = 1385300640  # Sun Nov 24 13:44 2013: the seed's `20131124_1344`


@pytest.fixture
def shims(tmp_path):
    """A PATH with zfs, zpool and date shims in front."""
    d = tmp_path / "bin"
    d.mkdir()
    real_date = subprocess.run(["bash", "-c", "command -v date"], capture_output=True, text=True).stdout.strip()
    (d / "zfs").write_text(f'#!/bin/sh\nexec "{cistern_bin()}" "$@"\n')
    (d / "zpool").write_text(f'#!/bin/sh\nexec "{cistern_bin()}" pool "$@"\n')
    (d / "date").write_text(f'#!/bin/sh\nexec "{real_date}" -u -d "@$FAKE_NOW" "$@"\n')
    for f in ("zfs", "zpool", "date"):
        (d / f).chmod(0o755)
    for name, text in (("rotate.sh", ROTATE), ("inspect.sh", INSPECT)):
        (tmp_path / name).write_text(text)
    return d


def _run(daemon, shims, script, *args, now=START):
    env = daemon.env()
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    env["FAKE_NOW"] = str(now)
    return subprocess.run(["bash", str(shims.parent / script), *args], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL)


def _snapshots(daemon, ds="tank/vol"):
    out = daemon.cli("list", "-H", "-t", "snapshot", "-o", "name", "-r", ds).stdout
    return out.split()


def test_snapshot_rotation_script_keeps_the_seven_newest(daemon, pool, shims):
    daemon.cli("create", "-V", "64M", "tank/vol")
    daemon.cli("create", "-V", "64M", "tank/other")
    daemon.cli("snapshot", "tank/other@keep")  # another dataset's snapshot: never touched
    names = []
    for i in range(10):
        now = START + i * HOUR
        # Something changes between runs, as on a live volume.
        with connected(daemon.uri("tank/vol")) as h:
            h.pwrite(pattern(i, 64 * 1024), i * MiB)
        p = _run(daemon, shims, "rotate.sh", "tank/vol", "7", now=now)
        stamp = subprocess.run(["date", "-u", "-d", f"@{now}", "+%Y%m%d_%H%M"], capture_output=True,
                               text=True).stdout.strip()
        names.append(f"tank/vol@{stamp}")
        assert "panicked" not in p.stderr, p.stderr
        if i >= 7:
            # Something to prune: the whole pipeline succeeds.
            assert p.returncode == 0, p.stdout + p.stderr
        assert names[-1] in _snapshots(daemon), p.stderr
        assert len(_snapshots(daemon)) == min(i + 1, 7), (i, _snapshots(daemon), p.stderr)
    assert names[0] == "tank/vol@20131124_1344"
    assert _snapshots(daemon) == names[-7:]
    assert _snapshots(daemon, "tank/other") == ["tank/other@keep"]
    # The volume itself was never a candidate.
    assert daemon.cli("list", "-H", "-o", "name", "tank/vol").stdout.strip() == "tank/vol"


def test_sanoid_and_auto_snapshot_queries_parse(daemon, pool, shims):
    daemon.cli("create", "-V", "64M", "tank/vol")
    daemon.cli("set", "com.sun:auto-snapshot=true", "tank")
    daemon.cli("set", "com.sun:auto-snapshot=false", "tank/vol")
    for i, name in enumerate(["autosnap_2013-11-24_13:44:00_hourly", "2013-11-24T14:44"]):
        daemon.cli("snapshot", f"tank/vol@{name}")
    p = _run(daemon, shims, "inspect.sh", "tank/vol")
    assert p.returncode == 0, p.stdout + p.stderr
    creation, datasets, newest, auto = p.stdout.split("---\n")
    rows = [l.split("\t") for l in creation.splitlines()]
    assert [r[0] for r in rows] == ["tank/vol@autosnap_2013-11-24_13:44:00_hourly", "tank/vol@2013-11-24T14:44"]
    for name, prop, value, source in rows:
        assert prop == "creation" and source == "-"
        assert abs(int(value) - int(daemon.cli("get", "-Hpo", "value", "creation", name).stdout)) == 0
    for line in datasets.splitlines():
        name, used, avail = line.split("\t")
        assert "@" not in name
        assert int(used) >= 0 and int(avail) > 0, line
    assert newest.strip() == "tank/vol@2013-11-24T14:44"
    assert [l.split("\t") for l in auto.splitlines()] == [["tank", "true"], ["tank/vol", "false"]]


# Bookmark-based replication as in zfs how-tos (and syncoid's
# --create-bookmark): send -R once, keep a bookmark, destroy the snapshot,
# send the next one incrementally from the bookmark. Verbatim zfs commands.
REPLICATE = r"""#!/bin/bash
set -euo pipefail
SRC=$1; DST=$2
zfs snapshot -r "$SRC@s1"
zfs send -R "$SRC@s1" | zfs receive "$DST"
zfs bookmark "$SRC/vol@s1" "$SRC/vol#s1"
zfs destroy "$SRC/vol@s1"
zfs list -H -t bookmark -o name,createtxg -r "$SRC"
echo ---
zfs snapshot "$SRC/vol@s2"
zfs send -i "#s1" "$SRC/vol@s2" | zfs recv "$DST/vol"
zfs list -H -t snapshot -o name -r "$DST"
zfs destroy "$SRC/vol#s1"
"""


def test_bookmark_replication_script(daemon, pool, shims):
    (shims.parent / "replicate.sh").write_text(REPLICATE)
    daemon.cli("create", "tank/top")
    daemon.cli("create", "-V", "64M", "tank/top/vol")
    with connected(daemon.uri("tank/top/vol")) as h:
        h.pwrite(pattern(1, 64 * 1024), 0)
        h.flush()
    p = _run(daemon, shims, "replicate.sh", "tank/top", "tank/copy")
    assert p.returncode == 0, p.stdout + p.stderr
    marks, snaps = p.stdout.split("---\n")
    assert [line.split("\t")[0] for line in marks.splitlines()] == ["tank/top/vol#s1"], p.stdout
    assert snaps.split() == ["tank/copy@s1", "tank/copy/vol@s1", "tank/copy/vol@s2"], p.stdout
    assert daemon.cli("list", "-H", "-t", "bookmark", "-o", "name").stdout.strip() == ""
