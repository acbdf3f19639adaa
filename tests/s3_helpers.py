"""S3 endpoints for the client tests: a Cistern daemon serving `--s3`, or (for
checking what real clients and a reference server do) MinIO.

`CISTERN_S3_REFERENCE=/path/to/minio` runs the S3 client tests against a MinIO
started per test instead of Cistern (`CISTERN_S3_EXTERNAL=URL,KEY,SECRET`:
against a server already running); tests of Cistern-only features (users and
grants, bucket snapshots, rollback, quotas, kill -9) skip there. MinIO's answers
are the reference for what awscli, boto3, rclone and restic expect.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import helpers

REGION = "us-east-1"
PARENT = "tank"  # the dataset whose children are the S3 buckets (`[s3] parent`)
DOMAIN = "s3.local"  # virtual-host style: BUCKET.s3.local


def tool(name: str) -> str:
    """A client program: the venv's (awscli is pip-installed there) or $PATH's."""
    import sys

    venv = Path(sys.executable).parent / name
    if venv.exists():
        return str(venv)
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (scripts/test.sh installs it)")
    return found


class S3Endpoint:
    """What every S3 test needs: an endpoint, a key pair, clients."""

    kind = "?"
    endpoint: str
    access_key: str
    secret_key: str

    def __init__(self, tmp_path: Path):
        self.tmp_path = Path(tmp_path)
        self.tmp_path.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- clients
    def client(self, access_key: str | None = None, secret_key: str | None = None, **cfg):
        """A boto3 S3 client (path style, no retries: a test sees every error)."""
        import boto3
        from botocore.config import Config

        os.environ["BOTO_EXPERIMENTAL__NO_EMPTY_CONTINUE"] = "true"  # see aws_env()
        kw = dict(
            # Cistern speaks SigV4 only (botocore may presign with V2 otherwise).
            signature_version="s3v4",
            s3={"addressing_style": "path"},
            retries={"max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=60,
        )
        kw.update(cfg)
        return boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=access_key or self.access_key,
            aws_secret_access_key=secret_key or self.secret_key,
            config=Config(**kw),
        )

    def aws_env(self) -> dict:
        config = self.tmp_path / "aws-config"
        if not config.exists():
            # SigV4 for every request, presigned URLs included (Cistern refuses V2).
            config.write_text("[default]\ns3 =\n    signature_version = s3v4\n")
        e = dict(os.environ)
        e.update(
            AWS_ACCESS_KEY_ID=self.access_key,
            AWS_SECRET_ACCESS_KEY=self.secret_key,
            AWS_DEFAULT_REGION=REGION,
            AWS_CONFIG_FILE=str(self.tmp_path / "aws-config"),
            AWS_SHARED_CREDENTIALS_FILE=str(self.tmp_path / "aws-credentials"),
            AWS_EC2_METADATA_DISABLED="true",
            AWS_MAX_ATTEMPTS="1",
            AWS_PAGER="",
            # botocore sends `Expect: 100-continue` with empty bodies too and, when a
            # server answers those at once (as MinIO, S3 and hyper do), parses the next
            # response on that pooled connection wrongly and stalls until its read
            # timeout (boto/botocore#3755; `aws s3 sync` of a tree holding an empty file
            # failed ~1 run in 8 against MinIO and Cistern alike).
            BOTO_EXPERIMENTAL__NO_EMPTY_CONTINUE="true",
        )
        return e

    def aws(self, *args, check=True, timeout=120, input=None):
        """`aws --endpoint-url ... ARGS` with this endpoint's keys."""
        from conftest import run

        return run([tool("aws"), "--endpoint-url", self.endpoint, *args], check=check, timeout=timeout,
                   input=input, env=self.aws_env())

    def aws_json(self, *args, timeout=120):
        import json

        out = self.aws(*args, "--output", "json", timeout=timeout).stdout
        return json.loads(out) if out.strip() else {}

    def rclone_env(self, remote: str = "cis") -> dict:
        """rclone configured by environment only (no config file under $HOME)."""
        e = _env_without_ca_bundle()
        r = f"RCLONE_CONFIG_{remote.upper()}_"
        e.update({
            "RCLONE_CONFIG": str(self.tmp_path / "rclone.conf"),  # never created
            r + "TYPE": "s3",
            r + "PROVIDER": "Other",
            r + "ENDPOINT": self.endpoint,
            r + "ACCESS_KEY_ID": self.access_key,
            r + "SECRET_ACCESS_KEY": self.secret_key,
            r + "REGION": REGION,
            r + "FORCE_PATH_STYLE": "true",
            "RCLONE_CACHE_DIR": str(self.tmp_path / "rclone-cache"),
        })
        return e

    def restic_env(self, bucket: str, path: str = "repo") -> dict:
        e = _env_without_ca_bundle()
        e.update(
            RESTIC_REPOSITORY=f"s3:{self.endpoint}/{bucket}/{path}",
            RESTIC_PASSWORD="correct horse battery staple",
            RESTIC_CACHE_DIR=str(self.tmp_path / "restic-cache"),
            AWS_ACCESS_KEY_ID=self.access_key,
            AWS_SECRET_ACCESS_KEY=self.secret_key,
            AWS_DEFAULT_REGION=REGION,
        )
        return e

    # ---------------------------------------------------------------- server side
    def require_cistern(self, what: str):
        if self.kind != "cistern":
            pytest.skip(f"{what} is Cistern's own (running against {self.kind})")

    def stop(self):
        raise NotImplementedError


class CisternS3(S3Endpoint):
    """`cistern serve --s3 127.0.0.1:PORT` with pool `tank` (a mirror of two sparse
    files) as the buckets' parent, and user `tester` holding a read-write grant
    on every bucket."""

    kind = "cistern"

    def __init__(self, make_daemon, disks: Path, tmp_path: Path, name: str = "d", env: dict | None = None,
                 pool_size: str = "2G"):
        from conftest import free_ports

        super().__init__(tmp_path)
        (self.s3_port,) = free_ports(1)
        config = f'[s3]\nparent = "{PARENT}"\ndomain = "{DOMAIN}"\n'
        self.daemon = make_daemon(name, config=config, start=False, env=env)
        self.daemon.s3_addr = f"127.0.0.1:{self.s3_port}"
        self.daemon.start()
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"
        self.cli("pool", "create", "-s", pool_size, "tank", "mirror", disks / "s3d0", disks / "s3d1")
        self.access_key, self.secret_key = self.user_add("tester", "*=rw")

    def cli(self, *args, **kw):
        return self.daemon.cli(*args, **kw)

    def user_add(self, name: str, *grants: str) -> tuple[str, str]:
        """`cistern user add -H NAME --grant BUCKET=rw ...` -> (access key, secret key)."""
        args = ["user", "add", "-H", name]
        for g in grants:
            args += ["--grant", g]
        out = self.cli(*args).stdout
        f = out.strip().split("\t")
        assert len(f) == 3 and f[0] == name, f"`cistern user add -H` printed {out!r}, not NAME<TAB>KEY<TAB>SECRET"
        return f[1], f[2]

    def dataset(self, bucket: str) -> str:
        return f"{PARENT}/{bucket}"

    def snapshot_bucket(self, bucket: str, snap: str) -> str:
        """The read-only bucket name S3 clients use for BUCKET@SNAP."""
        return f"{bucket}--snap--{snap}"  # crates/s3 store.rs SNAP_SEP

    def wait_ready(self, timeout: float = 60):
        from conftest import port_open

        helpers.wait_until(lambda: port_open(self.s3_port), timeout, what="the S3 listener")

    def kill9(self):
        self.daemon.kill9()

    def start(self):
        self.daemon.start()
        self.wait_ready()

    def stop(self):
        self.daemon.stop()


class ExternalS3(S3Endpoint):
    """A server someone else runs: CISTERN_S3_EXTERNAL=URL,ACCESS_KEY,SECRET
    (buckets are left behind: point it at a scratch server)."""

    kind = "external"

    def __init__(self, spec: str, tmp_path: Path):
        super().__init__(tmp_path)
        self.endpoint, self.access_key, self.secret_key = spec.split(",", 2)

    def stop(self):
        """Empties and removes every bucket, so the next test starts clean."""
        c = self.client()
        for b in c.list_buckets().get("Buckets", []):
            name = b["Name"]
            for u in c.list_multipart_uploads(Bucket=name).get("Uploads", []):
                c.abort_multipart_upload(Bucket=name, Key=u["Key"], UploadId=u["UploadId"])
            for _ in range(1000):
                r = c.list_object_versions(Bucket=name)
                vs = r.get("Versions", []) + r.get("DeleteMarkers", [])
                if not vs:
                    break
                for v in vs:
                    c.delete_object(Bucket=name, Key=v["Key"], VersionId=v["VersionId"])
            c.delete_bucket(Bucket=name)


class MinioS3(S3Endpoint):
    """A MinIO server on a temp dir (single drive: versioning works)."""

    kind = "minio"

    def __init__(self, binary: str, tmp_path: Path):
        from conftest import free_ports, popen

        super().__init__(tmp_path)
        port, console = free_ports(2)
        self.access_key, self.secret_key = "minioadmin", "minioadmin-secret"
        self.endpoint = f"http://127.0.0.1:{port}"
        data = self.tmp_path / "minio-data"
        data.mkdir(exist_ok=True)
        env = dict(os.environ, MINIO_ROOT_USER=self.access_key, MINIO_ROOT_PASSWORD=self.secret_key,
                   MINIO_BROWSER="off", MINIO_UPDATE="off", MINIO_DOMAIN=DOMAIN)
        self.log_path = self.tmp_path / "minio.log"
        self.log = open(self.log_path, "ab")
        self.proc = popen([binary, "server", data, "--address", f"127.0.0.1:{port}",
                           "--console-address", f"127.0.0.1:{console}"],
                          stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        c = self.client()

        def up():
            try:
                c.list_buckets()
                return True
            except Exception:  # noqa: BLE001 (starting up)
                assert self.proc.poll() is None, self.log_path.read_text()
                return False

        helpers.wait_until(up, 60, what="minio to answer")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _env_without_ca_bundle() -> dict:
    # rclone (1.60) fails on any AWS_CA_BUNDLE with a plain-http transport, and
    # the endpoint is plain http on loopback anyway.
    e = dict(os.environ)
    e.pop("AWS_CA_BUNDLE", None)
    return e


def error_code(exc) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a botocore ClientError."""
    r = exc.response
    return r.get("Error", {}).get("Code", ""), r.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


def expect_error(code: str, status: int | None, fn, *args, **kw):
    """Calls fn, which must fail with S3 error `code` (and HTTP `status`)."""
    from botocore.exceptions import ClientError

    try:
        fn(*args, **kw)
    except ClientError as e:
        got, st = error_code(e)
        assert got == code, f"expected {code}, got {got} (HTTP {st}): {e.response.get('Error')}"
        if status is not None:
            assert st == status, f"{code}: expected HTTP {status}, got {st}"
        return e
    raise AssertionError(f"expected S3 error {code}, the call succeeded")


def http(method: str, url: str, body: bytes | None = None, headers: dict | None = None, timeout=30):
    """A raw request (no signature): (status, headers, body)."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def signed_request(ep: S3Endpoint, method: str, host: str, path: str, body: bytes = b""):
    """A SigV4-signed request for Host `host`, sent to the endpoint's address
    (virtual-host style without DNS): (status, headers, body)."""
    import http.client
    import urllib.parse

    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    port = urllib.parse.urlsplit(ep.endpoint).port
    req = AWSRequest(method=method, url=f"http://{host}:{port}{path}", data=body)
    S3SigV4Auth(Credentials(ep.access_key, ep.secret_key), "s3", REGION).add_auth(req)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = dict(req.headers.items())
        headers["Host"] = f"{host}:{port}"
        conn.request(method, path, body=body or None, headers=headers)
        r = conn.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        conn.close()


def xml_code(body: bytes) -> str:
    m = re.search(rb"<Code>([^<]+)</Code>", body)
    return m.group(1).decode() if m else ""


def unique_bucket(prefix: str = "b") -> str:
    return f"{prefix}-{os.getpid()}-{time.monotonic_ns() % 10**9}"
