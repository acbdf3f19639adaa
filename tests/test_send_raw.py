"""`cistern send -w` (raw, decision 0044) between two daemons on loopback:
blocks travel as stored (compressed as on disk; an encrypted dataset's
ciphertext, so the sender needs no key), the target opens with the
source's passphrase after `load-key`, and reads back bit for bit; a
damaged raw stream is refused and changes nothing."""

from __future__ import annotations

import random

from conftest import cistern_bin  # noqa: F401  (the suite's binary)
from helpers import MiB
from test_send import nbd_sha, pair, receive_from, scribble, send_to_file  # noqa: F401

SIZE = 64 * MiB
PASS = "correct horse battery staple"


def text_and_noise(d, name: str, rng: random.Random, n: int):
    """Half compressible blocks, half random ones."""
    from helpers import connected

    with connected(d.uri(name)) as c:
        for i in range(n):
            off = rng.randrange(0, SIZE // 65536) * 65536
            body = rng.randbytes(65536) if i % 2 else (f"block {off} ".encode() * 8192)[:65536]
            c.pwrite(body, off)
        c.flush()


def test_raw_compressed_volume_full_and_incremental(pair, tmp_path):
    src, dst = pair
    rng = random.Random(44)
    src.cli("create", "-V", "64M", "-o", "compression=lz4", "tank/vm")
    text_and_noise(src, "tank/vm", rng, 200)
    src.cli("snapshot", "tank/vm@a")
    plain = send_to_file(src, tmp_path / "plain", "tank/vm@a")
    full = send_to_file(src, tmp_path / "full", "-w", "tank/vm@a")
    assert full[8:16] == bytes([3, 0, 0, 0, 2, 0, 0, 0])  # version 3 (decision 0050), flag RAW
    assert plain[8:12] == bytes([3, 0, 0, 0])
    # As stored: the compressed blocks stay compressed on the wire.
    assert len(full) < len(plain) * 0.8, (len(full), len(plain))
    receive_from(dst, full, "backup/vm")
    assert nbd_sha(dst, "backup/vm@a") == nbd_sha(src, "tank/vm@a")

    text_and_noise(src, "tank/vm", rng, 20)
    src.cli("snapshot", "tank/vm@b")
    text_and_noise(src, "tank/vm", rng, 20)
    src.cli("snapshot", "tank/vm@c")
    incr = send_to_file(src, tmp_path / "incr", "-w", "-I", "@a", "tank/vm@c")
    receive_from(dst, incr, "backup/vm")
    for s in ("b", "c"):
        assert nbd_sha(dst, f"backup/vm@{s}") == nbd_sha(src, f"tank/vm@{s}")


def test_raw_encrypted_volume_sent_without_its_key(pair, tmp_path):
    src, dst = pair
    rng = random.Random(26)
    src.cli("create", "-V", "64M", "-o", "encryption=on", "-o", "keyformat=passphrase",
            "-o", "pbkdf2iters=100000", "tank/sec", input=PASS + "\n")
    scribble(src, "tank/sec", rng, 150)
    src.cli("snapshot", "tank/sec@a")
    want_a = nbd_sha(src, "tank/sec@a")
    src.cli("unload-key", "tank/sec")
    # Without the key a plain send is refused, a raw one is not.
    p = src.cli("send", "tank/sec@a", check=False)
    assert p.returncode != 0
    full = send_to_file(src, tmp_path / "full", "-w", "tank/sec@a")
    assert PASS.encode() not in full
    receive_from(dst, full, "backup/sec")
    assert dst.prop("backup/sec", "keystatus") == "unavailable"
    assert dst.prop("backup/sec", "encryptionroot") == "backup/sec"
    p = dst.cli("load-key", "backup/sec", input="not the passphrase\n", check=False)
    assert p.returncode != 0
    dst.cli("load-key", "backup/sec", input=PASS + "\n")
    assert nbd_sha(dst, "backup/sec@a") == want_a
    dst.cli("unload-key", "backup/sec")

    src.cli("load-key", "tank/sec", input=PASS + "\n")
    scribble(src, "tank/sec", rng, 30)
    src.cli("snapshot", "tank/sec@b")
    want_b = nbd_sha(src, "tank/sec@b")
    src.cli("unload-key", "tank/sec")
    incr = send_to_file(src, tmp_path / "incr", "-w", "-I", "@a", "tank/sec@b")
    receive_from(dst, incr, "backup/sec")
    dst.cli("load-key", "backup/sec", input=PASS + "\n")
    assert nbd_sha(dst, "backup/sec@b") == want_b
    assert nbd_sha(dst, "backup/sec@a") == want_a


def test_raw_sealed_names_bucket_round_trips(make_s3, tmp_path):
    """An encrypted bucket (sealed names) filled through S3, sent raw with
    its key unloaded; on the target every object GETs back equal after
    load-key."""
    src, dst = make_s3("src", pool_size="512M"), make_s3("dst", pool_size="512M")
    key = tmp_path / "hex.key"
    key.write_text("5a" * 32)
    src.cli("create", "-t", "bucket", "-o", "encryption=on", "-o", "keyformat=hex",
            "-o", f"keylocation=file://{key}", src.dataset("vault"))
    c = src.client()
    rng = random.Random(35)
    want = {}
    for i in range(20):
        body = rng.randbytes(rng.choice([100, 5000, 200_000]))
        c.put_object(Bucket="vault", Key=f"secret-name-{i}", Body=body)
        want[f"secret-name-{i}"] = body
    src.cli("snapshot", f"{src.dataset('vault')}@s1")
    snaps = {"s1": dict(want)}
    c.delete_object(Bucket="vault", Key="secret-name-3")
    del want["secret-name-3"]
    c.put_object(Bucket="vault", Key="secret-name-0", Body=b"changed")
    want["secret-name-0"] = b"changed"
    src.cli("snapshot", f"{src.dataset('vault')}@s2")
    snaps["s2"] = dict(want)
    src.cli("unload-key", src.dataset("vault"))
    full = send_to_file(src.daemon, tmp_path / "full", "-w", f"{src.dataset('vault')}@s1")
    incr = send_to_file(src.daemon, tmp_path / "incr", "-w", "-i", "@s1", f"{src.dataset('vault')}@s2")
    assert b"secret-name" not in full + incr
    receive_from(dst.daemon, full, dst.dataset("vault"))
    receive_from(dst.daemon, incr, dst.dataset("vault"))
    assert dst.daemon.prop(dst.dataset("vault"), "keystatus") == "unavailable"
    dst.cli("load-key", "-L", f"file://{key}", dst.dataset("vault"))
    d = dst.client()

    def objects(bucket):
        keys = [o["Key"] for o in d.list_objects_v2(Bucket=bucket).get("Contents", [])]
        return {k: d.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}

    for snap, expect in snaps.items():
        assert objects(dst.snapshot_bucket("vault", snap)) == expect, snap
    assert objects("vault") == want


def test_damaged_raw_stream_is_refused(pair, tmp_path):
    src, dst = pair
    src.cli("create", "-V", "64M", "-o", "compression=lz4", "tank/vm")
    text_and_noise(src, "tank/vm", random.Random(1), 40)
    src.cli("snapshot", "tank/vm@a")
    full = send_to_file(src, tmp_path / "full", "-w", "tank/vm@a")
    bad = bytearray(full)
    bad[len(bad) // 2] ^= 0x20
    p = receive_from(dst, bytes(bad), "backup/vm", check=False)
    assert p.returncode != 0 and b"invalid send stream" in p.stderr, p.stderr
    p = receive_from(dst, full[: len(full) // 3], "backup/vm", check=False)
    assert p.returncode != 0 and b"truncated" in p.stderr, p.stderr
    assert dst.cli("list", "backup/vm", check=False).returncode != 0
    receive_from(dst, full, "backup/vm")
    assert nbd_sha(dst, "backup/vm@a") == nbd_sha(src, "tank/vm@a")
