"""Makes crates/vdev/tests/fixtures/bucket-pool-v1.tar.gz: a pool that lives
in a bucket (file:// location, decision 0039) as this build writes it: log
records, segment objects, a checkpoint entry (decision 0049) and, after it,
log records of writes that were only FLUSHed before a kill -9, so that later
builds prove they still take it over
(tests/test_bucket_pool.py::test_a_bucket_pool_of_an_earlier_build_still_opens):

  tank/vol: 4M, compression=lz4, bytes (i * 7) % 251, snapshot @a (before the
  checkpoint); then 64K of 0xab at offset 1M, FLUSHed; kill -9.

  CISTERN_BIN=/work/main/target/release/cistern .venv/bin/pytest -s tests/fixture_bucket_pool.py

Not collected by the suite (the name does not start with test_)."""

import subprocess
from pathlib import Path

import helpers
from helpers import MiB, connected

OUT = Path(__file__).resolve().parent.parent / "crates/vdev/tests/fixtures/bucket-pool-v1.tar.gz"


def pattern(n: int) -> bytes:
    return bytes((i * 7) % 251 for i in range(n))


def test_make_fixture(make_daemon, tmp_path):
    where = tmp_path / "bucket"
    d = make_daemon(config="[bucket]\ncache_size = 67108864\ncompact_interval_secs = 1\ncompact_grace_secs = 0\n")
    d.cli("pool", "create", "tank", f"file://{where}", timeout=60)
    d.cli("create", "-V", "4M", "-o", "compression=lz4", "tank/vol")
    with connected(d.uri("tank/vol")) as c:
        c.pwrite(pattern(4 * MiB), 0)
        c.flush()
    d.cli("snapshot", "tank/vol@a")

    def checkpoints():
        return next(p for p in d.api("GET", "/v1/pools") if p["name"] == "tank")["bucket"]["checkpoints"]

    helpers.wait_until(lambda: checkpoints() >= 1, 60, what="a checkpoint")
    with connected(d.uri("tank/vol")) as c:
        c.pwrite(b"\xab" * 65536, MiB)
        c.flush()
    d.kill9()
    OUT.parent.mkdir(exist_ok=True)
    subprocess.run(["tar", "-czf", str(OUT), "-C", str(where), "."], check=True)
