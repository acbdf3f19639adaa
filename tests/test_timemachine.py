"""A simulated Time Machine backup over SMB on a FUSE-mounted filesystem:
a sparsebundle-shaped tree (Info.plist, band files rewritten at random),
then the `SnapshotHistory.plist` rename Time Machine does at the end of a
backup. The daemon sees the rename through its own filesystem layer and
takes one event snapshot; `cistern rollback` while smbd runs disconnects the
share's clients and smbclient then sees the old bands.

Sizes: TM_BANDS band files of TM_BAND_KIB KiB (the suite's defaults are small;
`TM_BANDS=2000 TM_BAND_KIB=8192` is a real sparsebundle's shape)."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

from conftest import run
from test_smb import Smb, needs_samba

pytestmark = needs_samba

BANDS = int(os.environ.get("TM_BANDS", "64"))
BAND_KIB = int(os.environ.get("TM_BAND_KIB", "256"))


def _snapshots(d, ds: str) -> list[str]:
    out = d.cli("list", "-H", "-o", "name", "-t", "snapshot", "-r", ds).stdout.split()
    return [s for s in out if s.startswith(ds + "@")]


def _band(i: int, generation: int) -> bytes:
    head = f"band {i:x} generation {generation}\n".encode()
    return head + bytes([generation % 251]) * (BAND_KIB * 1024 - len(head))


def test_time_machine_backup_makes_one_event_snapshot_and_rollback_serves_old_bands(make_daemon, tmp_path):
    smb = Smb(make_daemon, tmp_path)
    mnt = smb.create_fs("tank/mac1")
    smb.d.cli("set", "timemachine=on", "tank/mac1")
    share = "tank_mac1"
    bundle = "mac1.sparsebundle"
    local = tmp_path / "bands"
    local.mkdir()
    for i in range(BANDS):
        (local / f"{i:x}").write_bytes(_band(i, 1))
    (tmp_path / "Info.plist").write_text("<plist><dict><key>band-size</key></dict></plist>\n")
    (tmp_path / "SnapshotHistory.plist").write_text("<plist>1</plist>\n")
    smb.client(
        share,
        f"mkdir {bundle}; mkdir {bundle}/bands; put {tmp_path / 'Info.plist'} {bundle}/Info.plist; "
        f"cd {bundle}/bands; lcd {local}; prompt off; mput *",
        )
    assert _snapshots(smb.d, "tank/mac1") == [], "no event before the backup completes"
    # The backup rewrites bands at random, then renames its history into place.
    rng = random.Random(7)
    rewritten = sorted(rng.sample(range(BANDS), max(1, BANDS // 4)))
    for i in rewritten:
        (local / f"{i:x}").write_bytes(_band(i, 2))
    puts = "; ".join(f"put {local / f'{i:x}'} {bundle}/bands/{i:x}" for i in rewritten)
    smb.client(share, puts)
    smb.client(
        share,
        f"put {tmp_path / 'SnapshotHistory.plist'} {bundle}/SnapshotHistory.plist.tmp; "
        f"rename {bundle}/SnapshotHistory.plist.tmp {bundle}/SnapshotHistory.plist",
    )
    deadline = time.monotonic() + 60
    while not _snapshots(smb.d, "tank/mac1") and time.monotonic() < deadline:
        time.sleep(0.5)
    snaps = _snapshots(smb.d, "tank/mac1")
    assert len(snaps) == 1, snaps
    # A quiet period with no other rename: still one.
    time.sleep(3)
    assert _snapshots(smb.d, "tank/mac1") == snaps

    # The next backup starts; then the user rolls back while smbd runs.
    changed = rewritten[0]
    (local / f"{changed:x}").write_bytes(_band(changed, 3))
    smb.client(share, f"put {local / f'{changed:x}'} {bundle}/bands/{changed:x}")
    smb.d.cli("rollback", snaps[0])
    back = tmp_path / "back"
    smb.client(share, f"get {bundle}/bands/{changed:x} {back}")
    assert back.read_bytes() == _band(changed, 2), "the share serves the rolled-back band"
    # And the mount (no stale page cache).
    assert (mnt / bundle / "bands" / f"{changed:x}").read_bytes() == _band(changed, 2)
    never = next(i for i in range(BANDS) if i not in rewritten)
    smb.client(share, f"get {bundle}/bands/{never:x} {back}")
    assert back.read_bytes() == _band(never, 1)
