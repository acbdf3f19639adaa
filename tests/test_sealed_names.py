"""Sealed names (decision 0035): S3 keys and file names of an encrypted
dataset never reach the devices in the clear (the same search finds a
plain bucket's keys, so it can fail), while S3 ListObjects (prefix,
delimiter, start-after, continuation tokens), deletes, snapshots and FUSE
readdir/rename answer exactly as for a plain dataset; without the key
nothing is listed; `set keylocation` and the keyformat rule follow zfs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_encryption import device_contains, _fuse_missing

HEX = "4b" * 32


def _keys(marker: str) -> list[str]:
    out = []
    for i in range(60):
        out.append(f"{marker}/dir{i % 4}/file-{(i * 37) % 60:03d}.txt")
    out += [f"{marker}-top-{i}" for i in range(5)] + ["zz-last", "a-first"]
    return out


def _list(c, bucket: str, **kw) -> tuple[list[str], list[str]]:
    """Every page of ListObjectsV2 (MaxKeys 7, continuation tokens): keys, common prefixes."""
    keys, prefixes, token = [], [], None
    for _ in range(200):
        args = dict(Bucket=bucket, MaxKeys=7, **kw)
        if token:
            args["ContinuationToken"] = token
        r = c.list_objects_v2(**args)
        keys += [o["Key"] for o in r.get("Contents", [])]
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r.get("IsTruncated"):
            return keys, prefixes
        token = r["NextContinuationToken"]
    raise AssertionError("listing did not end")


def test_s3_keys_are_sealed_and_list_like_a_plain_bucket(make_s3, tmp_path):
    ep = make_s3(pool_size="256M")
    keyfile = tmp_path / "b.key"
    keyfile.write_text(HEX)
    ep.cli("create", "-t", "bucket", "-o", "encryption=on", "-o", "keyformat=hex",
           "-o", f"keylocation=file://{keyfile}", "tank/vault")
    ep.cli("create", "-t", "bucket", "tank/plain")
    c = ep.client()
    secret, open_ = "SEALEDKEYNAME", "PLAINKEYNAME"
    for b, m in (("vault", secret), ("plain", open_)):
        for k in _keys(m):
            c.put_object(Bucket=b, Key=k, Body=k.encode())

    def same(what: str, **kw):
        vk = {k: (v.replace(open_, secret) if isinstance(v, str) else v) for k, v in kw.items()}
        got = _list(c, "vault", **vk)
        want = _list(c, "plain", **kw)
        want = ([k.replace(open_, secret) for k in want[0]], [p.replace(open_, secret) for p in want[1]])
        assert got == want, what
        return got

    keys, _ = same("all")
    assert len(keys) == 67 and keys == sorted(keys)
    same("prefix", Prefix=f"{open_}/dir2/")
    _, prefixes = same("delimiter", Delimiter="/")
    assert f"{secret}/" in prefixes
    same("prefix and delimiter", Prefix=f"{open_}/", Delimiter="/")
    same("start-after", StartAfter=f"{open_}/dir1/file-030.txt")
    k = f"{secret}/dir3/file-{(3 * 37) % 60:03d}.txt"
    assert c.get_object(Bucket="vault", Key=k)["Body"].read() == k.encode()
    ep.cli("snapshot", "tank/vault@one")
    c.delete_object(Bucket="vault", Key=k)
    c.delete_object(Bucket="plain", Key=k.replace(secret, open_))
    same("after a delete")
    snap = ep.snapshot_bucket("vault", "one")
    assert len(_list(c, snap)[0]) == 67
    assert c.get_object(Bucket=snap, Key=k)["Body"].read() == k.encode()
    ep.daemon.stop()
    devs = sorted((tmp_path / "d-disks").glob("s3d*"))
    assert device_contains(devs, open_.encode()), "the plain bucket's keys are on the devices"
    assert not device_contains(devs, secret.encode()), "a sealed key is on the devices"
    ep.start()
    ep.cli("unload-key", "tank/vault")
    with pytest.raises(Exception) as e:
        c.list_objects_v2(Bucket="vault")
    assert "AccessDenied" in str(e.value) or "NoSuchBucket" in str(e.value), e.value
    ep.cli("load-key", "tank/vault")
    assert len(_list(c, "vault")[0]) == 66


@pytest.mark.skipif(_fuse_missing() is not None, reason=_fuse_missing() or "")
def test_file_names_are_sealed_through_fuse(make_daemon, disks, tmp_path):
    d = make_daemon(config="[engine]\ntxg_timeout_secs = 0.2\n")
    devs = [disks / "d0", disks / "d1"]
    d.cli("pool", "create", "-s", "128M", "tank", "mirror", *devs)
    keyfile = tmp_path / "fs.key"
    keyfile.write_text(HEX)
    d.cli("create", "-o", "encryption=on", "-o", "keyformat=hex", "-o", f"keylocation=file://{keyfile}",
          "tank/home")
    mnt = tmp_path / "mnt"
    d.cli("mount", "tank/home", mnt)
    names = [f"SEALEDFILENAME-{i:03d}" for i in range(40)]
    try:
        (mnt / "SEALEDDIRNAME").mkdir()
        for n in names:
            (mnt / "SEALEDDIRNAME" / n).write_bytes(n.encode())
        os.rename(mnt / "SEALEDDIRNAME" / names[0], mnt / "SEALEDRENAMED")
        os.unlink(mnt / "SEALEDDIRNAME" / names[1])
        assert sorted(os.listdir(mnt / "SEALEDDIRNAME")) == names[2:]
        assert sorted(os.listdir(mnt)) == ["SEALEDDIRNAME", "SEALEDRENAMED"]
        assert (mnt / "SEALEDRENAMED").read_bytes() == names[0].encode()
        os.sync()
    finally:
        d.cli("unmount", "-f", mnt, check=False)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)
    d.stop()
    for needle in (b"SEALEDFILENAME", b"SEALEDDIRNAME", b"SEALEDRENAMED"):
        assert not device_contains(devs, needle), needle
    d.start()
    d.cli("mount", "tank/home", mnt)
    try:
        assert sorted(os.listdir(mnt / "SEALEDDIRNAME")) == names[2:]
    finally:
        d.cli("unmount", "-f", mnt, check=False)
        subprocess.run(["fusermount3", "-uz", str(mnt)], capture_output=True)


def test_set_keylocation_and_keyformat_follow_zfs(make_daemon, disks, tmp_path):
    d = make_daemon(config="")
    d.cli("pool", "create", "-s", "128M", "tank", disks / "d0")
    k1, k2 = tmp_path / "k1", tmp_path / "k2"
    k1.write_text(HEX)
    k2.write_text(HEX)
    d.cli("create", "-V", "1M", "-o", "encryption=on", "-o", "keyformat=hex",
          "-o", f"keylocation=file://{k1}", "tank/v")
    d.cli("create", "-V", "1M", "tank/v2")
    d.cli("set", f"keylocation=file://{k2}", "tank/v")
    assert d.props("tank/v")["keylocation"] == f"file://{k2}"
    k1.unlink()
    d.cli("unload-key", "tank/v")
    d.cli("load-key", "tank/v")  # reads the new location
    assert d.props("tank/v")["keystatus"] == "available"
    for bad, why in [(["keylocation=http://x", "tank/v"], "keylocation"),
                     (["keyformat=passphrase", "tank/v"], "change-key"),
                     (["pbkdf2iters=200000", "tank/v"], "change-key"),
                     (["encryption=off", "tank/v"], "created"),
                     ([f"keylocation=file://{k2}", "tank/v2"], "not enabled")]:
        p = d.cli("set", *bad, check=False)
        assert p.returncode != 0 and why in p.stderr, (bad, p.stderr)
    assert d.props("tank/v")["keylocation"] == f"file://{k2}"
    d.restart()
    assert d.props("tank/v")["keystatus"] == "available"


def test_change_key_i_inherits_the_parents_key(make_daemon, disks, tmp_path):
    d = make_daemon(config="")
    d.cli("pool", "create", "-s", "128M", "tank", disks / "d0")
    pk, xk = tmp_path / "p.key", tmp_path / "x.key"
    pk.write_text(HEX)
    xk.write_text("77" * 32)
    d.cli("create", "-o", "encryption=on", "-o", "keyformat=hex", "-o", f"keylocation=file://{pk}", "tank/p")
    d.cli("create", "-V", "1M", "-o", "encryption=on", "-o", "keyformat=hex",
          "-o", f"keylocation=file://{xk}", "tank/p/x")
    assert d.props("tank/p/x")["encryptionroot"] == "tank/p/x"
    p = d.cli("change-key", "-i", "-o", "keyformat=hex", "tank/p/x", check=False)
    assert p.returncode != 0, "-i takes no -o"
    d.cli("change-key", "-i", "tank/p/x")
    assert d.props("tank/p/x")["encryptionroot"] == "tank/p"
    xk.unlink()  # its own key is of no use any more
    d.restart()  # p's key file loads p, which loads x
    assert d.props("tank/p/x")["keystatus"] == "available"
    d.cli("unload-key", "tank/p")
    assert d.props("tank/p/x")["keystatus"] == "unavailable"
    p = d.cli("load-key", "tank/p/x", check=False)
    assert p.returncode != 0 and "tank/p" in p.stderr
    d.cli("load-key", "tank/p")
    assert d.props("tank/p/x")["keystatus"] == "available"
