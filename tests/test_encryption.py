"""Encryption at rest (decision 0026): what is written through an encrypted
volume, bucket or filesystem never reaches the devices in the clear (the
same test on a plain dataset finds it, so the search can fail), keys are
loaded, unloaded and changed as with zfs, scrub heals ciphertext without
the key, a flipped ciphertext byte is an I/O error and never data, and
acknowledged writes of an encrypted volume survive kill -9."""

from __future__ import annotations

import errno
import os
import random
import time
from pathlib import Path

import nbd
import pytest

from helpers import KiB, MiB, connected, wait_until
from test_faults import corrupt, read_label, scrub, status, devices, wait_committed

PASS = "correct horse battery"
NEWPASS = "another passphrase 42"
# Short KDF for the suite (zfs's minimum); the default is 350000.
ITERS = "100000"
VOL = 8 * MiB
BS = 16 * KiB
CONFIG = "[engine]\ntxg_timeout_secs = 0.2\nblock_cache_bytes = 0\n"
MARK = b"CISTERN-SECRET-MARK-"


def secret_pattern(seed: int, n: int) -> bytes:
    """Random bytes (incompressible) with a recognizable marker every 4 KiB."""
    r = random.Random(seed)
    out = bytearray()
    for i in range(n // (4 * KiB)):
        tag = MARK + f"{seed:04d}-{i:08d}".encode()
        out += tag + r.randbytes(4 * KiB - len(tag))
    return bytes(out)


def _data_extents(f) -> list[tuple[int, int]]:
    """The (start, end) byte ranges of a file that hold data: its holes
    read as zeros. Devices are sparse (2 GB for an S3 pool, a few MB used),
    and reading the holes through Python took ~9 s per 2 GB scan."""
    fd, size = f.fileno(), os.fstat(f.fileno()).st_size
    out, at = [], 0
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # only a hole after `at`
                break
            return [(0, size)]  # no SEEK_DATA here: read it all
        end = os.lseek(fd, start, os.SEEK_HOLE)
        out.append((start, end))
        at = end
    return out


def device_contains(devs: list[Path], needle: bytes) -> bool:
    """Whether any device holds `needle`. A needle without a zero byte can
    only lie in data extents, so holes are skipped (they read as zeros)."""
    assert needle
    for dev in devs:
        with open(dev, "rb") as f:
            extents = [(0, os.fstat(f.fileno()).st_size)] if b"\0" in needle else _data_extents(f)
            for start, end in extents:
                f.seek(start)
                prev, left = b"", end - start
                while left > 0 and (chunk := f.read(min(8 * MiB, left))):
                    left -= len(chunk)
                    if needle in prev + chunk:
                        return True
                    keep = len(needle) - 1  # a needle across two reads
                    tail = chunk if len(chunk) >= keep else prev + chunk
                    prev = tail[len(tail) - keep:]
    return False


def create_encrypted(d, name: str, *args: str, passphrase: str = PASS, check=True):
    return d.cli("create", *args, "-o", "encryption=on", "-o", "keyformat=passphrase",
                 "-o", f"pbkdf2iters={ITERS}", name, input=passphrase + "\n", check=check)


def write(d, name: str, data: bytes):
    with connected(d.uri(name)) as h:
        for off in range(0, len(data), MiB):
            h.pwrite(data[off:off + MiB], off)
        h.flush()


def read(d, name: str, n: int) -> bytes:
    out = bytearray()
    with connected(d.uri(name)) as h:
        for off in range(0, n, MiB):
            out += h.pread(MiB, off)
    return bytes(out)


def exports(d) -> list[str]:
    h = nbd.NBD()
    h.set_opt_mode(True)
    h.connect_uri(d.uri(""))
    names = []
    h.opt_list(lambda name, desc: names.append(name))
    h.opt_abort()
    return names


@pytest.fixture
def mirror(make_daemon, disks):
    d = make_daemon(config=CONFIG)
    devs = [disks / "d0", disks / "d1"]
    d.cli("pool", "create", "-s", "128M", "tank", "mirror", *devs)
    return d, devs


def test_encrypted_volume_keeps_data_off_the_devices_and_keys_gate_the_export(mirror):
    d, devs = mirror
    create_encrypted(d, "tank/secret", "-V", str(VOL), "-o", "compression=off")
    d.cli("create", "-V", str(VOL), "-o", "compression=off", "tank/plain")
    props = d.props("tank/secret")
    assert props["encryption"] == "aes-256-gcm"
    assert props["keystatus"] == "available"
    assert props["keyformat"] == "passphrase" and props["keylocation"] == "prompt"
    assert props["encryptionroot"] == "tank/secret"
    assert d.props("tank/plain")["encryption"] == "off"
    secret, plain = secret_pattern(1, VOL), secret_pattern(2, VOL)
    write(d, "tank/secret", secret)
    write(d, "tank/plain", plain)
    # In the log now, in the data region after the next txg: both searched.
    assert device_contains(devs, MARK + b"0002-")
    assert not device_contains(devs, MARK + b"0001-")
    wait_committed(d)
    assert device_contains(devs, MARK + b"0002-00000100")
    assert not device_contains(devs, MARK + b"0001-")
    # Nor is the passphrase or anything of the key kept.
    assert not device_contains(devs, PASS.encode())
    assert PASS not in d.log_path.read_text()

    # Unloaded: no export, a clear error, reads refused.
    assert "tank/secret" in exports(d)
    d.cli("unload-key", "tank/secret")
    assert d.props("tank/secret")["keystatus"] == "unavailable"
    assert "tank/secret" not in exports(d) and "tank/plain" in exports(d)
    with pytest.raises(nbd.Error):
        with connected(d.uri("tank/secret")) as h:
            h.pread(4096, 0)
    # A wrong passphrase is refused and says so.
    p = d.cli("load-key", "tank/secret", input="not the passphrase\n", check=False)
    assert p.returncode != 0 and "incorrect key" in p.stderr, p.stderr
    assert d.props("tank/secret")["keystatus"] == "unavailable"
    # -n checks the key without loading it.
    d.cli("load-key", "-n", "tank/secret", input=PASS + "\n")
    assert d.props("tank/secret")["keystatus"] == "unavailable"
    d.cli("load-key", "tank/secret", input=PASS + "\n")
    assert read(d, "tank/secret", VOL) == secret

    # change-key rewraps; after a restart only the new passphrase opens it.
    d.cli("change-key", "tank/secret", input=NEWPASS + "\n")
    d.stop()
    d.start()
    assert d.props("tank/secret")["keystatus"] == "unavailable"
    assert "tank/secret" not in exports(d)
    p = d.cli("load-key", "tank/secret", input=PASS + "\n", check=False)
    assert p.returncode != 0 and "incorrect key" in p.stderr, p.stderr
    d.cli("load-key", "tank/secret", input=NEWPASS + "\n")
    assert read(d, "tank/secret", VOL) == secret
    assert read(d, "tank/plain", VOL) == plain

    # Unload while a client has it open: refused (busy), as zfs.
    with connected(d.uri("tank/secret")) as h:
        p = d.cli("unload-key", "tank/secret", check=False)
        assert p.returncode != 0 and "busy" in p.stderr, p.stderr
        assert h.pread(4096, 0) == secret[:4096]


def test_children_and_clones_share_the_encryption_root(mirror):
    d, _ = mirror
    d.cli("create", "-V", "1M", "tank/plain")
    # A pool without encryption keeps metadata format 3 (older builds read it).
    assert "metadata 3," in d.cli("pool", "upgrade", "tank").stdout
    create_encrypted(d, "tank/enc")
    # 5: encryption with sealed names (decision 0035; 4 was encryption before it).
    assert "metadata 5," in d.cli("pool", "upgrade", "tank").stdout
    d.cli("create", "-V", "1M", "tank/enc/child")
    assert d.props("tank/enc/child")["encryptionroot"] == "tank/enc"
    assert d.props("tank/enc/child")["keystatus"] == "available"
    write(d, "tank/enc/child", secret_pattern(3, MiB))
    d.cli("snapshot", "tank/enc/child@s")
    d.cli("clone", "tank/enc/child@s", "tank/c")
    assert d.props("tank/c")["encryptionroot"] == "tank/enc"
    assert read(d, "tank/c", MiB) == secret_pattern(3, MiB)
    p = d.cli("create", "-V", "1M", "-o", "encryption=off", "tank/enc/plain", check=False)
    assert p.returncode != 0 and "encrypted parent" in p.stderr
    p = d.cli("load-key", "tank/enc/child", input=PASS + "\n", check=False)
    assert p.returncode != 0 and "encryption root" in p.stderr
    d.cli("unload-key", "tank/enc")
    assert d.props("tank/c")["keystatus"] == "unavailable"
    assert d.props("tank/enc/child")["keystatus"] == "unavailable"
    # Key files: hex in a file, given as keylocation.
    keyfile = d.state_dir.parent / "hex.key"
    keyfile.write_text("ab" * 32 + "\n")
    d.cli("create", "-V", "1M", "-o", "encryption=on", "-o", "keyformat=hex",
          "-o", f"keylocation=file://{keyfile}", "tank/hex")
    assert d.props("tank/hex")["keylocation"] == f"file://{keyfile}"
    d.cli("unload-key", "tank/hex")
    d.cli("load-key", "tank/hex")
    assert d.props("tank/hex")["keystatus"] == "available"
    p = d.cli("create", "-V", "1M", "-o", "keyformat=hex", "-o", "encryption=on", "tank/bad",
              input="xyz\n", check=False)
    assert p.returncode != 0 and "hex" in p.stderr


def test_scrub_heals_encrypted_blocks_without_the_key(mirror):
    d, devs = mirror
    create_encrypted(d, "tank/secret", "-V", str(VOL), "-o", f"volblocksize={BS // KiB}K", "-o", "compression=off")
    data = secret_pattern(4, VOL)
    write(d, "tank/secret", data)
    wait_committed(d)
    d.cli("unload-key", "tank/secret")
    regions = read_label(devs[0])["regions"]
    corrupt(devs[0], regions["data_offset"], VOL, 60, random.Random(5))
    st = scrub(d)
    assert st["scan"]["errors"] == 0, st["scan"]
    assert st["scan"]["repaired"] > 0, st["scan"]
    assert devices(st)["d0"]["checksum_errors"] > 0
    d.cli("load-key", "tank/secret", input=PASS + "\n")
    assert read(d, "tank/secret", VOL) == data


def test_a_flipped_ciphertext_byte_is_an_error_never_data(make_daemon, disks):
    d = make_daemon(config=CONFIG)
    dev = disks / "d0"
    d.cli("pool", "create", "-s", "128M", "tank", dev)
    create_encrypted(d, "tank/secret", "-V", str(VOL), "-o", f"volblocksize={BS // KiB}K", "-o", "compression=off")
    data = secret_pattern(6, VOL)
    write(d, "tank/secret", data)
    wait_committed(d)
    d.stop()
    regions = read_label(dev)["regions"]
    with open(dev, "r+b") as f:
        for i in range(8):
            at = regions["data_offset"] + i * 1 * MiB + 777
            f.seek(at)
            b = f.read(1)
            f.seek(at)
            f.write(bytes([b[0] ^ 0x01]))
    d.start()
    d.cli("load-key", "tank/secret", input=PASS + "\n")
    failed = 0
    with connected(d.uri("tank/secret")) as h:
        for off in range(0, VOL, BS):
            try:
                got = h.pread(BS, off)
            except nbd.Error as e:
                assert e.errno in (5, None) or "Input/output" in str(e), e
                failed += 1
                continue
            assert got == data[off:off + BS], f"wrong data returned at {off}"
    assert failed > 0
    assert sum(dv["checksum_errors"] for dv in devices(status(d)).values()) > 0


def test_acknowledged_writes_of_an_encrypted_volume_survive_kill_9(make_daemon, disks, tmp_path):
    # A long txg interval: what was flushed is only in the intent log when killed.
    d = make_daemon(config="[engine]\ntxg_timeout_secs = 60\n")
    devs = [disks / "d0", disks / "d1"]
    d.cli("pool", "create", "-s", "128M", "tank", "mirror", *devs)
    keyfile = tmp_path / "raw.key"
    keyfile.write_bytes(random.Random(7).randbytes(32))
    d.cli("create", "-V", str(VOL), "-o", "encryption=on", "-o", "keyformat=raw",
          "-o", f"keylocation=file://{keyfile}", "-o", "compression=off", "tank/secret")
    data = secret_pattern(8, MiB)
    write(d, "tank/secret", data)  # FLUSH acknowledged
    d.kill9()
    # The log holds them sealed.
    assert not device_contains(devs, MARK + b"0008-")
    d.start()
    # A key in a file is loaded at import, so the log replays.
    assert d.props("tank/secret")["keystatus"] == "available"
    assert "intent log records committed" in d.log_path.read_text()
    assert read(d, "tank/secret", MiB) == data


def test_encrypted_bucket_round_trips_through_s3(make_s3, tmp_path):
    ep = make_s3()
    keyfile = tmp_path / "b.key"
    keyfile.write_text(PASS + "\n")
    ep.cli("create", "-t", "bucket", "-o", "encryption=on", "-o", "keyformat=passphrase",
           "-o", f"pbkdf2iters={ITERS}", "-o", f"keylocation=file://{keyfile}", "tank/vault")
    c = ep.client()
    body = secret_pattern(9, 256 * KiB)
    small = MARK + b"0010-small object body"
    c.put_object(Bucket="vault", Key="big.bin", Body=body)
    c.put_object(Bucket="vault", Key="small.txt", Body=small)
    assert c.get_object(Bucket="vault", Key="big.bin")["Body"].read() == body
    assert c.get_object(Bucket="vault", Key="small.txt")["Body"].read() == small
    ep.daemon.stop()
    devs = sorted((tmp_path / "d-disks").glob("s3d*"))
    assert devs
    assert not device_contains(devs, MARK + b"0009-")
    assert not device_contains(devs, MARK + b"0010-")
    ep.start()
    ep.cli("unload-key", "tank/vault")
    with pytest.raises(Exception) as e:
        c.get_object(Bucket="vault", Key="big.bin")
    assert "AccessDenied" in str(e.value) or "NoSuchBucket" in str(e.value), e.value
    ep.cli("load-key", "tank/vault")
    assert c.get_object(Bucket="vault", Key="big.bin")["Body"].read() == body


def test_a_prompt_key_volume_killed_keeps_its_log_until_load_key(make_daemon, disks):
    d = make_daemon(config="[engine]\ntxg_timeout_secs = 60\n")
    devs = [disks / "d0", disks / "d1"]
    d.cli("pool", "create", "-s", "128M", "tank", "mirror", *devs)
    create_encrypted(d, "tank/secret", "-V", str(VOL), "-o", "compression=off")
    d.cli("create", "-V", str(VOL), "-o", "compression=off", "tank/plain")
    data, other = secret_pattern(11, MiB), secret_pattern(12, MiB)
    write(d, "tank/secret", data)
    write(d, "tank/plain", other)
    d.kill9()
    assert not device_contains(devs, MARK + b"0011-")
    d.start()
    # The pool imports; the plain volume's log replayed, the encrypted one's kept.
    assert read(d, "tank/plain", MiB) == other
    assert d.props("tank/secret")["keystatus"] == "unavailable"
    assert "tank/secret" not in exports(d)
    assert "kept until their keys are loaded" in d.log_path.read_text()
    # Kept across another restart, replayed by load-key.
    d.stop()
    d.start()
    d.cli("load-key", "tank/secret", input=PASS + "\n")
    assert read(d, "tank/secret", MiB) == data
    d.stop()
    d.start()
    d.cli("load-key", "tank/secret", input=PASS + "\n")
    assert read(d, "tank/secret", MiB) == data
    assert not device_contains(devs, MARK + b"0011-")


def _fuse_missing() -> str | None:
    import os
    import shutil

    if os.geteuid() != 0:
        return "the daemon mounts as root in this suite"
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount3"):
        return "no FUSE here"
    return None


@pytest.mark.skipif(_fuse_missing() is not None, reason=_fuse_missing() or "")
def test_encrypted_filesystem_round_trips_through_fuse(mirror, tmp_path):
    import subprocess

    d, devs = mirror
    mnt = tmp_path / "mnt"
    create_encrypted(d, "tank/home")
    d.cli("mount", "tank/home", mnt)
    try:
        body = secret_pattern(13, 512 * KiB)
        (mnt / "report.bin").write_bytes(body)
        (mnt / "note.txt").write_bytes(MARK + b"0014-a small file, embedded in metadata")
        (mnt / "link").symlink_to("target-" + (MARK + b"0015").decode())
        with open(mnt / "report.bin", "rb") as f:
            import os

            os.fsync(f.fileno())
        assert (mnt / "report.bin").read_bytes() == body
        # Busy while mounted.
        p = d.cli("unload-key", "tank/home", check=False)
        assert p.returncode != 0 and "busy" in p.stderr, p.stderr
    finally:
        d.cli("unmount", "-f", mnt, check=False)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    d.stop()
    for tag in (b"0013-", b"0014-", b"0015"):
        assert not device_contains(devs, MARK + tag), tag
    d.start()
    d.cli("load-key", "tank/home", input=PASS + "\n")
    d.cli("mount", "tank/home", mnt)
    try:
        assert (mnt / "report.bin").read_bytes() == body
        assert (mnt / "link").readlink().name.startswith("target-")
    finally:
        d.cli("unmount", "-f", mnt, check=False)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def test_encrypted_plaintext_never_reaches_a_cache_device(make_daemon, disks, tmp_path):
    """The ARC holds decrypted blocks; what it evicts feeds the L2ARC. An
    encrypted dataset's blocks must stay in memory (a plain one's do go, so
    the test can fail)."""
    d = make_daemon(config=(
        "[engine]\ntxg_timeout_secs = 0.2\ncache_max_bytes = \"16M\"\ncache_min_bytes = \"16M\"\n"
        "prefetch_max_bytes = 0\nl2arc_write_max_bytes = \"1G\"\n"
    ))
    d.cli("pool", "create", "-s", "512M", "tank", disks / "d0")
    l2 = tmp_path / "l2.img"
    with open(l2, "wb") as f:
        f.truncate(256 * MiB)
    d.cli("pool", "add", "tank", "cache", l2)
    n = 40 * MiB
    create_encrypted(d, "tank/secret", "-V", str(n), "-o", "compression=off")
    d.cli("create", "-V", str(n), "-o", "compression=off", "tank/plain")
    secret, plain = secret_pattern(11, n), secret_pattern(12, n)
    write(d, "tank/secret", secret)
    write(d, "tank/plain", plain)
    wait_committed(d)
    for _ in range(2):  # through a 16 MiB ARC: evicted blocks are offered to the cache device
        assert read(d, "tank/plain", n) == plain
        assert read(d, "tank/secret", n) == secret
    wait_until(lambda: device_contains([l2], MARK + b"0012-"), 30, what="the plain volume's blocks on the L2ARC")
    assert not device_contains([l2], MARK + b"0011-"), "encrypted plaintext written to the cache device"
