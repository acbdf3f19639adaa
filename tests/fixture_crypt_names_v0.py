"""Makes crates/dataset/tests/fixtures/crypt-names-v0.tar.gz: a pool whose
encrypted bucket and filesystem keep their names in the clear (the layout
before decision 0035). Run with the build BEFORE sealed names:

  CISTERN_BIN=/work/main/target/release/cistern .venv/bin/pytest -s tests/fixture_crypt_names_v0.py

Not collected by the suite (the name does not start with test_)."""

import os
import subprocess
from pathlib import Path

HEX = "5a" * 32
OUT = Path(__file__).resolve().parent.parent / "crates/dataset/tests/fixtures/crypt-names-v0.tar.gz"


def test_make_fixture(make_s3, tmp_path):
    ep = make_s3(pool_size="128M")
    key = tmp_path / "hex.key"
    key.write_text(HEX)
    ep.cli("create", "-t", "bucket", "-o", "encryption=on", "-o", "keyformat=hex",
           "-o", f"keylocation=file://{key}", "tank/vault")
    c = ep.client()
    for k in ["secret-names/alpha.txt", "secret-names/beta.txt", "gamma.bin"]:
        c.put_object(Bucket="vault", Key=k, Body=f"body of {k}".encode())
    ep.cli("snapshot", "tank/vault@before")
    c.delete_object(Bucket="vault", Key="gamma.bin")
    c.put_object(Bucket="vault", Key="delta.txt", Body=b"body of delta.txt")
    ep.cli("create", "-o", "encryption=on", "-o", "keyformat=hex",
           "-o", f"keylocation=file://{key}", "tank/home")
    mnt = tmp_path / "mnt"
    ep.cli("mount", "tank/home", mnt)
    try:
        (mnt / "letters").mkdir()
        (mnt / "letters" / "to-bob.txt").write_bytes(b"dear bob")
        (mnt / "diary-2026.txt").write_bytes(b"a diary")
        os.sync()
    finally:
        ep.cli("unmount", mnt, check=False)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    ep.cli("pool", "export", "tank")
    ep.daemon.stop()
    disks = tmp_path / "d-disks"
    subprocess.run(["tar", "--sparse", "-czf", str(OUT), "-C", str(disks), "s3d0", "s3d1"], check=True)
    for n in [b"secret-names", b"diary-2026", b"to-bob"]:
        assert any(n in (disks / d).read_bytes() for d in ["s3d0", "s3d1"]), n
