"""Bucket snapshots through S3 and `cistern rollback` on a bucket."""

from __future__ import annotations

import pytest

from s3_helpers import expect_error


@pytest.fixture
def s3c(s3):
    s3.require_cistern("bucket snapshots")
    return s3


def objects(c, bucket) -> dict[str, bytes]:
    r = c.list_objects_v2(Bucket=bucket)
    assert not r["IsTruncated"]
    return {o["Key"]: c.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in r.get("Contents", [])}


def test_bucket_snapshot_reads_that_moment(s3c):
    c = s3c.client()
    c.create_bucket(Bucket="photos")
    before = {"a.jpg": b"A" * 5000, "b.jpg": b"B1", "dir/c.jpg": b"C" * 300_000, "tiny": b""}
    for k, v in before.items():
        c.put_object(Bucket="photos", Key=k, Body=v)
    s3c.cli("snapshot", f"{s3c.dataset('photos')}@monday")
    # change everything after the snapshot
    c.put_object(Bucket="photos", Key="b.jpg", Body=b"B2 after")
    c.delete_object(Bucket="photos", Key="a.jpg")
    c.put_object(Bucket="photos", Key="new.jpg", Body=b"new")
    c.copy_object(Bucket="photos", Key="dir/c.jpg", CopySource={"Bucket": "photos", "Key": "new.jpg"})

    snap = s3c.snapshot_bucket("photos", "monday")
    assert objects(c, snap) == before
    r = c.list_objects_v2(Bucket=snap, Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["dir/"]
    assert c.get_object(Bucket=snap, Key="dir/c.jpg", Range="bytes=10-19")["Body"].read() == b"C" * 10
    assert c.head_object(Bucket=snap, Key="a.jpg")["ContentLength"] == 5000
    # read-only
    expect_error("AccessDenied", 403, c.put_object, Bucket=snap, Key="x", Body=b"x")
    expect_error("AccessDenied", 403, c.delete_object, Bucket=snap, Key="a.jpg")
    expect_error("NoSuchBucket", 404, c.list_objects_v2, Bucket=s3c.snapshot_bucket("photos", "never"))
    assert objects(c, "photos") == {"b.jpg": b"B2 after", "dir/c.jpg": b"new", "new.jpg": b"new", "tiny": b""}
    assert objects(c, snap) == before  # unchanged by reading the live bucket

    # rollback brings the bucket back to the snapshot's objects
    s3c.cli("rollback", f"{s3c.dataset('photos')}@monday")
    assert objects(c, "photos") == before
    c.put_object(Bucket="photos", Key="after-rollback", Body=b"ok")
    assert objects(c, "photos")["after-rollback"] == b"ok"
    # and the pool says the same after a restart
    s3c.daemon.restart()
    s3c.wait_ready()
    c = s3c.client()
    assert objects(c, "photos") == before | {"after-rollback": b"ok"}
    assert objects(c, snap) == before


def test_bucket_is_a_dataset(s3c):
    """A bucket made through S3 is a dataset with properties; one made with
    `cistern create -t bucket` is an S3 bucket."""
    c = s3c.client()
    c.create_bucket(Bucket="via-s3")
    s3c.cli("create", "-t", "bucket", "-o", "compression=zstd", s3c.dataset("via-cli"))
    names = [b["Name"] for b in c.list_buckets()["Buckets"]]
    assert {"via-s3", "via-cli"} <= set(names), names
    c.put_object(Bucket="via-cli", Key="k", Body=b"z" * 100_000)
    assert s3c.daemon.prop(s3c.dataset("via-cli"), "compression") == "zstd"
    types = dict(l.split("\t") for l in s3c.cli("list", "-H", "-o", "name,type").stdout.splitlines())
    assert types[s3c.dataset("via-s3")] == types[s3c.dataset("via-cli")] == "bucket", types
    c.delete_object(Bucket="via-cli", Key="k")
    c.delete_bucket(Bucket="via-cli")
    out = s3c.cli("list", "-H", "-o", "name").stdout.split()
    assert s3c.dataset("via-cli") not in out and s3c.dataset("via-s3") in out
