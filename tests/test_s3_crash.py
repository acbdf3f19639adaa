"""kill -9 the daemon while S3 clients write: every acknowledged PUT, CopyObject
and CompleteMultipartUpload is whole after the restart, nothing is half
visible, and an interrupted upload is never an object.

Every object's body names itself (a header with key and generation followed by
bytes derived from both), so any object a listing shows can be checked whole
without knowing whether its write was acknowledged.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
import urllib.parse

import pytest

import helpers
from s3_helpers import expect_error

MiB = 1 << 20
KiB = 1 << 10
SIZES = (0, 100, 3 * KiB, 64 * KiB, 300 * KiB, 2 * MiB + 17)


@pytest.fixture
def s3c(s3):
    s3.require_cistern("kill -9 of the daemon")
    return s3


def body(key: str, gen: int, size: int) -> bytes:
    head = f"{key} {gen} {size}\n".encode()
    return head + helpers.pattern(f"{key}/{gen}", size)


def check_whole(data: bytes, key: str) -> int:
    """The generation of a stored body after checking every byte of it."""
    head, _, rest = data.partition(b"\n")
    k, gen, size = head.decode(errors="replace").rsplit(" ", 2)
    assert k == key, f"{key}: holds the body of {k!r}"
    assert data == body(key, int(gen), int(size)), f"{key}: generation {gen} is not whole ({len(data)} bytes)"
    return int(gen)


def listing(c, bucket) -> list[str]:
    keys, token = [], None
    for _ in range(100):
        kw = {"ContinuationToken": token} if token else {}
        r = c.list_objects_v2(Bucket=bucket, **kw)
        keys += [o["Key"] for o in r.get("Contents", [])]
        if not r["IsTruncated"]:
            return keys
        token = r["NextContinuationToken"]
    raise AssertionError("listing did not end")


def verify_bucket(c, bucket, acked: dict[str, int], inflight: dict[str, int]):
    """Every acknowledged key holds its acknowledged generation or the one in
    flight at the crash; every listed key is whole; nothing else is listed."""
    keys = listing(c, bucket)
    for k in keys:
        r = c.get_object(Bucket=bucket, Key=k)
        data = r["Body"].read()
        assert r["ContentLength"] == len(data)
        gen = check_whole(data, k)
        ok = {g for g in (acked.get(k), inflight.get(k)) if g is not None}
        assert gen in ok, f"{k}: generation {gen} visible, acknowledged {acked.get(k)}, in flight {inflight.get(k)}"
    missing = sorted(set(acked) - set(keys))
    assert not missing, f"acknowledged objects lost after kill -9: {missing[:10]}"


def run_writers(s3c, n_threads: int, op, kill_after: float, max_ops: int = 400, started=None):
    """Runs op(client, thread, i) in n threads until the daemon is killed
    kill_after seconds in (or each thread did max_ops). With `started`, the
    kill_after seconds count from when started() first holds (checked up to
    30 s), so a slow machine still gets its share of acknowledged work."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def worker(t):
        c = s3c.client(connect_timeout=2, read_timeout=20)
        for i in range(max_ops):
            if stop.is_set():
                return
            try:
                op(c, t, i)
            except Exception as e:  # noqa: BLE001 (the daemon died under it)
                if not stop.is_set():
                    errors.append(e)
                return

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(n_threads)]
    for th in threads:
        th.start()
    if started is not None:
        helpers.wait_until(started, timeout=30, what="the first acknowledged operations")
    time.sleep(kill_after)
    stop.set()
    s3c.kill9()
    for th in threads:
        th.join(60)
        assert not th.is_alive(), "a client thread hung after the daemon died"
    assert not errors, f"a request failed before the kill: {errors[0]!r}"


def test_kill9_during_puts(s3c):
    c = s3c.client()
    c.create_bucket(Bucket="crash")
    acked: dict[str, int] = {}
    rng = random.Random(11)
    for rnd in range(3):
        inflight: dict[str, int] = {}
        lock = threading.Lock()

        def put(cl, t, i, rnd=rnd, inflight=inflight, lock=lock):
            # new keys and overwrites of a few hot keys, one thread per key
            key = f"t{t}/new-{rnd}-{i}" if i % 3 else f"t{t}/hot-{i % 4}"
            with lock:
                gen = max(acked.get(key, 0), inflight.get(key, 0)) + 1
                inflight[key] = gen
            size = SIZES[(i + t) % len(SIZES)]
            cl.put_object(Bucket="crash", Key=key, Body=body(key, gen, size))
            with lock:
                acked[key] = gen

        run_writers(s3c, 4, put, kill_after=0.8 + rng.random())
        s3c.start()
        c = s3c.client()  # no pooled connection to the killed daemon
        verify_bucket(c, "crash", acked, inflight)
        # what survived counts as acknowledged from here on
        for k in listing(c, "crash"):
            acked[k] = check_whole(c.get_object(Bucket="crash", Key=k)["Body"].read(), k)
    assert len(acked) > 20, f"only {len(acked)} PUTs were acknowledged before the kills"


def test_kill9_during_copies(s3c):
    c = s3c.client()
    c.create_bucket(Bucket="src")
    c.create_bucket(Bucket="dst")
    sources = {}
    for i, size in enumerate((10, 200 * KiB, 6 * MiB + 5)):
        k = f"s{i}"
        c.put_object(Bucket="src", Key=k, Body=body(k, 1, size))
        sources[k] = body(k, 1, size)
    acked: dict[str, str] = {}
    rng = random.Random(12)
    for rnd in range(3):
        def copy(cl, t, i, rnd=rnd):
            src = f"s{(t + i) % len(sources)}"
            dst = f"{rnd}-{t}-{i}"
            bucket = "dst" if i % 2 else "src"
            cl.copy_object(Bucket=bucket, Key=f"copy/{dst}", CopySource={"Bucket": "src", "Key": src})
            acked[f"{bucket}/copy/{dst}"] = src

        before = len(acked)
        run_writers(s3c, 3, copy, kill_after=rng.random(), started=lambda before=before: len(acked) >= before + 4)
        s3c.start()
        c = s3c.client()  # no pooled connection to the killed daemon
        for bucket in ("src", "dst"):
            for k in listing(c, bucket):
                data = c.get_object(Bucket=bucket, Key=k)["Body"].read()
                if k.startswith("copy/"):
                    assert data in sources.values(), f"{bucket}/{k}: a copy that is not whole ({len(data)} bytes)"
                else:
                    assert data == sources[k], f"source {k} changed"
        for path, src in acked.items():
            b, k = path.split("/", 1)
            assert c.get_object(Bucket=b, Key=k)["Body"].read() == sources[src], f"acknowledged copy {path} lost"
    assert len(acked) > 10, f"only {len(acked)} copies were acknowledged"


def test_kill9_during_complete_multipart(s3c):
    c = s3c.client()
    c.create_bucket(Bucket="mpu")
    rng = random.Random(13)
    completed: dict[str, bytes] = {}
    for rnd in range(3):
        # uploads with all parts in place; only their completion races the kill
        uploads = {}
        for u in range(6):
            key = f"{rnd}/obj{u}"
            p1 = helpers.pattern(f"{key}/1", 5 * MiB)
            p2 = helpers.pattern(f"{key}/2", 1000 + u)
            up = c.create_multipart_upload(Bucket="mpu", Key=key)["UploadId"]
            e1 = c.upload_part(Bucket="mpu", Key=key, UploadId=up, PartNumber=1, Body=p1)["ETag"]
            e2 = c.upload_part(Bucket="mpu", Key=key, UploadId=up, PartNumber=2, Body=p2)["ETag"]
            uploads[key] = (up, [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}], p1 + p2)
        order = list(uploads)

        def complete(cl, t, i, order=order, uploads=uploads):
            j = t + 3 * i
            if j >= len(order):
                time.sleep(0.01)
                return
            key = order[j]
            up, parts, data = uploads[key]
            cl.complete_multipart_upload(Bucket="mpu", Key=key, UploadId=up, MultipartUpload={"Parts": parts})
            completed[key] = data

        run_writers(s3c, 3, complete, kill_after=0.02 + rng.random() * 0.15, max_ops=3)
        s3c.start()
        c = s3c.client()  # no pooled connection to the killed daemon
        visible = set(listing(c, "mpu"))
        for key in visible:
            data = c.get_object(Bucket="mpu", Key=key)["Body"].read()
            assert data == uploads.get(key, (None, None, completed.get(key)))[2], f"{key} is not whole"
            # A completion the kill cut off after its commit is an object too:
            # the next rounds check it like the acknowledged ones.
            completed[key] = data
        lost = sorted(set(completed) - visible)
        assert not lost, f"acknowledged CompleteMultipartUpload lost: {lost}"
        # an upload whose completion did not happen is no object, and can still be completed
        for key, (up, parts, data) in uploads.items():
            if key in visible:
                continue
            expect_error("NoSuchKey", 404, c.get_object, Bucket="mpu", Key=key)
            c.complete_multipart_upload(Bucket="mpu", Key=key, UploadId=up, MultipartUpload={"Parts": parts})
            assert c.get_object(Bucket="mpu", Key=key)["Body"].read() == data
            completed[key] = data
    assert c.list_multipart_uploads(Bucket="mpu").get("Uploads", []) == []


def _partial_put(s3c, bucket: str, key: str, size: int, send: int) -> http.client.HTTPConnection:
    """Starts a presigned PUT of `size` bytes and sends only `send` of them."""
    url = s3c.client().generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=300)
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    conn.putrequest("PUT", f"{u.path}?{u.query}")
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    conn.send(helpers.pattern(key, send))
    return conn


def test_interrupted_uploads_are_not_objects(s3c):
    c = s3c.client()
    c.create_bucket(Bucket="cut")
    c.put_object(Bucket="cut", Key="kept", Body=b"old body")
    # a client that goes away mid-body: no object, an old one stays as it was
    for key in ("new", "kept"):
        conn = _partial_put(s3c, "cut", key, 8 * MiB, 3 * MiB)
        conn.close()
    time.sleep(0.5)  # the daemon notices the closed connections
    expect_error("NoSuchKey", 404, c.get_object, Bucket="cut", Key="new")
    assert c.get_object(Bucket="cut", Key="kept")["Body"].read() == b"old body"

    # the daemon killed during a PUT body and during a multipart upload
    conn = _partial_put(s3c, "cut", "during-kill", 8 * MiB, 5 * MiB)
    up = c.create_multipart_upload(Bucket="cut", Key="mp")["UploadId"]
    c.upload_part(Bucket="cut", Key="mp", UploadId=up, PartNumber=1, Body=helpers.pattern("mp", 5 * MiB))
    time.sleep(0.2)
    s3c.kill9()
    conn.close()
    s3c.start()
    c = s3c.client()
    assert listing(c, "cut") == ["kept"]
    expect_error("NoSuchKey", 404, c.get_object, Bucket="cut", Key="during-kill")
    expect_error("NoSuchKey", 404, c.get_object, Bucket="cut", Key="mp")
    assert c.get_object(Bucket="cut", Key="kept")["Body"].read() == b"old body"
    # the interrupted multipart upload is still an upload (not an object) and can be aborted
    ups = c.list_multipart_uploads(Bucket="cut").get("Uploads", [])
    for u in ups:
        c.abort_multipart_upload(Bucket="cut", Key=u["Key"], UploadId=u["UploadId"])
    assert c.list_multipart_uploads(Bucket="cut").get("Uploads", []) == []
    c.delete_object(Bucket="cut", Key="kept")
    c.delete_bucket(Bucket="cut")  # nothing hidden is left in it
