"""boto3 against the S3 layer (run by crates/s3/tests/boto.rs, which starts
the engine and the service and passes S3_ENDPOINT, S3_KEY, S3_SECRET).
Every test makes its own buckets; error cases check the S3 error code."""

import base64
import datetime
import hashlib
import os
import socket
import uuid
import zlib

import boto3
import botocore
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

ENDPOINT = os.environ.get("S3_ENDPOINT", "http://127.0.0.1:9000")
KEY = os.environ.get("S3_KEY", "")
SECRET = os.environ.get("S3_SECRET", "")
MiB = 1 << 20


def client(style="path", endpoint=ENDPOINT, key=KEY, secret=SECRET, **kw):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": style}, retries={"max_attempts": 1}, **kw),
    )


@pytest.fixture
def s3():
    return client()


def new_bucket(s3, prefix="b"):
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


def code(exc_info):
    return exc_info.value.response["Error"]["Code"]


def status(exc_info):
    return exc_info.value.response["ResponseMetadata"]["HTTPStatusCode"]


def body(s3, b, k, **kw):
    return s3.get_object(Bucket=b, Key=k, **kw)["Body"].read()


# ---------------------------------------------------------------- buckets


def test_buckets_create_head_list_location_delete(s3):
    b = new_bucket(s3)
    s3.head_bucket(Bucket=b)
    assert b in [x["Name"] for x in s3.list_buckets()["Buckets"]]
    assert s3.get_bucket_location(Bucket=b).get("LocationConstraint") in (None, "")
    with pytest.raises(ClientError) as e:
        s3.create_bucket(Bucket=b)
    assert code(e) == "BucketAlreadyOwnedByYou"
    for bad in ["Bad_Name", "ab", "x--snap--y"]:
        with pytest.raises(ClientError) as e:
            s3.create_bucket(Bucket=bad)
        assert code(e) == "InvalidBucketName", bad
    s3.put_object(Bucket=b, Key="k", Body=b"x")
    with pytest.raises(ClientError) as e:
        s3.delete_bucket(Bucket=b)
    assert code(e) == "BucketNotEmpty"
    s3.delete_object(Bucket=b, Key="k")
    s3.delete_bucket(Bucket=b)
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=b)
    assert status(e) == 404
    for op in (lambda: s3.delete_bucket(Bucket=b), lambda: s3.list_objects_v2(Bucket=b)):
        with pytest.raises(ClientError) as e:
            op()
        assert code(e) == "NoSuchBucket"


def test_wrong_secret_and_anonymous_are_refused():
    bad = client(secret="wrong")
    with pytest.raises(ClientError) as e:
        bad.list_buckets()
    assert code(e) == "SignatureDoesNotMatch"
    anon = boto3.client(
        "s3", endpoint_url=ENDPOINT, region_name="us-east-1",
        config=Config(signature_version=botocore.UNSIGNED, retries={"max_attempts": 1}),
    )
    with pytest.raises(ClientError) as e:
        anon.list_buckets()
    assert code(e) == "AccessDenied"


def test_virtual_host_style(s3, monkeypatch):
    b = new_bucket(s3)
    s3.put_object(Bucket=b, Key="v/k", Body=b"vhost")
    host, port = ENDPOINT.rsplit("//", 1)[1].split(":")
    real = socket.getaddrinfo

    def resolve(h, *a, **kw):
        return real(host if h.endswith("s3.test") else h, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    v = client(style="virtual", endpoint=f"http://s3.test:{port}")
    assert body(v, b, "v/k") == b"vhost"
    assert [o["Key"] for o in v.list_objects_v2(Bucket=b)["Contents"]] == ["v/k"]


# ---------------------------------------------------------------- objects


def test_put_get_head_metadata_and_headers(s3):
    b = new_bucket(s3)
    data = os.urandom(300_000)
    r = s3.put_object(
        Bucket=b, Key="dir/obj", Body=data, Metadata={"color": "blue", "Mixed-Case": "v"},
        ContentType="image/png", ContentEncoding="identity", ContentDisposition="attachment",
        ContentLanguage="en", CacheControl="max-age=60",
        Expires=datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
    )
    md5 = hashlib.md5(data).hexdigest()
    assert r["ETag"] == f'"{md5}"'
    h = s3.head_object(Bucket=b, Key="dir/obj")
    assert h["ContentLength"] == len(data)
    assert h["ETag"] == f'"{md5}"'
    assert h["Metadata"] == {"color": "blue", "mixed-case": "v"}
    assert h["ContentType"] == "image/png"
    assert h["ContentDisposition"] == "attachment"
    assert h["ContentLanguage"] == "en"
    assert h["CacheControl"] == "max-age=60"
    assert h["Expires"].year == 2030
    assert body(s3, b, "dir/obj") == data
    # Overwrite, then the empty object.
    s3.put_object(Bucket=b, Key="dir/obj", Body=b"short")
    assert body(s3, b, "dir/obj") == b"short"
    s3.put_object(Bucket=b, Key="empty", Body=b"")
    assert body(s3, b, "empty") == b""
    assert s3.head_object(Bucket=b, Key="empty")["ETag"] == '"d41d8cd98f00b204e9800998ecf8427e"'
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="nope")
    assert code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=b, Key="nope")
    assert status(e) == 404
    s3.delete_object(Bucket=b, Key="dir/obj")
    s3.delete_object(Bucket=b, Key="dir/obj")  # deleting twice is fine
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="dir/obj")
    assert code(e) == "NoSuchKey"


def test_ranged_get(s3):
    b = new_bucket(s3)
    data = os.urandom(3 * MiB + 17)
    s3.put_object(Bucket=b, Key="r", Body=data)
    for rng, want in [
        ("bytes=0-0", data[:1]),
        ("bytes=10-20", data[10:21]),
        ("bytes=1048570-2097160", data[1048570:2097161]),
        ("bytes=-5", data[-5:]),
        ("bytes=3145700-", data[3145700:]),
        ("bytes=3145700-99999999", data[3145700:]),
    ]:
        r = s3.get_object(Bucket=b, Key="r", Range=rng)
        assert r["Body"].read() == want, rng
        assert r["ContentRange"].endswith(f"/{len(data)}")
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="r", Range=f"bytes={len(data)}-")
    assert code(e) == "InvalidRange"


def test_conditional_requests(s3):
    b = new_bucket(s3)
    etag = s3.put_object(Bucket=b, Key="c", Body=b"cond")["ETag"]
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    assert body(s3, b, "c", IfMatch=etag) == b"cond"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="c", IfMatch='"0000"')
    assert code(e) == "PreconditionFailed"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="c", IfNoneMatch=etag)
    assert status(e) == 304
    with pytest.raises(ClientError) as e:
        s3.head_object(Bucket=b, Key="c", IfModifiedSince=future)
    assert status(e) == 304
    assert body(s3, b, "c", IfModifiedSince=past) == b"cond"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="c", IfUnmodifiedSince=past)
    assert code(e) == "PreconditionFailed"
    # If-Match true wins over a failing If-Unmodified-Since.
    assert body(s3, b, "c", IfMatch=etag, IfUnmodifiedSince=past) == b"cond"
    # Conditional create: If-None-Match: * only if absent.
    s3.put_object(Bucket=b, Key="new", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=b, Key="new", Body=b"2", IfNoneMatch="*")
    assert code(e) == "PreconditionFailed"
    assert body(s3, b, "new") == b"1"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=b, Key="new", Body=b"3", IfMatch='"0000"')
    assert code(e) == "PreconditionFailed"


def test_copy_within_and_across_buckets(s3):
    b1, b2 = new_bucket(s3), new_bucket(s3)
    data = os.urandom(2 * MiB + 3)
    s3.put_object(Bucket=b1, Key="src", Body=data, Metadata={"a": "1"}, ContentType="text/x-a")
    r = s3.copy_object(Bucket=b1, Key="same", CopySource={"Bucket": b1, "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    h = s3.head_object(Bucket=b1, Key="same")
    assert h["Metadata"] == {"a": "1"} and h["ContentType"] == "text/x-a"
    s3.copy_object(
        Bucket=b2, Key="other", CopySource={"Bucket": b1, "Key": "src"},
        MetadataDirective="REPLACE", Metadata={"b": "2"}, ContentType="text/x-b",
    )
    h = s3.head_object(Bucket=b2, Key="other")
    assert h["Metadata"] == {"b": "2"} and h["ContentType"] == "text/x-b"
    assert body(s3, b2, "other") == data
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=b1, Key="src", CopySource={"Bucket": b1, "Key": "src"})
    assert code(e) == "InvalidRequest"
    # Copy onto itself with new metadata is allowed.
    s3.copy_object(Bucket=b1, Key="src", CopySource={"Bucket": b1, "Key": "src"},
                   MetadataDirective="REPLACE", Metadata={"c": "3"})
    assert s3.head_object(Bucket=b1, Key="src")["Metadata"] == {"c": "3"}
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=b1, Key="x", CopySource={"Bucket": b1, "Key": "missing"})
    assert code(e) == "NoSuchKey"
    with pytest.raises(ClientError) as e:
        s3.copy_object(Bucket=b1, Key="x", CopySource={"Bucket": b1, "Key": "src"},
                       CopySourceIfMatch='"0000"')
    assert code(e) == "PreconditionFailed"


def test_delete_objects(s3):
    b = new_bucket(s3)
    for k in "abc":
        s3.put_object(Bucket=b, Key=k, Body=k.encode())
    r = s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "a"}, {"Key": "b"}, {"Key": "zz"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["a", "b", "zz"]
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=b)["Contents"]] == ["c"]
    r = s3.delete_objects(Bucket=b, Delete={"Objects": [{"Key": "c"}], "Quiet": True})
    assert not r.get("Deleted")
    assert s3.list_objects_v2(Bucket=b)["KeyCount"] == 0


# ---------------------------------------------------------------- listing


def fill(s3, b, keys):
    for k in keys:
        s3.put_object(Bucket=b, Key=k, Body=b"")


def test_list_v2_prefix_delimiter_pages(s3):
    b = new_bucket(s3)
    keys = ["a", "b/1", "b/2", "b/c/3", "c", "d/4", "e"]
    fill(s3, b, keys)
    r = s3.list_objects_v2(Bucket=b)
    assert [o["Key"] for o in r["Contents"]] == keys and not r["IsTruncated"]
    r = s3.list_objects_v2(Bucket=b, Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a", "c", "e"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/", "d/"]
    r = s3.list_objects_v2(Bucket=b, Prefix="b/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["b/1", "b/2"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["b/c/"]
    # Pages of 2 with the delimiter: every entry exactly once.
    seen, token = [], None
    for _ in range(10):
        kw = {"ContinuationToken": token} if token else {}
        r = s3.list_objects_v2(Bucket=b, Delimiter="/", MaxKeys=2, **kw)
        seen += [o["Key"] for o in r.get("Contents", [])] + [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
    assert sorted(seen) == ["a", "b/", "c", "d/", "e"]
    r = s3.list_objects_v2(Bucket=b, StartAfter="b/2")
    assert [o["Key"] for o in r["Contents"]] == ["b/c/3", "c", "d/4", "e"]
    r = s3.list_objects_v2(Bucket=b, MaxKeys=0)
    assert r["KeyCount"] == 0 and not r["IsTruncated"]


def test_list_v1_markers_and_url_encoding(s3):
    b = new_bucket(s3)
    fill(s3, b, ["a b", "a+c", "x/1", "x/2", "y"])
    r = s3.list_objects(Bucket=b, MaxKeys=2)
    assert [o["Key"] for o in r["Contents"]] == ["a b", "a+c"] and r["IsTruncated"]
    r = s3.list_objects(Bucket=b, Marker="a+c", Delimiter="/", MaxKeys=1)
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["x/"]
    assert r["IsTruncated"] and r["NextMarker"] == "x/"
    r = s3.list_objects(Bucket=b, Marker="x/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["y"]
    # Asked for explicitly, boto3 leaves encoding-type=url answers encoded.
    r = s3.list_objects_v2(Bucket=b, EncodingType="url", Prefix="a")
    assert [o["Key"] for o in r["Contents"]] == ["a%20b", "a%2Bc"]
    r = s3.list_objects(Bucket=b, EncodingType="url", Delimiter="/", Prefix="x")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["x/"]


# ---------------------------------------------------------------- multipart


def test_multipart_upload_copy_list_complete(s3):
    b = new_bucket(s3)
    p1, p2 = os.urandom(5 * MiB), os.urandom(1234)
    up = s3.create_multipart_upload(Bucket=b, Key="mp", Metadata={"m": "1"}, ContentType="x/y")
    uid = up["UploadId"]
    e1 = s3.upload_part(Bucket=b, Key="mp", UploadId=uid, PartNumber=1, Body=p1)["ETag"]
    e2 = s3.upload_part(Bucket=b, Key="mp", UploadId=uid, PartNumber=2, Body=p2)["ETag"]
    # An unused part 3 is dropped at completion.
    s3.upload_part(Bucket=b, Key="mp", UploadId=uid, PartNumber=3, Body=b"unused")
    parts = s3.list_parts(Bucket=b, Key="mp", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, len(p1)), (2, len(p2)), (3, 6)]
    ups = s3.list_multipart_uploads(Bucket=b)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("mp", uid)]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="mp")
    assert code(e) == "NoSuchKey"  # not visible before completion
    r = s3.complete_multipart_upload(
        Bucket=b, Key="mp", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]},
    )
    md5s = hashlib.md5(p1).digest() + hashlib.md5(p2).digest()
    assert r["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-2"'
    assert body(s3, b, "mp") == p1 + p2
    assert s3.get_object(Bucket=b, Key="mp", Range="bytes=5242870-5242889")["Body"].read() == (p1 + p2)[5242870:5242890]
    h = s3.head_object(Bucket=b, Key="mp")
    assert h["ContentLength"] == len(p1) + len(p2) and h["Metadata"] == {"m": "1"} and h["ContentType"] == "x/y"
    assert s3.get_object(Bucket=b, Key="mp", PartNumber=2)["Body"].read() == p2
    assert s3.list_multipart_uploads(Bucket=b).get("Uploads", []) == []
    # Upload part copy, from the multipart object into a new upload.
    uid2 = s3.create_multipart_upload(Bucket=b, Key="mp2")["UploadId"]
    c1 = s3.upload_part_copy(Bucket=b, Key="mp2", UploadId=uid2, PartNumber=1,
                             CopySource={"Bucket": b, "Key": "mp"}, CopySourceRange=f"bytes=0-{5 * MiB - 1}")
    c2 = s3.upload_part_copy(Bucket=b, Key="mp2", UploadId=uid2, PartNumber=2,
                             CopySource={"Bucket": b, "Key": "mp"})
    s3.complete_multipart_upload(
        Bucket=b, Key="mp2", UploadId=uid2,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": c1["CopyPartResult"]["ETag"]},
                                   {"PartNumber": 2, "ETag": c2["CopyPartResult"]["ETag"]}]},
    )
    assert body(s3, b, "mp2") == p1 + p1 + p2
    # Overwriting and deleting a multipart object frees its parts.
    s3.put_object(Bucket=b, Key="mp", Body=b"small now")
    assert body(s3, b, "mp") == b"small now"
    s3.delete_object(Bucket=b, Key="mp2")


def test_multipart_errors(s3):
    b = new_bucket(s3)
    uid = s3.create_multipart_upload(Bucket=b, Key="e")["UploadId"]
    e1 = s3.upload_part(Bucket=b, Key="e", UploadId=uid, PartNumber=1, Body=b"tiny")["ETag"]
    e2 = s3.upload_part(Bucket=b, Key="e", UploadId=uid, PartNumber=2, Body=b"tiny2")["ETag"]

    def complete(parts):
        with pytest.raises(ClientError) as e:
            s3.complete_multipart_upload(Bucket=b, Key="e", UploadId=uid, MultipartUpload={"Parts": parts})
        return code(e)

    assert complete([{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]) == "EntityTooSmall"
    assert complete([{"PartNumber": 1, "ETag": '"00000000000000000000000000000000"'}]) == "InvalidPart"
    assert complete([{"PartNumber": 5, "ETag": e1}]) == "InvalidPart"
    assert complete([{"PartNumber": 2, "ETag": e2}, {"PartNumber": 1, "ETag": e1}]) == "InvalidPartOrder"
    # A single small part is fine (the last part may be small).
    s3.complete_multipart_upload(Bucket=b, Key="e", UploadId=uid,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})
    assert body(s3, b, "e") == b"tiny"
    for op in (
        lambda: s3.upload_part(Bucket=b, Key="e", UploadId=uid, PartNumber=1, Body=b"x"),
        lambda: s3.list_parts(Bucket=b, Key="e", UploadId=uid),
        lambda: s3.abort_multipart_upload(Bucket=b, Key="e", UploadId="bogus"),
    ):
        with pytest.raises(ClientError) as e:
            op()
        assert code(e) == "NoSuchUpload"
    uid = s3.create_multipart_upload(Bucket=b, Key="ab")["UploadId"]
    s3.upload_part(Bucket=b, Key="ab", UploadId=uid, PartNumber=1, Body=b"x" * 100)
    s3.abort_multipart_upload(Bucket=b, Key="ab", UploadId=uid)
    with pytest.raises(ClientError) as e:
        s3.list_parts(Bucket=b, Key="ab", UploadId=uid)
    assert code(e) == "NoSuchUpload"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="ab")
    assert code(e) == "NoSuchKey"


# ---------------------------------------------------------------- checksums


@pytest.mark.parametrize("alg", ["CRC32", "CRC32C", "SHA1", "SHA256"])
def test_checksums_verified_stored_returned(s3, alg):
    b = new_bucket(s3)
    data = os.urandom(100_000)
    s3.put_object(Bucket=b, Key="k", Body=data, ChecksumAlgorithm=alg)
    h = s3.head_object(Bucket=b, Key="k", ChecksumMode="ENABLED")
    got = h[f"Checksum{alg}"]
    if alg == "SHA256":
        assert got == base64.b64encode(hashlib.sha256(data).digest()).decode()
    if alg == "CRC32":
        assert got == base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    g = s3.get_object(Bucket=b, Key="k", ChecksumMode="ENABLED")
    assert g[f"Checksum{alg}"] == got and g["Body"].read() == data


def test_bad_checksum_and_content_md5_are_refused(s3):
    b = new_bucket(s3)
    wrong = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=b, Key="k", Body=b"data", ChecksumSHA256=wrong)
    assert code(e) == "BadDigest"
    wrong_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=b, Key="k", Body=b"data", ContentMD5=wrong_md5)
    assert code(e) == "BadDigest"
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="k")
    assert code(e) == "NoSuchKey"  # nothing half-written is visible


# ---------------------------------------------------------------- versioning


def test_versioning(s3):
    b = new_bucket(s3)
    s3.put_object(Bucket=b, Key="k", Body=b"v0")  # a null version, before versioning
    assert s3.get_bucket_versioning(Bucket=b).get("Status") is None
    s3.put_bucket_versioning(Bucket=b, VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket=b)["Status"] == "Enabled"
    v1 = s3.put_object(Bucket=b, Key="k", Body=b"v1")["VersionId"]
    v2 = s3.put_object(Bucket=b, Key="k", Body=b"v2")["VersionId"]
    assert v1 != v2 and "null" not in (v1, v2)
    assert body(s3, b, "k") == b"v2"
    assert body(s3, b, "k", VersionId=v1) == b"v1"
    assert body(s3, b, "k", VersionId="null") == b"v0"
    vs = s3.list_object_versions(Bucket=b)["Versions"]
    assert [(v["VersionId"], v["IsLatest"]) for v in vs] == [(v2, True), (v1, False), ("null", False)]
    d = s3.delete_object(Bucket=b, Key="k")
    assert d["DeleteMarker"] is True
    marker = d["VersionId"]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="k")
    assert code(e) == "NoSuchKey"
    assert s3.list_objects_v2(Bucket=b)["KeyCount"] == 0
    r = s3.list_object_versions(Bucket=b)
    assert [(m["VersionId"], m["IsLatest"]) for m in r["DeleteMarkers"]] == [(marker, True)]
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="k", VersionId=marker)
    assert status(e) == 405
    with pytest.raises(ClientError) as e:
        s3.get_object(Bucket=b, Key="k", VersionId="00000000deadbeef")
    assert code(e) == "NoSuchVersion"
    # Removing the marker brings v2 back; removing v2 for good leaves v1.
    s3.delete_object(Bucket=b, Key="k", VersionId=marker)
    assert body(s3, b, "k") == b"v2"
    s3.delete_object(Bucket=b, Key="k", VersionId=v2)
    assert body(s3, b, "k") == b"v1"
    h = s3.head_object(Bucket=b, Key="k")
    assert h["VersionId"] == v1
    # Pagination of versions, one at a time.
    seen, km, vm = [], None, None
    for _ in range(10):
        kw = {"KeyMarker": km, "VersionIdMarker": vm} if km else {}
        r = s3.list_object_versions(Bucket=b, MaxKeys=1, **kw)
        seen += [v["VersionId"] for v in r.get("Versions", [])]
        if not r["IsTruncated"]:
            break
        km, vm = r["NextKeyMarker"], r["NextVersionIdMarker"]
    assert seen == [v1, "null"]
    # Suspended: new writes are the null version, replacing the old null one.
    s3.put_bucket_versioning(Bucket=b, VersioningConfiguration={"Status": "Suspended"})
    r = s3.put_object(Bucket=b, Key="k", Body=b"s1")
    assert r.get("VersionId") in (None, "null")
    vs = s3.list_object_versions(Bucket=b)["Versions"]
    assert [(v["VersionId"], v["IsLatest"]) for v in vs] == [("null", True), (v1, False)]
    assert body(s3, b, "k", VersionId="null") == b"s1"


def test_unversioned_bucket_answers_null_versions(s3):
    b = new_bucket(s3)
    s3.put_object(Bucket=b, Key="k", Body=b"x")
    s3.put_object(Bucket=b, Key="k", Body=b"y")
    vs = s3.list_object_versions(Bucket=b)["Versions"]
    assert [(v["VersionId"], v["IsLatest"]) for v in vs] == [("null", True)]
    assert body(s3, b, "k", VersionId="null") == b"y"


# ---------------------------------------------------------------- tagging


def test_object_tagging(s3):
    b = new_bucket(s3)
    s3.put_object(Bucket=b, Key="t", Body=b"x", Tagging="a=1&b=two%20words")
    tags = s3.get_object_tagging(Bucket=b, Key="t")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("a", "1"), ("b", "two words")]
    assert s3.get_object(Bucket=b, Key="t")["TagCount"] == 2
    s3.put_object_tagging(Bucket=b, Key="t", Tagging={"TagSet": [{"Key": "c", "Value": "3"}]})
    assert s3.get_object_tagging(Bucket=b, Key="t")["TagSet"] == [{"Key": "c", "Value": "3"}]
    s3.delete_object_tagging(Bucket=b, Key="t")
    assert s3.get_object_tagging(Bucket=b, Key="t")["TagSet"] == []
    with pytest.raises(ClientError) as e:
        s3.put_object_tagging(Bucket=b, Key="t", Tagging={"TagSet": [{"Key": f"k{i}", "Value": "v"} for i in range(11)]})
    assert code(e) == "InvalidTag"
    with pytest.raises(ClientError) as e:
        s3.get_object_tagging(Bucket=b, Key="nope")
    assert code(e) == "NoSuchKey"


# ------------------------------------------------- quota (bucket set up by boto.rs)


def test_quota_exceeded():
    qb = os.environ.get("S3_QUOTA_BUCKET")
    if not qb:
        pytest.skip("boto.rs sets S3_QUOTA_BUCKET")
    s3 = client()
    with pytest.raises(ClientError) as e:
        for i in range(8):
            s3.put_object(Bucket=qb, Key=f"big{i}", Body=os.urandom(1 * MiB))
    assert code(e) == "QuotaExceeded"
    assert status(e) == 403


# ------------------------------------------------- crash (driven by boto.rs)

CRASH_BUCKET = "crashb"


def test_crash_put():
    s3 = client()
    s3.create_bucket(Bucket=CRASH_BUCKET)
    for i in range(20):
        s3.put_object(Bucket=CRASH_BUCKET, Key=f"k{i}", Body=f"value {i}".encode() * 100)
    uid = s3.create_multipart_upload(Bucket=CRASH_BUCKET, Key="mp")["UploadId"]
    p1 = bytes(range(256)) * (5 * MiB // 256)
    e1 = s3.upload_part(Bucket=CRASH_BUCKET, Key="mp", UploadId=uid, PartNumber=1, Body=p1)["ETag"]
    e2 = s3.upload_part(Bucket=CRASH_BUCKET, Key="mp", UploadId=uid, PartNumber=2, Body=b"tail")["ETag"]
    s3.complete_multipart_upload(Bucket=CRASH_BUCKET, Key="mp", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    s3.copy_object(Bucket=CRASH_BUCKET, Key="copy", CopySource={"Bucket": CRASH_BUCKET, "Key": "k3"})
    # An upload left incomplete: after the crash it is still an upload, never an object.
    uid = s3.create_multipart_upload(Bucket=CRASH_BUCKET, Key="half")["UploadId"]
    s3.upload_part(Bucket=CRASH_BUCKET, Key="half", UploadId=uid, PartNumber=1, Body=b"h" * 1000)


def test_crash_check():
    s3 = client()
    for i in range(20):
        assert body(s3, CRASH_BUCKET, f"k{i}") == f"value {i}".encode() * 100
    p1 = bytes(range(256)) * (5 * MiB // 256)
    assert body(s3, CRASH_BUCKET, "mp") == p1 + b"tail"
    assert body(s3, CRASH_BUCKET, "copy") == b"value 3" * 100
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=CRASH_BUCKET)["Contents"]]
    assert "half" not in keys
    ups = s3.list_multipart_uploads(Bucket=CRASH_BUCKET)["Uploads"]
    assert [u["Key"] for u in ups] == ["half"]


# ------------------------------------------------- snapshots (driven by boto.rs)

SNAP_BUCKET = "snapb"


def test_snap_prepare():
    s3 = client()
    s3.create_bucket(Bucket=SNAP_BUCKET)
    s3.put_object(Bucket=SNAP_BUCKET, Key="before", Body=b"in the snapshot")


def test_snap_check():
    s3 = client()
    s3.put_object(Bucket=SNAP_BUCKET, Key="after", Body=b"not in it")
    s3.delete_object(Bucket=SNAP_BUCKET, Key="before")
    snap = f"{SNAP_BUCKET}--snap--monday-1"
    s3.head_bucket(Bucket=snap)
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=snap)["Contents"]] == ["before"]
    assert body(s3, snap, "before") == b"in the snapshot"
    with pytest.raises(ClientError) as e:
        s3.put_object(Bucket=snap, Key="x", Body=b"x")
    assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        s3.delete_object(Bucket=snap, Key="before")
    assert code(e) == "AccessDenied"
    with pytest.raises(ClientError) as e:
        s3.head_bucket(Bucket=f"{SNAP_BUCKET}--snap--nosuch")
    assert status(e) == 404


def test_s3_tests_compat_details(s3):
    b = new_bucket(s3)
    # A bucket with an upload in progress (and no objects) can go.
    s3.create_multipart_upload(Bucket=b, Key="pending")
    s3.delete_bucket(Bucket=b)
    b = new_bucket(s3)
    # ACLs: the owner's full control is answered; anything else refused.
    s3.put_object(Bucket=b, Key="k", Body=b"x", Tagging="z=1&a=2")
    grants = s3.get_object_acl(Bucket=b, Key="k")["Grants"]
    assert [g["Permission"] for g in grants] == ["FULL_CONTROL"]
    s3.put_bucket_acl(Bucket=b, ACL="private")
    with pytest.raises(ClientError) as e:
        s3.put_bucket_acl(Bucket=b, ACL="public-read")
    assert code(e) == "NotImplemented"
    h = s3.head_object(Bucket=b, Key="k")
    assert h["ResponseMetadata"]["HTTPHeaders"]["x-amz-tagging-count"] == "2"
    assert [t["Key"] for t in s3.get_object_tagging(Bucket=b, Key="k")["TagSet"]] == ["a", "z"]
    # Completing twice answers as the first time.
    uid = s3.create_multipart_upload(Bucket=b, Key="m")["UploadId"]
    e1 = s3.upload_part(Bucket=b, Key="m", UploadId=uid, PartNumber=1, Body=b"p")["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": e1}]}
    r1 = s3.complete_multipart_upload(Bucket=b, Key="m", UploadId=uid, MultipartUpload=parts)
    r2 = s3.complete_multipart_upload(Bucket=b, Key="m", UploadId=uid, MultipartUpload=parts)
    assert r1["ETag"] == r2["ETag"]
    # Suspending a never-versioned bucket is remembered.
    b2 = new_bucket(s3)
    s3.put_bucket_versioning(Bucket=b2, VersioningConfiguration={"Status": "Suspended"})
    assert s3.get_bucket_versioning(Bucket=b2)["Status"] == "Suspended"
