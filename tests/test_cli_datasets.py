"""The zfs(8)-style dataset commands: names, list, get, set, inherit, user
properties, rename, destroy -R, hold -r, create -b, version and help."""

from __future__ import annotations

import re

from helpers import MiB, connected, nbdinfo_json, pattern
from test_cli import _fails


def _col(out: str, i: int = 0) -> list[str]:
    return [l.split("\t")[i] for l in out.splitlines() if l.strip()]


def _names(d, *args) -> list[str]:
    return _col(d.cli("list", "-H", "-o", "name", *args).stdout)


def _get(d, prop, ds, *args) -> tuple[str, str]:
    """(value, source) of `get -H -o value,source`."""
    line = d.cli("get", "-H", "-o", "value,source", *args, prop, ds).stdout.rstrip("\n")
    value, source = line.split("\t")
    return value, source


def test_names_follow_zfs_rules(daemon, pool, disks):
    d = daemon
    d.cli("create", "-V", "64M", "tank/2024-vm.disk:0")  # a component may start with a digit
    d.cli("snapshot", "tank/2024-vm.disk:0@20131124_1344")  # so may a snapshot (the seed's date naming)
    d.cli("snapshot", "tank/2024-vm.disk:0@with space")
    assert _names(d, "-t", "snapshot", "tank/2024-vm.disk:0") == [
        "tank/2024-vm.disk:0@20131124_1344", "tank/2024-vm.disk:0@with space"]
    for bad, why in [("tank/a!", r"invalid character '!'"), ("tank//a", "empty component"),
                     ("tank/../a", r"parent reference"), ("tank/a#b", r"invalid character '#'")]:
        _fails(d.cli("create", "-V", "64M", bad, check=False), why, code=1)
    _fails(d.cli("snapshot", "tank/2024-vm.disk:0@a@b", check=False), "multiple '@'", code=1)
    _fails(d.cli("snapshot", "tank/2024-vm.disk:0@", check=False), "empty component", code=1)
    # Pool names: a letter first, no vdev keywords, nothing like a disk.
    for bad, why in [("1tank", "must begin with a letter"), ("mirror", "reserved"), ("raidz9", "reserved"),
                     ("c0t0d0", "reserved")]:
        _fails(d.cli("pool", "create", "-s", "128M", bad, disks / f"{bad}.img", check=False), why, code=1)


def test_list_types_depth_order_and_columns(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/a")
    d.cli("create", "-V", "64M", "tank/b")
    # Created z first, then a: listed in creation order, not by name.
    d.cli("snapshot", "tank/a@z")
    with connected(d.uri("tank/a")) as h:
        h.pwrite(pattern(1, 4 * MiB), 0)
    d.cli("snapshot", "tank/a@a")
    d.cli("snapshot", "tank/b@x")
    # -t snapshot with a dataset: its snapshots only, never the dataset itself (with or without -r).
    assert _names(d, "-t", "snapshot", "-r", "tank/a") == ["tank/a@z", "tank/a@a"]
    assert _names(d, "-t", "snapshot", "tank/a") == ["tank/a@z", "tank/a@a"]
    assert _names(d, "-t", "snapshot") == ["tank/a@z", "tank/a@a", "tank/b@x"]
    assert _names(d, "-t", "all", "-r", "tank") == ["tank", "tank/a", "tank/a@z", "tank/a@a", "tank/b", "tank/b@x"]
    assert _names(d) == ["tank", "tank/a", "tank/b"]
    assert _names(d, "tank/a@z") == ["tank/a@z"]  # a snapshot named explicitly is listed
    # -d: levels below the named dataset; a snapshot is one level below its dataset.
    assert _names(d, "-d", "0", "tank") == ["tank"]
    assert _names(d, "-d", "1", "-t", "all", "tank") == ["tank", "tank/a", "tank/b"]
    assert _names(d, "-d", "1", "-t", "all", "tank/a") == ["tank/a", "tank/a@z", "tank/a@a"]
    # -s / -S: by a property, numbers numerically, several keys.
    assert _names(d, "-t", "snapshot", "-s", "name") == ["tank/a@a", "tank/a@z", "tank/b@x"]
    assert _names(d, "-t", "snapshot", "-S", "creation") == ["tank/b@x", "tank/a@a", "tank/a@z"]
    used = _col(d.cli("list", "-Hp", "-o", "used", "-s", "used", "-t", "volume").stdout)
    assert [int(u) for u in used] == sorted(int(u) for u in used)
    assert _names(d, "-t", "volume", "-S", "used", "-s", "name")[0] == "tank/a"  # the one with data
    # Columns come from the property table: a known one a dataset lacks is '-'.
    out = d.cli("list", "-t", "snapshot", "-o", "name,avail,origin,com.example:note").stdout
    assert re.match(r"NAME\s+AVAIL\s+ORIGIN\s+COM.EXAMPLE:NOTE\n", out), out
    assert d.cli("list", "-H", "-o", "avail,origin", "tank/a@z").stdout == "-\t-\n"
    head = d.cli("list", "-o", "space", "tank/a").stdout.splitlines()[0].split()
    assert head == ["NAME", "AVAIL", "USED", "USEDSNAP", "USEDDS", "USEDREFRESERV", "USEDCHILD"]
    row = d.cli("list", "-Hp", "-o", "space", "tank").stdout.split("\t")
    assert int(row[2]) >= int(row[6]) > 0, row  # tank's USED includes its children's
    _fails(d.cli("list", "-o", "name,bogus", check=False), "bad property list", "'bogus'", code=1)
    _fails(d.cli("list", "-s", "nope", check=False), "'nope'", code=1)
    _fails(d.cli("list", "-t", "bogus", check=False), "'bogus'", code=1)
    _fails(d.cli("list", "-t", "volume", "tank", check=False), "not applicable", code=1)
    _fails(d.cli("list", "tank/nope", check=False), "tank/nope", code=1)
    # Nothing to list: nothing on stdout (a script counting lines sees 0).
    d.cli("create", "-V", "64M", "tank/empty")
    p = d.cli("list", "-t", "snapshot", "tank/empty")
    assert p.stdout == "" and "no datasets available" in p.stderr


def test_get_sources_inheritance_and_user_properties(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/a")
    d.cli("snapshot", "tank/a@s")
    assert _get(d, "compression", "tank/a") == ("lz4", "default")
    d.cli("set", "compression=zstd", "tank")
    assert _get(d, "compression", "tank/a") == ("zstd", "inherited from tank")
    assert _get(d, "compression", "tank/a@s") == ("zstd", "inherited from tank")
    d.cli("set", "compression=off", "tank/a")
    assert _get(d, "compression", "tank/a") == ("off", "local")
    # -s filters by source; -r recurses (snapshots included, as zfs get).
    rows = [l.split("\t")[:2] for l in d.cli("get", "-H", "-r", "-s", "local", "compression", "tank").stdout.splitlines()]
    assert rows == [["tank", "compression"], ["tank/a", "compression"]]
    names = _col(d.cli("get", "-H", "-r", "-s", "inherited", "compression", "tank").stdout)
    assert names == ["tank/a@s"]
    assert _col(d.cli("get", "-H", "-d", "1", "-t", "volume", "compression", "tank").stdout) == ["tank/a"]
    # inherit: back to the parent's value, then to the default.
    d.cli("inherit", "compression", "tank/a")
    assert _get(d, "compression", "tank/a") == ("zstd", "inherited from tank")
    d.cli("inherit", "-r", "compression", "tank")
    assert _get(d, "compression", "tank/a") == ("lz4", "default")
    # User properties: set, shown by `get all`, inherited, removed by inherit.
    d.cli("set", "com.example:note=hello world", "tank")
    assert _get(d, "com.example:note", "tank") == ("hello world", "local")
    assert _get(d, "com.example:note", "tank/a") == ("hello world", "inherited from tank")
    all_a = {r[1]: (r[2], r[3]) for r in (l.split("\t") for l in d.cli("get", "-H", "all", "tank/a").stdout.splitlines())}
    assert all_a["com.example:note"] == ("hello world", "inherited from tank"), all_a
    assert "com.example:note" not in d.cli("get", "-H", "-s", "local", "all", "tank/a").stdout
    assert d.cli("list", "-H", "-o", "name,com.example:note", "tank/a").stdout == "tank/a\thello world\n"
    # Several assignments at once; they survive a restart.
    d.cli("set", "com.example:owner=ops", "readonly=on", "tank/a")
    d.restart()
    assert _get(d, "com.example:owner", "tank/a") == ("ops", "local")
    assert _get(d, "readonly", "tank/a") == ("on", "local")
    assert _get(d, "com.example:note", "tank/a") == ("hello world", "inherited from tank")
    d.cli("inherit", "-r", "com.example:note", "tank")
    assert _get(d, "com.example:note", "tank/a") == ("-", "-")
    assert "com.example:note" not in d.cli("get", "all", "tank").stdout
    # Errors name the problem.
    _fails(d.cli("get", "bogus", "tank", check=False), "invalid property 'bogus'", code=1)
    _fails(d.cli("get", "-s", "bogus", "all", "tank", check=False), "invalid source 'bogus'", code=1)
    _fails(d.cli("set", "Com.Example:X=1", "tank", check=False), "invalid property", code=1)
    _fails(d.cli("set", "nosuchprop=1", "tank/a", check=False), "invalid property 'nosuchprop'", code=1)
    _fails(d.cli("set", "used=5", "tank/a", check=False), "'used' is readonly", code=1)
    _fails(d.cli("inherit", "volsize", "tank/a", check=False), "'volsize' property cannot be inherited", code=1)
    _fails(d.cli("inherit", "bogus", "tank/a", check=False), "invalid property 'bogus'", code=1)
    _fails(d.cli("set", "com.example:x=" + "y" * 9000, "tank", check=False), "8192", code=1)


def test_snapshot_properties_are_read_only_except_user_properties(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/v")
    d.cli("snapshot", "tank/v@a")
    for assignment in ("compression=off", "readonly=off", "volsize=128M"):
        p = d.cli("set", assignment, "tank/v@a", check=False)
        msg = _fails(p, code=1)
        assert "cannot set property for 'tank/v@a': this property can not be modified for snapshots" in msg, msg
    _fails(d.cli("inherit", "compression", "tank/v@a", check=False), "can not be modified for snapshots", code=1)
    assert _get(d, "readonly", "tank/v@a") == ("on", "-")
    d.cli("set", "com.example:kept=yes", "tank/v@a")
    assert _get(d, "com.example:kept", "tank/v@a") == ("yes", "local")
    d.cli("inherit", "com.example:kept", "tank/v@a")
    assert _get(d, "com.example:kept", "tank/v@a") == ("-", "-")


def test_rename_datasets_and_snapshots(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/a")
    d.cli("create", "-V", "64M", "tank/b")
    d.cli("snapshot", "-r", "tank@r")
    with connected(d.uri("tank/a")) as h:
        h.pwrite(pattern(2, 1 * MiB), 0)
        d.cli("rename", "tank/a", "tank/c")
        # The open connection keeps serving the renamed volume.
        h.pwrite(pattern(3, 1 * MiB), 1 * MiB)
        h.flush()
        assert h.pread(1 * MiB, 0) == pattern(2, 1 * MiB)
    exports = [e["export-name"] for e in nbdinfo_json(d.uri(), "--list")["exports"]]
    assert "tank/c" in exports and "tank/a" not in exports, exports
    with connected(d.uri("tank/c")) as h:
        assert h.pread(2 * MiB, 0) == pattern(2, 1 * MiB) + pattern(3, 1 * MiB)
    assert _names(d, "-t", "all", "-r", "tank") == ["tank", "tank@r", "tank/b", "tank/b@r", "tank/c", "tank/c@r"]
    # Snapshots: by full name or @short; -r renames the snapshot of every child.
    d.cli("rename", "tank/c@r", "tank/c@first")
    d.cli("rename", "tank/c@first", "@second")
    d.cli("rename", "-r", "tank@r", "@r2")
    assert _names(d, "-t", "snapshot") == ["tank@r2", "tank/b@r2", "tank/c@second"]
    # Errors as zfs words them; nothing changes.
    for args, why in [
        (["tank/b", "tank/c"], "cannot rename to 'tank/c': dataset already exists"),
        (["tank/b", "other/b"], "datasets must be within same pool"),
        (["tank/b", "tank/nope/b"], "cannot rename to 'tank/nope/b': parent does not exist"),
        (["tank/b", "tank/c/b"], "parent is not a filesystem"),
        (["tank/b@r2", "tank/c@r2"], "snapshots must be part of same dataset"),
        (["tank/b@r2", "@nope!"], "invalid character '!'"),
        (["tank/b@nope", "@x"], "does not exist"),
        (["tank/nope", "tank/x"], "does not exist"),
        (["-r", "tank/b", "tank/x"], "recursive rename must be a snapshot"),
        (["tank", "tank2"], "root dataset"),
        (["tank/b", "tank/b@x"], "'@' is not expected"),
    ]:
        _fails(d.cli("rename", *args, check=False), re.escape(why), code=1)
    d.restart()
    assert _names(d, "-t", "all", "-r", "tank") == ["tank", "tank@r2", "tank/b", "tank/b@r2", "tank/c", "tank/c@second"]
    with connected(d.uri("tank/c")) as h:
        assert h.pread(1 * MiB, 1 * MiB) == pattern(3, 1 * MiB)


def test_destroy_r_and_R_with_clones_and_hold_r(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "tank/a")
    d.cli("snapshot", "tank/a@s")
    d.cli("clone", "tank/a@s", "tank/c")
    d.cli("snapshot", "tank/c@cs")
    d.cli("clone", "tank/c@cs", "tank/cc")  # a clone of a clone: a dependent too
    msg = _fails(d.cli("destroy", "tank/a", check=False), code=1)
    assert "use '-r'" in msg and "tank/a@s" in msg, msg
    msg = _fails(d.cli("destroy", "-r", "tank/a", check=False), code=1)
    assert "use '-R'" in msg and "tank/c" in msg, msg
    msg = _fails(d.cli("destroy", "tank/a@s", check=False), code=1)
    assert "tank/c" in msg and "-R" in msg, msg
    # Dry run lists every dependent, clones first, and changes nothing.
    out = d.cli("destroy", "-Rnv", "tank/a").stdout
    gone = [l.split()[-1] for l in out.splitlines() if l.startswith("would destroy")]
    assert set(gone) == {"tank/a", "tank/a@s", "tank/c", "tank/c@cs", "tank/cc"}, out
    assert gone.index("tank/cc") < gone.index("tank/c") < gone.index("tank/a"), gone
    assert _names(d, "-r", "tank") == ["tank", "tank/a", "tank/c", "tank/cc"]
    d.cli("destroy", "-R", "tank/a")
    assert _names(d, "-t", "all", "-r", "tank") == ["tank"]
    # -R on a snapshot: its clones go with it, the dataset stays.
    d.cli("create", "-V", "64M", "tank/b")
    d.cli("snapshot", "tank/b@x")
    d.cli("clone", "tank/b@x", "tank/bc")
    d.cli("destroy", "-R", "tank/b@x")
    assert _names(d, "-t", "all", "-r", "tank") == ["tank", "tank/b"]
    # hold -r: the same snapshot of every dataset below.
    d.cli("create", "-V", "64M", "tank/d")
    d.cli("snapshot", "-r", "tank@h")
    d.cli("hold", "-r", "keep", "tank@h")
    assert sorted(_col(d.cli("holds", "-H", "tank@h", "tank/b@h", "tank/d@h").stdout)) == ["tank/b@h", "tank/d@h", "tank@h"]
    _fails(d.cli("destroy", "tank/d@h", check=False), "held", code=1)
    _fails(d.cli("destroy", "-r", "tank/d", check=False), "held", code=1)
    d.cli("release", "-r", "keep", "tank@h")
    d.cli("destroy", "-r", "tank@h")
    assert _names(d, "-t", "snapshot") == []


def test_create_b_version_and_help(daemon, pool):
    d = daemon
    d.cli("create", "-V", "64M", "-b", "8K", "tank/bs")
    assert d.prop("tank/bs", "volblocksize") == "8192"
    _fails(d.cli("create", "-V", "64M", "-b", "3K", "tank/x", check=False), "volblocksize", code=1)
    _fails(d.cli("create", "-V", "64M", "-b", "8K", "-o", "volblocksize=8K", "tank/x", check=False), "both", code=1)
    v = d.cli("version").stdout.splitlines()
    assert re.fullmatch(r"cistern-\d+\.\d+\.\d+", v[0]) and re.fullmatch(r"cistern-daemon-\d+\.\d+\.\d+", v[1]), v
    h = d.cli("help").stdout
    for sub in ("list", "rename", "inherit", "version", "pool"):
        assert re.search(rf"^\s+{sub}\s", h, re.M), f"{sub} missing from `cistern help`:\n{h}"
    h = d.cli("help", "list").stdout
    for flag in ("-s <PROP>", "-S <PROP>", "-d <DEPTH>", "-t <TYPE>"):
        assert flag in h, h
    _fails(d.cli("help", "nosuchcommand", check=False), "nosuchcommand")
