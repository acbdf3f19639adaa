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


def test_awscli_s3api_objects(s3, tmp_path):
    api = lambda *a: s3.aws_json("s3api", *a)  # noqa: E731
    api("create-bucket", "--bucket", "docs")
    api("head-bucket", "--bucket", "docs")
    loc = api("get-bucket-location", "--bucket", "docs")
    assert loc.get("LocationConstraint") in (None, "", "us-east-1"), loc
    assert "docs" in [b["Name"] for b in api("list-buckets")["Buckets"]]

    body = tmp_path / "body"
    body.write_bytes(b"0123456789" * 100)
    put = api("put-object", "--bucket", "docs", "--key", "a/b.txt", "--body", body,
              "--content-type", "text/plain", "--content-disposition", "attachment",
              "--cache-control", "no-cache", "--metadata", "color=blue,Owner=Ann")
    assert put["ETag"].strip('"') == md5(body.read_bytes())
    head = api("head-object", "--bucket", "docs", "--key", "a/b.txt")
    assert head["ContentLength"] == 1000 and head["ContentType"] == "text/plain"
    assert head["ContentDisposition"] == "attachment" and head["CacheControl"] == "no-cache"
    assert head["Metadata"] == {"color": "blue", "owner": "Ann"}, head["Metadata"]
    assert head["ETag"] == put["ETag"]

    # ranged GET
    out = tmp_path / "out"
    g = api("get-object", "--bucket", "docs", "--key", "a/b.txt", "--range", "bytes=995-", out)
    assert out.read_bytes() == b"56789" and g["ContentRange"] == "bytes 995-999/1000"

    # copy within and across buckets; REPLACE changes metadata, COPY keeps it
    api("create-bucket", "--bucket", "docs-2")
    api("copy-object", "--bucket", "docs", "--key", "copy.txt", "--copy-source", "docs/a/b.txt")
    assert api("head-object", "--bucket", "docs", "--key", "copy.txt")["Metadata"] == head["Metadata"]
    api("copy-object", "--bucket", "docs-2", "--key", "x", "--copy-source", "docs/a/b.txt",
        "--metadata-directive", "REPLACE", "--metadata", "k=v", "--content-type", "application/x-y")
    h2 = api("head-object", "--bucket", "docs-2", "--key", "x")
    assert h2["Metadata"] == {"k": "v"} and h2["ContentType"] == "application/x-y" and h2["ETag"] == put["ETag"]

    # tagging
    api("put-object-tagging", "--bucket", "docs", "--key", "a/b.txt", "--tagging",
        json.dumps({"TagSet": [{"Key": "project", "Value": "x1"}, {"Key": "tier", "Value": "cold"}]}))
    tags = api("get-object-tagging", "--bucket", "docs", "--key", "a/b.txt")["TagSet"]
    assert sorted((t["Key"], t["Value"]) for t in tags) == [("project", "x1"), ("tier", "cold")]
    api("delete-object-tagging", "--bucket", "docs", "--key", "a/b.txt")
    assert api("get-object-tagging", "--bucket", "docs", "--key", "a/b.txt")["TagSet"] == []
    api("put-object", "--bucket", "docs", "--key", "tagged", "--body", body, "--tagging", "a=1&b=2")
    assert len(api("get-object-tagging", "--bucket", "docs", "--key", "tagged")["TagSet"]) == 2

    # conditional requests
    etag = put["ETag"]
    api("get-object", "--bucket", "docs", "--key", "a/b.txt", "--if-match", etag, out)
    p = s3.aws("s3api", "get-object", "--bucket", "docs", "--key", "a/b.txt", "--if-match", '"0000"', out,
               check=False)
    assert p.returncode != 0 and "PreconditionFailed" in p.stderr, p.stderr
    p = s3.aws("s3api", "get-object", "--bucket", "docs", "--key", "a/b.txt", "--if-none-match", etag, out,
               check=False)
    assert p.returncode != 0 and "304" in p.stderr, p.stderr
    p = s3.aws("s3api", "put-object", "--bucket", "docs", "--key", "a/b.txt", "--body", body,
               "--if-none-match", "*", check=False)
    assert p.returncode != 0 and "PreconditionFailed" in p.stderr, p.stderr
    api("put-object", "--bucket", "docs", "--key", "fresh", "--body", body, "--if-none-match", "*")

    # DeleteObjects, with a key that does not exist (S3 reports it deleted)
    d = api("delete-objects", "--bucket", "docs", "--delete",
            json.dumps({"Objects": [{"Key": "copy.txt"}, {"Key": "tagged"}, {"Key": "never-was"}]}))
    assert sorted(x["Key"] for x in d["Deleted"]) == ["copy.txt", "never-was", "tagged"], d
    keys = [o["Key"] for o in api("list-objects-v2", "--bucket", "docs").get("Contents", [])]
    assert keys == ["a/b.txt", "fresh"]


def test_awscli_s3api_listing(s3, tmp_path):
    api = lambda *a: s3.aws_json("s3api", *a)  # noqa: E731
    api("create-bucket", "--bucket", "listing")
    keys = sorted([f"dir{i}/file{j:02}" for i in range(3) for j in range(5)] + ["top", "a+b c", "ä/é"])
    c = s3.client()
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
    # encoding-type=url: keys come back form-encoded (the CLI prints them as sent)
    raw = s3.aws_json("s3api", "list-objects-v2", "--bucket", "listing", "--prefix", "a",
                      "--encoding-type", "url")
    assert [o["Key"] for o in raw["Contents"]] == ["a%2Bb+c"]
    # v1 with marker, via the CLI's paginator
    v1 = api("list-objects", "--bucket", "listing", "--marker", "dir2/file03")
    assert [o["Key"] for o in v1["Contents"]] == ["dir2/file04", "top", "ä/é"]
    v1 = c.list_objects(Bucket="listing", MaxKeys=3)
    assert v1["IsTruncated"] and [o["Key"] for o in v1["Contents"]] == keys[:3]
    r = c.list_objects(Bucket="listing", Prefix="ä/", EncodingType="url")
    assert [urllib.parse.unquote_plus(o["Key"]) for o in r["Contents"]] == ["ä/é"]


def test_awscli_s3api_versioning_multipart(s3, tmp_path):
    api = lambda *a: s3.aws_json("s3api", *a)  # noqa: E731
    api("create-bucket", "--bucket", "vers")
    f = tmp_path / "f"
    # an unversioned bucket answers with null versions
    f.write_bytes(b"unversioned")
    api("put-object", "--bucket", "vers", "--key", "k", "--body", f)
    vs = api("list-object-versions", "--bucket", "vers")["Versions"]
    assert [(v["Key"], v["VersionId"]) for v in vs] == [("k", "null")]

    api("put-bucket-versioning", "--bucket", "vers", "--versioning-configuration", "Status=Enabled")
    assert api("get-bucket-versioning", "--bucket", "vers")["Status"] == "Enabled"
    ids = []
    for i in range(3):
        f.write_bytes(f"version {i}".encode())
        ids.append(api("put-object", "--bucket", "vers", "--key", "k", "--body", f)["VersionId"])
    assert len(set(ids)) == 3 and "null" not in ids
    out = tmp_path / "o"
    api("get-object", "--bucket", "vers", "--key", "k", "--version-id", ids[0], out)
    assert out.read_bytes() == b"version 0"
    api("get-object", "--bucket", "vers", "--key", "k", "--version-id", "null", out)
    assert out.read_bytes() == b"unversioned"
    dm = api("delete-object", "--bucket", "vers", "--key", "k")
    assert dm["DeleteMarker"] is True
    p = s3.aws("s3api", "head-object", "--bucket", "vers", "--key", "k", check=False)
    assert p.returncode != 0 and "404" in p.stderr
    lv = api("list-object-versions", "--bucket", "vers")
    assert len(lv["Versions"]) == 4 and len(lv["DeleteMarkers"]) == 1
    assert lv["DeleteMarkers"][0]["IsLatest"] and lv["DeleteMarkers"][0]["VersionId"] == dm["VersionId"]
    # deleting the marker brings the newest version back; deleting a version removes it
    api("delete-object", "--bucket", "vers", "--key", "k", "--version-id", dm["VersionId"])
    api("get-object", "--bucket", "vers", "--key", "k", out)
    assert out.read_bytes() == b"version 2"
    api("delete-object", "--bucket", "vers", "--key", "k", "--version-id", ids[1])
    left = [v["VersionId"] for v in api("list-object-versions", "--bucket", "vers")["Versions"]]
    assert sorted(left) == sorted([ids[0], ids[2], "null"])
    api("put-bucket-versioning", "--bucket", "vers", "--versioning-configuration", "Status=Suspended")
    f.write_bytes(b"suspended")
    assert api("put-object", "--bucket", "vers", "--key", "k", "--body", f).get("VersionId", "null") == "null"

    # multipart by hand: two parts, list parts and uploads, UploadPartCopy, complete
    part1 = helpers.pattern("p1", 5 * MiB)
    part2 = helpers.pattern("p2", 1234)
    f.write_bytes(part1)
    up = api("create-multipart-upload", "--bucket", "vers", "--key", "mp", "--content-type", "x/y")["UploadId"]
    e1 = api("upload-part", "--bucket", "vers", "--key", "mp", "--upload-id", up, "--part-number", "1",
             "--body", f)["ETag"]
    f.write_bytes(part2)
    api("put-object", "--bucket", "vers", "--key", "src", "--body", f)
    e2 = api("upload-part-copy", "--bucket", "vers", "--key", "mp", "--upload-id", up, "--part-number", "2",
             "--copy-source", "vers/src")["CopyPartResult"]["ETag"]
    ups = api("list-multipart-uploads", "--bucket", "vers")["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in ups] == [("mp", up)]
    parts = api("list-parts", "--bucket", "vers", "--key", "mp", "--upload-id", up)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [(1, 5 * MiB), (2, 1234)]
    done = api("complete-multipart-upload", "--bucket", "vers", "--key", "mp", "--upload-id", up,
               "--multipart-upload", json.dumps({"Parts": [{"PartNumber": 1, "ETag": e1},
                                                           {"PartNumber": 2, "ETag": e2}]}))
    want = hashlib.md5(bytes.fromhex(e1.strip('"')) + bytes.fromhex(e2.strip('"'))).hexdigest() + "-2"
    assert done["ETag"].strip('"') == want
    api("get-object", "--bucket", "vers", "--key", "mp", out)
    assert out.read_bytes() == part1 + part2
    assert api("head-object", "--bucket", "vers", "--key", "mp")["ContentType"] == "x/y"
    assert api("list-multipart-uploads", "--bucket", "vers").get("Uploads", []) == []
    # abort: the upload and its parts are gone, no object appears
    up = api("create-multipart-upload", "--bucket", "vers", "--key", "aborted")["UploadId"]
    api("upload-part", "--bucket", "vers", "--key", "aborted", "--upload-id", up, "--part-number", "1",
        "--body", f)
    api("abort-multipart-upload", "--bucket", "vers", "--key", "aborted", "--upload-id", up)
    assert api("list-multipart-uploads", "--bucket", "vers").get("Uploads", []) == []
    p = s3.aws("s3api", "head-object", "--bucket", "vers", "--key", "aborted", check=False)
    assert p.returncode != 0 and "404" in p.stderr


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
