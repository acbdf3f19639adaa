"""Real S3 clients against `cistern serve --s3`: awscli, boto3, rclone, restic.

Each test starts its own daemon and pool (the `s3` fixture, tests/s3_helpers.py);
with CISTERN_S3_REFERENCE=/path/to/minio the same tests run against MinIO.
"""

from __future__ import annotations

import hashlib
import json
import os
import urllib.parse

import pytest

import helpers
from conftest import run
from s3_helpers import DOMAIN, expect_error, http, signed_request, tool

MiB = 1 << 20
KiB = 1 << 10


def md5(b: bytes) -> str:
    return hashlib.md5(b).hexdigest()


def write_tree(root, files: dict[str, bytes]):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


def read_tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ---------------------------------------------------------------- awscli


def test_awscli_s3_cp_sync_ls_rm_presign(s3, tmp_path):
    s3.aws("s3", "mb", "s3://photos")
    assert "photos" in s3.aws("s3", "ls").stdout

    # cp up and down, a multipart one (awscli splits at 8 MiB) among them
    big = helpers.pattern("big", 9 * MiB + 123)
    (tmp_path / "big.bin").write_bytes(big)
    s3.aws("s3", "cp", tmp_path / "big.bin", "s3://photos/raw/big.bin")
    s3.aws("s3", "cp", "s3://photos/raw/big.bin", tmp_path / "big.back")
    assert (tmp_path / "big.back").read_bytes() == big
    s3.aws("s3", "cp", "-", "s3://photos/stdin.txt", input="from stdin\n")
    assert s3.aws("s3", "cp", "s3://photos/stdin.txt", "-").stdout == "from stdin\n"

    # sync a tree up, change it, sync with --delete, then down into an empty dir
    src = tmp_path / "src"
    files = {f"d{i % 3}/sub/f{i}.txt": helpers.pattern(i, 100 + i * 997) for i in range(12)}
    files["empty"] = b""
    files["with space & ü.txt"] = b"odd name"
    write_tree(src, files)
    s3.aws("s3", "sync", src, "s3://photos/tree")
    (src / "d0/sub/f0.txt").write_bytes(b"changed, and of another size")
    (src / "d1/sub/f1.txt").unlink()
    out = s3.aws("s3", "sync", "--delete", src, "s3://photos/tree").stdout
    assert "f0.txt" in out and "delete: s3://photos/tree/d1/sub/f1.txt" in out, out
    assert s3.aws("s3", "sync", "--delete", src, "s3://photos/tree").stdout.strip() == "", \
        "a second sync found differences"
    dst = tmp_path / "dst"
    s3.aws("s3", "sync", "s3://photos/tree", dst)
    assert read_tree(dst) == read_tree(src)

    # ls: a prefix level, recursive with sizes, summarize
    top = s3.aws("s3", "ls", "s3://photos/tree/").stdout
    assert {l.split()[-1] for l in top.splitlines() if "PRE" in l} == {"d0/", "d1/", "d2/"}, top
    rec = s3.aws("s3", "ls", "--recursive", "--summarize", "s3://photos/tree/").stdout
    assert f"Total Objects: {len(read_tree(src))}" in rec, rec
    assert f"Total Size: {sum(map(len, read_tree(src).values()))}" in rec, rec

    # presign: a plain HTTP GET with the URL works, without it is refused
    url = s3.aws("s3", "presign", "s3://photos/raw/big.bin", "--expires-in", "300").stdout.strip()
    st, _, body = http("GET", url)
    assert st == 200 and body == big
    st, _, _ = http("GET", url.split("?")[0])
    assert st == 403

    # rm one, rm --recursive, rb
    s3.aws("s3", "rm", "s3://photos/stdin.txt")
    assert "stdin.txt" not in s3.aws("s3", "ls", "s3://photos/").stdout
    s3.aws("s3", "rm", "--recursive", "s3://photos/")
    assert s3.aws("s3", "ls", "--recursive", "s3://photos/").stdout.strip() == ""
    s3.aws("s3", "rb", "s3://photos")
    assert "photos" not in s3.aws("s3", "ls").stdout


def test_awscli_s3api(s3, tmp_path):
    """One awscli `s3api` call per feature (each CLI start costs ~1 s; the
    semantics behind them are checked with boto3 below)."""
    api = lambda *a: s3.aws_json("s3api", *a)  # noqa: E731
    api("create-bucket", "--bucket", "docs")
    api("create-bucket", "--bucket", "docs-2")
    api("head-bucket", "--bucket", "docs")
    body, out = tmp_path / "body", tmp_path / "out"
    body.write_bytes(b"0123456789" * 100)
    put = api("put-object", "--bucket", "docs", "--key", "a/b.txt", "--body", body,
              "--content-type", "text/plain", "--metadata", "color=blue", "--tagging", "project=x1")
    assert put["ETag"].strip('"') == md5(body.read_bytes())
    head = api("head-object", "--bucket", "docs", "--key", "a/b.txt")
    assert (head["ContentLength"], head["ContentType"], head["Metadata"]) == (1000, "text/plain", {"color": "blue"})
    g = api("get-object", "--bucket", "docs", "--key", "a/b.txt", "--range", "bytes=995-", out)
    assert out.read_bytes() == b"56789" and g["ContentRange"] == "bytes 995-999/1000"
    api("copy-object", "--bucket", "docs-2", "--key", "x", "--copy-source", "docs/a/b.txt",
        "--metadata-directive", "REPLACE", "--metadata", "k=v")
    api("put-object-tagging", "--bucket", "docs-2", "--key", "x", "--tagging",
        json.dumps({"TagSet": [{"Key": "tier", "Value": "cold"}]}))
    assert api("get-object-tagging", "--bucket", "docs-2", "--key", "x")["TagSet"] == [{"Key": "tier", "Value": "cold"}]
    # conditional: a GET that matches the ETag is 304, a create over an existing key 412
    p = s3.aws("s3api", "get-object", "--bucket", "docs", "--key", "a/b.txt", "--if-none-match", put["ETag"], out,
               check=False)
    assert p.returncode != 0 and "304" in p.stderr, p.stderr
    p = s3.aws("s3api", "put-object", "--bucket", "docs", "--key", "a/b.txt", "--body", body,
               "--if-none-match", "*", check=False)
    assert p.returncode != 0 and "PreconditionFailed" in p.stderr, p.stderr

    # versioning
    api("put-bucket-versioning", "--bucket", "docs", "--versioning-configuration", "Status=Enabled")
    body.write_bytes(b"second")
    v2 = api("put-object", "--bucket", "docs", "--key", "a/b.txt", "--body", body)["VersionId"]
    dm = api("delete-object", "--bucket", "docs", "--key", "a/b.txt")
    assert dm["DeleteMarker"] is True
    lv = api("list-object-versions", "--bucket", "docs", "--prefix", "a/")
    assert [(v["VersionId"], v["IsLatest"]) for v in lv["Versions"]] == [(v2, False), ("null", False)]
    assert [(m["VersionId"], m["IsLatest"]) for m in lv["DeleteMarkers"]] == [(dm["VersionId"], True)]
    api("get-object", "--bucket", "docs", "--key", "a/b.txt", "--version-id", "null", out)
    assert out.read_bytes() == b"0123456789" * 100

    # multipart: a 5 MiB part, an UploadPartCopy part, list, complete
    part1 = helpers.pattern("p1", 5 * MiB)
    body.write_bytes(part1)
    up = api("create-multipart-upload", "--bucket", "docs-2", "--key", "mp")["UploadId"]
    e1 = api("upload-part", "--bucket", "docs-2", "--key", "mp", "--upload-id", up, "--part-number", "1",
             "--body", body)["ETag"]
    e2 = api("upload-part-copy", "--bucket", "docs-2", "--key", "mp", "--upload-id", up, "--part-number", "2",
             "--copy-source", "docs-2/x", "--copy-source-range", "bytes=0-99")["CopyPartResult"]["ETag"]
    parts = api("list-parts", "--bucket", "docs-2", "--key", "mp", "--upload-id", up)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, 5 * MiB), (2, 100)]
    done = api("complete-multipart-upload", "--bucket", "docs-2", "--key", "mp", "--upload-id", up,
               "--multipart-upload", json.dumps({"Parts": [{"PartNumber": 1, "ETag": e1},
                                                           {"PartNumber": 2, "ETag": e2}]}))
    want = hashlib.md5(bytes.fromhex(e1.strip('"')) + bytes.fromhex(e2.strip('"'))).hexdigest() + "-2"
    assert done["ETag"].strip('"') == want
    api("get-object", "--bucket", "docs-2", "--key", "mp", out)
    assert out.read_bytes() == part1 + b"0123456789" * 10
    d = api("delete-objects", "--bucket", "docs-2", "--delete",
            json.dumps({"Objects": [{"Key": "mp"}, {"Key": "x"}, {"Key": "never-was"}]}))
    assert sorted(x["Key"] for x in d["Deleted"]) == ["mp", "never-was", "x"], d
    assert api("list-objects-v2", "--bucket", "docs-2").get("Contents", []) == []


def test_boto3_objects(s3):
    """Metadata, content headers, copies, tagging, conditional writes, DeleteObjects."""
    c = s3.client()
    c.create_bucket(Bucket="docs")
    c.create_bucket(Bucket="docs-2")
    assert c.get_bucket_location(Bucket="docs").get("LocationConstraint") in (None, "", "us-east-1")
    assert {"docs", "docs-2"} <= {b["Name"] for b in c.list_buckets()["Buckets"]}
    data = b"0123456789" * 100
    put = c.put_object(Bucket="docs", Key="a/b.txt", Body=data, ContentType="text/plain",
                       ContentDisposition="attachment", CacheControl="no-cache", ContentEncoding="identity",
                       ContentLanguage="en", Metadata={"color": "blue", "Owner": "Ann"})
    assert put["ETag"].strip('"') == md5(data)
    h = c.head_object(Bucket="docs", Key="a/b.txt")
    assert h["ContentLength"] == 1000 and h["ContentType"] == "text/plain" and h["ETag"] == put["ETag"]
    assert (h["ContentDisposition"], h["CacheControl"], h["ContentLanguage"]) == ("attachment", "no-cache", "en")
    assert h["Metadata"] == {"color": "blue", "owner": "Ann"}, h["Metadata"]

    # copies: COPY keeps metadata, REPLACE changes it; across buckets; onto itself with REPLACE
    c.copy_object(Bucket="docs", Key="copy.txt", CopySource={"Bucket": "docs", "Key": "a/b.txt"})
    hc = c.head_object(Bucket="docs", Key="copy.txt")
    assert hc["Metadata"] == h["Metadata"] and hc["ContentType"] == "text/plain"
    c.copy_object(Bucket="docs-2", Key="x", CopySource={"Bucket": "docs", "Key": "a/b.txt"},
                  MetadataDirective="REPLACE", Metadata={"k": "v"}, ContentType="application/x-y")
    h2 = c.head_object(Bucket="docs-2", Key="x")
    assert h2["Metadata"] == {"k": "v"} and h2["ContentType"] == "application/x-y" and h2["ETag"] == put["ETag"]
    assert c.get_object(Bucket="docs-2", Key="x")["Body"].read() == data
    c.copy_object(Bucket="docs", Key="copy.txt", CopySource={"Bucket": "docs", "Key": "copy.txt"},
                  MetadataDirective="REPLACE", Metadata={"new": "1"})
    assert c.head_object(Bucket="docs", Key="copy.txt")["Metadata"] == {"new": "1"}
    assert c.get_object(Bucket="docs", Key="copy.txt")["Body"].read() == data

    # tagging
    c.put_object_tagging(Bucket="docs", Key="a/b.txt", Tagging={"TagSet": [
        {"Key": "project", "Value": "x1"}, {"Key": "tier", "Value": "cold"}]})
    tags = c.get_object_tagging(Bucket="docs", Key="a/b.txt")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("project", "x1"), ("tier", "cold")]
    assert c.head_object(Bucket="docs", Key="a/b.txt").get("ResponseMetadata", {}).get(
        "HTTPHeaders", {}).get("x-amz-tagging-count") in (None, "2")
    c.delete_object_tagging(Bucket="docs", Key="a/b.txt")
    assert c.get_object_tagging(Bucket="docs", Key="a/b.txt")["TagSet"] == []
    c.put_object(Bucket="docs", Key="tagged", Body=b"t", Tagging="a=1&b=2")
    assert len(c.get_object_tagging(Bucket="docs", Key="tagged")["TagSet"]) == 2

    # conditional create: only the first of two creates wins
    c.put_object(Bucket="docs", Key="fresh", Body=b"first", IfNoneMatch="*")
    expect_error("PreconditionFailed", 412, c.put_object, Bucket="docs", Key="fresh", Body=b"second", IfNoneMatch="*")
    assert c.get_object(Bucket="docs", Key="fresh")["Body"].read() == b"first"

    # DeleteObjects, with a key that does not exist (S3 reports it deleted), quiet mode
    d = c.delete_objects(Bucket="docs", Delete={"Objects": [{"Key": "copy.txt"}, {"Key": "never-was"}]})
    assert sorted(x["Key"] for x in d["Deleted"]) == ["copy.txt", "never-was"] and not d.get("Errors")
    d = c.delete_objects(Bucket="docs", Delete={"Objects": [{"Key": "tagged"}], "Quiet": True})
    assert not d.get("Deleted") and not d.get("Errors")
    assert [o["Key"] for o in c.list_objects_v2(Bucket="docs")["Contents"]] == ["a/b.txt", "fresh"]


def test_listing(s3, tmp_path):
    """ListObjects v1 and v2: prefix, delimiter, pagination, start-after, encoding-type=url."""
    api = lambda *a: s3.aws_json("s3api", *a)  # noqa: E731
    keys = sorted([f"dir{i}/file{j:02}" for i in range(3) for j in range(5)] + ["top", "a+b c", "ä/é"])
    c = s3.client()
    c.create_bucket(Bucket="listing")
    for k in keys:
        c.put_object(Bucket="listing", Key=k, Body=k.encode())

    # v2: delimiter gives common prefixes; pagination with max-keys walks all
    r = c.list_objects_v2(Bucket="listing", Delimiter="/")
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["dir0/", "dir1/", "dir2/", "ä/"]
    assert [o["Key"] for o in r["Contents"]] == ["a+b c", "top"]
    got, token, pages = [], None, 0
    while True:
        kw = {"ContinuationToken": token} if token else {}
        r = c.list_objects_v2(Bucket="listing", MaxKeys=4, **kw)
        pages += 1
        got += [o["Key"] for o in r.get("Contents", [])]
        assert r["KeyCount"] == len(r.get("Contents", []))
        if not r["IsTruncated"]:
            break
        token = r["NextContinuationToken"]
        assert pages < 20
    assert got == keys and pages == 5
    r = c.list_objects_v2(Bucket="listing", Prefix="dir1/", StartAfter="dir1/file02")
    assert [o["Key"] for o in r["Contents"]] == ["dir1/file03", "dir1/file04"]
    r = c.list_objects_v2(Bucket="listing", Prefix="dir", Delimiter="/", MaxKeys=2)
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["dir0/", "dir1/"] and r["IsTruncated"]
    # encoding-type=url: keys come back encoded (the CLI prints them as sent; a space
    # is '+' from MinIO and AWS, '%20' from others: clients decode both)
    raw = s3.aws_json("s3api", "list-objects-v2", "--bucket", "listing", "--prefix", "a",
                      "--encoding-type", "url")
    assert [o["Key"].replace("%20", "+") for o in raw["Contents"]] == ["a%2Bb+c"]
    # v1 with marker, via the CLI's paginator
    v1 = api("list-objects", "--bucket", "listing", "--marker", "dir2/file03")
    assert [o["Key"] for o in v1["Contents"]] == ["dir2/file04", "top", "ä/é"]
    v1 = c.list_objects(Bucket="listing", MaxKeys=3)
    assert v1["IsTruncated"] and [o["Key"] for o in v1["Contents"]] == keys[:3]
    r = c.list_objects(Bucket="listing", Prefix="ä/", EncodingType="url")
    assert [urllib.parse.unquote_plus(o["Key"]) for o in r["Contents"]] == ["ä/é"]


def test_boto3_versioning_multipart(s3):
    """Versions, delete markers, suspended versioning; multipart list, abort."""
    c = s3.client()
    c.create_bucket(Bucket="vers")
    # an unversioned bucket answers with null versions
    c.put_object(Bucket="vers", Key="k", Body=b"unversioned")
    vs = c.list_object_versions(Bucket="vers")["Versions"]
    assert [(v["Key"], v["VersionId"]) for v in vs] == [("k", "null")]
    assert c.get_bucket_versioning(Bucket="vers").get("Status") is None

    c.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Enabled"})
    assert c.get_bucket_versioning(Bucket="vers")["Status"] == "Enabled"
    ids = [c.put_object(Bucket="vers", Key="k", Body=f"version {i}".encode())["VersionId"] for i in range(3)]
    assert len(set(ids)) == 3 and "null" not in ids
    assert c.get_object(Bucket="vers", Key="k", VersionId=ids[0])["Body"].read() == b"version 0"
    assert c.get_object(Bucket="vers", Key="k", VersionId="null")["Body"].read() == b"unversioned"
    assert c.head_object(Bucket="vers", Key="k", VersionId=ids[1])["VersionId"] == ids[1]
    dm = c.delete_object(Bucket="vers", Key="k")
    assert dm["DeleteMarker"] is True
    expect_error("404", 404, c.head_object, Bucket="vers", Key="k")
    lv = c.list_object_versions(Bucket="vers")
    assert [v["VersionId"] for v in lv["Versions"]] == [ids[2], ids[1], ids[0], "null"]  # newest first
    assert len(lv["DeleteMarkers"]) == 1
    assert lv["DeleteMarkers"][0]["IsLatest"] and lv["DeleteMarkers"][0]["VersionId"] == dm["VersionId"]
    assert "k" not in [o["Key"] for o in c.list_objects_v2(Bucket="vers").get("Contents", [])]
    # paging through versions
    p1 = c.list_object_versions(Bucket="vers", MaxKeys=2)
    assert p1["IsTruncated"] and len(p1.get("Versions", [])) + len(p1.get("DeleteMarkers", [])) == 2
    p2 = c.list_object_versions(Bucket="vers", KeyMarker=p1["NextKeyMarker"],
                                VersionIdMarker=p1["NextVersionIdMarker"])
    assert len(p2.get("Versions", [])) + len(p2.get("DeleteMarkers", [])) == 3
    # deleting the marker brings the newest version back; deleting a version removes it
    c.delete_object(Bucket="vers", Key="k", VersionId=dm["VersionId"])
    assert c.get_object(Bucket="vers", Key="k")["Body"].read() == b"version 2"
    c.delete_object(Bucket="vers", Key="k", VersionId=ids[1])
    left = [v["VersionId"] for v in c.list_object_versions(Bucket="vers")["Versions"]]
    assert left == [ids[2], ids[0], "null"]
    # a copy of an old version
    c.copy_object(Bucket="vers", Key="old", CopySource={"Bucket": "vers", "Key": "k", "VersionId": ids[0]})
    assert c.get_object(Bucket="vers", Key="old")["Body"].read() == b"version 0"
    # suspended: new writes replace the null version, old versions stay
    c.put_bucket_versioning(Bucket="vers", VersioningConfiguration={"Status": "Suspended"})
    r = c.put_object(Bucket="vers", Key="k", Body=b"suspended")
    assert r.get("VersionId", "null") == "null"
    assert c.get_object(Bucket="vers", Key="k", VersionId="null")["Body"].read() == b"suspended"
    assert c.get_object(Bucket="vers", Key="k", VersionId=ids[2])["Body"].read() == b"version 2"

    # multipart: list uploads and parts, abort leaves nothing
    part = helpers.pattern("p1", 5 * MiB)
    up = c.create_multipart_upload(Bucket="vers", Key="mp", ContentType="x/y", Metadata={"m": "1"})["UploadId"]
    c.upload_part(Bucket="vers", Key="mp", UploadId=up, PartNumber=1, Body=part)
    up2 = c.create_multipart_upload(Bucket="vers", Key="aborted")["UploadId"]
    c.upload_part(Bucket="vers", Key="aborted", UploadId=up2, PartNumber=1, Body=b"x")
    ups = c.list_multipart_uploads(Bucket="vers")["Uploads"]
    assert sorted((u["Key"], u["UploadId"]) for u in ups) == sorted([("mp", up), ("aborted", up2)])
    c.abort_multipart_upload(Bucket="vers", Key="aborted", UploadId=up2)
    assert [u["Key"] for u in c.list_multipart_uploads(Bucket="vers")["Uploads"]] == ["mp"]
    e2 = c.upload_part(Bucket="vers", Key="mp", UploadId=up, PartNumber=2, Body=b"tail")["ETag"]
    e1 = c.list_parts(Bucket="vers", Key="mp", UploadId=up)["Parts"][0]["ETag"]
    c.complete_multipart_upload(Bucket="vers", Key="mp", UploadId=up, MultipartUpload={"Parts": [
        {"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    h = c.head_object(Bucket="vers", Key="mp")
    assert (h["ContentType"], h["Metadata"], h["ContentLength"]) == ("x/y", {"m": "1"}, 5 * MiB + 4)
    assert h["ETag"].strip('"').endswith("-2")
    assert c.list_multipart_uploads(Bucket="vers").get("Uploads", []) == []
    expect_error("404", 404, c.head_object, Bucket="vers", Key="aborted")


def test_virtual_host_style(s3):
    """BUCKET.DOMAIN/KEY reaches the same objects as DOMAIN/BUCKET/KEY."""
    c = s3.client()
    c.create_bucket(Bucket="vhost")
    st, _, _ = signed_request(s3, "PUT", f"vhost.{DOMAIN}", "/dir/key", b"by host")
    assert st == 200
    assert c.get_object(Bucket="vhost", Key="dir/key")["Body"].read() == b"by host"
    st, _, body = signed_request(s3, "GET", f"vhost.{DOMAIN}", "/dir/key")
    assert (st, body) == (200, b"by host")
    st, _, body = signed_request(s3, "GET", f"vhost.{DOMAIN}", "/?list-type=2&prefix=dir%2F")
    assert st == 200 and b"<Key>dir/key</Key>" in body, body
    st, _, body = signed_request(s3, "GET", DOMAIN, "/vhost/dir/key")  # path style on the domain
    assert (st, body) == (200, b"by host")


# ---------------------------------------------------------------- boto3


def test_boto3_multipart_100mib_copy_ranges_versioning(s3):
    from boto3.s3.transfer import TransferConfig

    c = s3.client()
    c.create_bucket(Bucket="big")
    c.create_bucket(Bucket="big-copy")
    data = helpers.pattern("hundred", 100 * MiB)
    import io

    cfg = TransferConfig(multipart_threshold=8 * MiB, multipart_chunksize=8 * MiB, max_concurrency=4)
    c.upload_fileobj(io.BytesIO(data), "big", "blob", Config=cfg)
    head = c.head_object(Bucket="big", Key="blob")
    assert head["ContentLength"] == len(data)
    assert head["ETag"].strip('"').endswith("-13"), head["ETag"]  # ceil(100 / 8) parts

    # server-side copy to another bucket (boto3 uses UploadPartCopy above the threshold)
    c.copy({"Bucket": "big", "Key": "blob"}, "big-copy", "blob2", Config=cfg)
    # and a single CopyObject within the bucket
    c.copy_object(Bucket="big", Key="blob-copy", CopySource={"Bucket": "big", "Key": "blob"})

    want = hashlib.sha256(data).hexdigest()
    for b, k in (("big", "blob"), ("big-copy", "blob2"), ("big", "blob-copy")):
        h = hashlib.sha256()
        body = c.get_object(Bucket=b, Key=k)["Body"]
        for chunk in iter(lambda: body.read(4 * MiB), b""):
            h.update(chunk)
        assert h.hexdigest() == want, f"{b}/{k} differs from what was uploaded"

    # ranged reads: across part boundaries, the tail, suffix ranges, one byte
    for start, end in ((0, 0), (8 * MiB - 10, 8 * MiB + 10), (37 * MiB + 5, 45 * MiB), (len(data) - 1, len(data) - 1)):
        r = c.get_object(Bucket="big-copy", Key="blob2", Range=f"bytes={start}-{end}")
        assert r["ContentRange"] == f"bytes {start}-{end}/{len(data)}"
        assert r["Body"].read() == data[start:end + 1], (start, end)
    r = c.get_object(Bucket="big", Key="blob", Range="bytes=-1000")
    assert r["Body"].read() == data[-1000:]
    r = c.get_object(Bucket="big", Key="blob", Range=f"bytes={len(data) - 5}-{len(data) + 100}")
    assert r["Body"].read() == data[-5:]
    # a part of a multipart object by number
    r = c.get_object(Bucket="big", Key="blob", PartNumber=2)
    assert r["Body"].read() == data[8 * MiB:16 * MiB] and r.get("PartsCount") == 13

    # versioning through boto3
    c.put_bucket_versioning(Bucket="big-copy", VersioningConfiguration={"Status": "Enabled"})
    v1 = c.put_object(Bucket="big-copy", Key="blob2", Body=b"small now")["VersionId"]
    vs = c.list_object_versions(Bucket="big-copy", Prefix="blob2")["Versions"]
    assert [v["VersionId"] for v in vs if v["IsLatest"]] == [v1] and len(vs) == 2
    old = [v for v in vs if not v["IsLatest"]][0]
    assert old["VersionId"] == "null" and old["Size"] == len(data)
    r = c.get_object(Bucket="big-copy", Key="blob2", VersionId="null", Range="bytes=0-99")
    assert r["Body"].read() == data[:100]
    c.delete_object(Bucket="big-copy", Key="blob2", VersionId="null")
    assert c.get_object(Bucket="big-copy", Key="blob2")["Body"].read() == b"small now"
    expect_error("NoSuchVersion", 404, c.get_object, Bucket="big-copy", Key="blob2", VersionId="null")


def test_boto3_checksums_and_chunked(s3):
    """Checksum headers (CRC32, CRC32C, SHA1, SHA256) are checked and returned;
    botocore sends them with aws-chunked bodies (trailing checksums)."""
    c = s3.client()
    c.create_bucket(Bucket="sums")
    body = helpers.pattern("sums", 300 * KiB)
    for algo in ("CRC32", "CRC32C", "SHA1", "SHA256"):
        r = c.put_object(Bucket="sums", Key=algo, Body=body, ChecksumAlgorithm=algo)
        assert r.get(f"Checksum{algo}"), f"PutObject returned no {algo} checksum: {r}"
        h = c.head_object(Bucket="sums", Key=algo, ChecksumMode="ENABLED")
        assert h.get(f"Checksum{algo}") == r[f"Checksum{algo}"]
        assert c.get_object(Bucket="sums", Key=algo)["Body"].read() == body
    # a wrong checksum is refused and leaves nothing (AWS says BadDigest, MinIO
    # XAmzContentChecksumMismatch)
    import base64

    from botocore.exceptions import ClientError

    bad = base64.b64encode(hashlib.sha256(b"other").digest()).decode()
    with pytest.raises(ClientError) as ei:
        c.put_object(Bucket="sums", Key="bad", Body=body, ChecksumSHA256=bad)
    assert ei.value.response["Error"]["Code"] in ("BadDigest", "XAmzContentChecksumMismatch"), ei.value.response
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    expect_error("404", 404, c.head_object, Bucket="sums", Key="bad")
    # Content-MD5 too
    bad_md5 = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    expect_error("BadDigest", 400, c.put_object, Bucket="sums", Key="bad", Body=body, ContentMD5=bad_md5)
    expect_error("404", 404, c.head_object, Bucket="sums", Key="bad")


# ---------------------------------------------------------------- rclone, restic


def test_rclone_sync_check(s3, tmp_path):
    c = s3.client()
    c.create_bucket(Bucket="rclone")
    src = tmp_path / "src"
    write_tree(src, {f"a/{i}.bin": helpers.pattern(f"r{i}", 1000 * i + 7) for i in range(20)}
               | {"b/big.bin": helpers.pattern("rbig", 6 * MiB), "b/empty": b""})
    env = s3.rclone_env("cis")
    rc = tool("rclone")
    run([rc, "sync", src, "cis:rclone/backup"], env=env)
    run([rc, "check", src, "cis:rclone/backup"], env=env)
    # a change not yet synced is found by check: the comparison can fail
    (src / "a/3.bin").write_bytes(b"edited")
    (src / "a/new.bin").write_bytes(b"new")
    (src / "a/4.bin").unlink()
    p = run([rc, "check", src, "cis:rclone/backup"], env=env, check=False)
    assert p.returncode != 0 and "3 differences found" in p.stderr, p.stderr
    run([rc, "sync", src, "cis:rclone/backup"], env=env)
    run([rc, "check", "--download", src, "cis:rclone/backup"], env=env)
    ls = run([rc, "lsf", "-R", "--files-only", "cis:rclone/backup"], env=env).stdout.split()
    assert sorted(ls) == sorted(read_tree(src)), ls
    assert not os.path.exists(tmp_path / "rclone.conf")


def test_restic_init_backup_check_restore(s3, tmp_path):
    s3.client().create_bucket(Bucket="restic")
    src = tmp_path / "home"
    files = {f"docs/{i}.txt": helpers.pattern(f"t{i}", 5000 + i * 311) for i in range(30)}
    files["media/movie.bin"] = helpers.pattern("movie", 12 * MiB)
    write_tree(src, files)
    env = s3.restic_env("restic")
    r = tool("restic")
    run([r, "init"], env=env)
    run([r, "backup", "--host", "test", src], env=env, timeout=300)
    (src / "docs/0.txt").write_bytes(b"second backup")
    run([r, "backup", "--host", "test", src], env=env, timeout=300)
    snaps = json.loads(run([r, "snapshots", "--json"], env=env).stdout)
    assert len(snaps) == 2
    run([r, "check", "--read-data"], env=env, timeout=300)
    run([r, "restore", snaps[0]["short_id"], "--target", tmp_path / "restored"], env=env, timeout=300)
    got = read_tree(tmp_path / "restored" / src.relative_to("/"))
    assert got == files
