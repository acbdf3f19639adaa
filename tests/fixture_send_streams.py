"""Makes crates/dataset/tests/fixtures/send-streams-v1.tar.gz: send streams
of every kind a build has written, so that later builds prove they still
receive them (tests/test_send.py::test_streams_of_an_earlier_build_still_receive):

  vol-a.full   send tank/vol@a            plain full, stream version 1
  vol-ab.incr  send -i @a tank/vol@b      plain incremental, version 1
  vol-b.raw    send -w tank/vol@b         raw (decision 0044), version 2
  tree-s.rec   send -R tank/tree@s        recursive (decision 0040), version 2

tank/vol: 2M, compression=lz4, bytes (i * 7) % 251, snapshot @a, then 64K of
0xab at offset 0, snapshot @b. tank/tree (com.example:note=kept) holds
tank/tree/kid, 1M of the same pattern; `snapshot -r tank/tree@s`.

  CISTERN_BIN=/work/main/target/release/cistern .venv/bin/pytest -s tests/fixture_send_streams.py

Not collected by the suite (the name does not start with test_)."""

import subprocess
from pathlib import Path

from conftest import cistern_bin
from helpers import MiB, connected

OUT = Path(__file__).resolve().parent.parent / "crates/dataset/tests/fixtures/send-streams-v1.tar.gz"


def pattern(n: int) -> bytes:
    return bytes((i * 7) % 251 for i in range(n))


def test_make_fixture(make_daemon, disks, tmp_path):
    d = make_daemon()
    d.cli("pool", "create", "-s", "256M", "tank", disks / "d0")
    d.cli("create", "-V", "2M", "-o", "compression=lz4", "tank/vol")
    with connected(d.uri("tank/vol")) as c:
        c.pwrite(pattern(2 * MiB), 0)
        c.flush()
    d.cli("snapshot", "tank/vol@a")
    with connected(d.uri("tank/vol")) as c:
        c.pwrite(b"\xab" * 65536, 0)
        c.flush()
    d.cli("snapshot", "tank/vol@b")
    d.cli("create", "-o", "com.example:note=kept", "tank/tree")
    d.cli("create", "-V", "1M", "tank/tree/kid")
    with connected(d.uri("tank/tree/kid")) as c:
        c.pwrite(pattern(MiB), 0)
        c.flush()
    d.cli("snapshot", "-r", "tank/tree@s")
    out = tmp_path / "streams"
    out.mkdir()
    for name, args in [("vol-a.full", ["tank/vol@a"]), ("vol-ab.incr", ["-i", "@a", "tank/vol@b"]),
                       ("vol-b.raw", ["-w", "tank/vol@b"]), ("tree-s.rec", ["-R", "tank/tree@s"])]:
        with open(out / name, "wb") as f:
            subprocess.run([cistern_bin(), "send", *args], stdout=f, env=d.env(), check=True, timeout=60)
    subprocess.run(["tar", "-czf", str(OUT), "-C", str(out), "."], check=True)
