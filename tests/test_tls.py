"""TLS on every TCP front end and the refusal of unprotected public binds
(issue 16, decision 0025): NBD STARTTLS with x509 client certificates and the
`nbd:clients` allow-list, seen through libnbd (nbdinfo, nbdcopy, the Python
binding) and qemu-img's tls-creds-x509; the API over HTTPS through the CLI
(--ca); S3 over HTTPS through boto3; `serve` refusing 0.0.0.0 without TLS.

Certificates are made here with openssl, in the layout GnuTLS clients read
from a `tls-certificates=DIR` (ca-cert.pem, client-cert.pem, client-key.pem).
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

import helpers
from conftest import Daemon, cistern_bin, free_ports, port_open, run

OPENSSL = "openssl"


def _openssl(*args, cwd: Path):
    run([OPENSSL, *args], cwd=cwd, timeout=60)


def _key_and_csr(d: Path, name: str, cn: str):
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}-key.pem", "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)


def _ca(d: Path, name: str):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}-key.pem", "-out", f"{name}-cert.pem", "-days", "2",
             "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)


def _sign(d: Path, name: str, ca: str, ext: str):
    (d / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}-cert.pem", "-CAkey", f"{ca}-key.pem",
             "-CAcreateserial", "-out", f"{name}-cert.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A CA, a server certificate for 127.0.0.1/localhost, client dirs
    alice/ and bob/ (CN alice, bob), evil/ (CN alice from another CA) and
    nocert/ (the CA only)."""
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "evilca")
    _key_and_csr(d, "server", "localhost")
    _sign(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
          "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    for name, cn, ca in [("alice", "alice", "ca"), ("bob", "bob", "ca"), ("evil", "alice", "evilca")]:
        _key_and_csr(d, name, cn)
        _sign(d, name, ca, "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n")
        c = d / name
        c.mkdir()
        (c / "ca-cert.pem").write_bytes((d / "ca-cert.pem").read_bytes())
        (c / "client-cert.pem").write_bytes((d / f"{name}-cert.pem").read_bytes())
        (c / "client-key.pem").write_bytes((d / f"{name}-key.pem").read_bytes())
    (d / "nocert").mkdir()
    (d / "nocert" / "ca-cert.pem").write_bytes((d / "ca-cert.pem").read_bytes())
    return d


class TlsDaemon(Daemon):
    """A daemon whose API speaks HTTPS: the CLI gets CISTERN_CA."""

    ca: Path

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def env(self) -> dict:
        e = super().env()
        e["CISTERN_CA"] = str(self.ca)
        return e


def tls_config(pki: Path, nbd_tls="require", s3=False) -> str:
    cfg = (
        f'[nbd]\ntls = "{nbd_tls}"\ntls_cert = "{pki}/server-cert.pem"\ntls_key = "{pki}/server-key.pem"\n'
        f'tls_ca = "{pki}/ca-cert.pem"\n'
        f'[api]\ntls_cert = "{pki}/server-cert.pem"\ntls_key = "{pki}/server-key.pem"\n'
    )
    if s3:
        cfg += (f'[s3]\nparent = "tank"\ntls_cert = "{pki}/server-cert.pem"\n'
                f'tls_key = "{pki}/server-key.pem"\n')
    return cfg


def make_tls_daemon(tmp_path: Path, pki: Path, request, **kw) -> TlsDaemon:
    d = TlsDaemon(tmp_path / "d-state", tmp_path / "d.log", config=tls_config(pki, **kw))
    d.ca = pki / "ca-cert.pem"
    request.addfinalizer(lambda: d.stop(timeout=30))
    return d


def nbds(d: Daemon, export: str, who: str, pki: Path) -> str:
    return f"nbds://127.0.0.1:{d.nbd_port}/{export}?tls-certificates={pki / who}"


def libnbd_connect(uri: str):
    """A libnbd handle connected to `uri` (raises nbd.Error)."""
    import nbd

    h = nbd.NBD()
    h.set_uri_allow_local_file(True)
    h.connect_uri(uri)
    return h


def libnbd_error(uri: str) -> str:
    import nbd

    try:
        h = libnbd_connect(uri)
    except nbd.Error as e:
        return e.string
    h.shutdown()
    raise AssertionError(f"{uri} connected")


def test_nbd_over_tls_require_certificates_and_allow_list(tmp_path, pki, request):
    d = make_tls_daemon(tmp_path, pki, request)
    d.start()
    # The API over HTTPS, through the CLI with CISTERN_CA (and --ca).
    d.cli("pool", "create", "-s", "1G", "tank", tmp_path / "disk0")
    d.cli("create", "-V", "64M", "tank/vol0")
    assert "tank/vol0" in d.cli("--ca", pki / "ca-cert.pem", "list", "-H", "-o", "name").stdout
    # Without the CA the daemon's certificate is not trusted.
    e = d.env()
    del e["CISTERN_CA"]
    p = run([cistern_bin(), "list"], check=False, env=e)
    assert p.returncode != 0 and "certificate" in (p.stdout + p.stderr).lower(), p.stdout + p.stderr
    # Plain HTTP to the HTTPS port gets nowhere.
    e["CISTERN_API"] = f"http://127.0.0.1:{d.api_port}"
    assert run([cistern_bin(), "list"], check=False, env=e, timeout=30).returncode != 0

    # nbdcopy over nbds:// round-trips data; nbdinfo says TLS.
    data = os.urandom(8 << 20)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    uri = nbds(d, "tank/vol0", "alice", pki)
    run(["nbdcopy", src, uri])
    out = tmp_path / "out.bin"
    run(["nbdcopy", uri, out])
    assert out.read_bytes()[: len(data)] == data
    info = run(["nbdinfo", uri]).stdout
    assert "with TLS" in info, info
    # qemu-img with tls-creds-x509 reads the volume.
    qout = tmp_path / "q.raw"
    run(["qemu-img", "convert", "--object",
         f"tls-creds-x509,id=tls0,endpoint=client,dir={pki / 'alice'}",
         "--image-opts",
         f"driver=nbd,server.type=inet,server.host=127.0.0.1,server.port={d.nbd_port},"
         "export=tank/vol0,tls-creds=tls0",
         "-O", "raw", qout])
    assert qout.read_bytes()[: len(data)] == data

    # require: a plaintext client is told TLS is required and sees no export.
    err = libnbd_error(d.uri("tank/vol0"))
    assert "requires TLS" in err, err
    p = run(["nbdinfo", "--list", d.uri()], check=False)
    assert p.returncode != 0 and "tank/vol0" not in p.stdout, p.stdout + p.stderr
    # No client certificate, or one from another CA: the TLS handshake fails.
    for who in ["nocert", "evil"]:
        p = run(["nbdinfo", nbds(d, "tank/vol0", who, pki)], check=False)
        assert p.returncode != 0 and "export-size" not in p.stdout, (who, p.stdout, p.stderr)
        assert "tls" in p.stderr.lower(), (who, p.stderr)

    # nbd:clients: only bob, read-only (inherited from the pool's root).
    bad = d.cli("set", "nbd:clients=bob,,alice", "tank", check=False)
    assert bad.returncode != 0 and "nbd:clients" in bad.stderr, bad.stderr
    d.cli("set", "nbd:clients=bob:ro", "tank")
    assert d.prop("tank/vol0", "nbd:clients") == "bob:ro"
    err = libnbd_error(nbds(d, "tank/vol0", "alice", pki))
    assert "server policy prevents NBD_OPT_GO" in err, err  # NBD_REP_ERR_POLICY
    listed = run(["nbdinfo", "--list", nbds(d, "", "alice", pki)], check=False)
    assert "tank/vol0" not in listed.stdout, listed.stdout
    import nbd

    h = libnbd_connect(nbds(d, "tank/vol0", "bob", pki))
    assert h.is_read_only()
    assert h.pread(4096, 0) == data[:4096]
    # libnbd itself refuses writes to a read-only export: let the write
    # reach the server, which must refuse it with EPERM.
    h.set_strict_mode(h.get_strict_mode() & ~nbd.STRICT_COMMANDS)
    with pytest.raises(nbd.Error) as ei:
        h.pwrite(b"x" * 4096, 0)
    assert ei.value.errno == "EPERM" and "server does not support" not in ei.value.string, ei.value
    assert h.pread(4096, 0) == data[:4096]
    h.shutdown()
    # alice back in, read-write.
    d.cli("set", "nbd:clients=bob:ro,alice", "tank/vol0")
    h = libnbd_connect(nbds(d, "tank/vol0", "alice", pki))
    assert not h.is_read_only()
    h.pwrite(b"y" * 4096, 0)
    h.flush()
    h.shutdown()
    # The failed handshakes are counted (metrics over HTTPS, with the token).
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=str(pki / "ca-cert.pem"))
    req = urllib.request.Request(d.api_url + "/metrics", headers={"Authorization": f"Bearer {d.token}"})
    metrics = urllib.request.urlopen(req, context=ctx, timeout=10).read().decode()
    failures = [l for l in metrics.splitlines() if l.startswith("cistern_nbd_tls_failures_total ")]
    assert failures and float(failures[0].split()[1]) >= 2, failures
    assert not d.panics()


def test_selective_tls_and_s3_over_https(tmp_path, pki, request):
    """tls = "on": plaintext clients use exports without nbd:clients; ones
    with it need TLS. S3 over HTTPS with boto3 (verify = the CA)."""
    d = make_tls_daemon(tmp_path, pki, request, nbd_tls="on", s3=True)
    (s3_port,) = free_ports(1)
    d.s3_addr = f"127.0.0.1:{s3_port}"
    d.start()
    d.cli("pool", "create", "-s", "1G", "tank", tmp_path / "disk0")
    d.cli("create", "-V", "16M", "tank/open")
    d.cli("create", "-V", "16M", "-o", "nbd:clients=alice", "tank/guarded")
    h = libnbd_connect(d.uri("tank/open"))
    h.pwrite(b"z" * 512, 0)
    h.shutdown()
    err = libnbd_error(d.uri("tank/guarded"))
    assert "TLS" in err, err
    listed = run(["nbdinfo", "--list", d.uri()]).stdout
    assert "tank/open" in listed and "tank/guarded" not in listed, listed
    h = libnbd_connect(nbds(d, "tank/guarded", "alice", pki))
    h.pwrite(b"g" * 512, 0)
    h.shutdown()

    # S3 over HTTPS.
    import boto3
    from botocore.config import Config

    d.cli("create", "-t", "bucket", "tank/photos")
    out = d.cli("user", "add", "-H", "tester", "--grant", "photos=rw").stdout.strip().split("\t")
    key, secret = out[1], out[2]
    s3 = boto3.session.Session().client(
        "s3", endpoint_url=f"https://127.0.0.1:{s3_port}", region_name="us-east-1",
        aws_access_key_id=key, aws_secret_access_key=secret, verify=str(pki / "ca-cert.pem"),
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                      retries={"max_attempts": 1}, connect_timeout=5, read_timeout=30))
    body = os.urandom(300_000)
    s3.put_object(Bucket="photos", Key="a/b.bin", Body=body)
    assert s3.get_object(Bucket="photos", Key="a/b.bin")["Body"].read() == body
    # Plain HTTP to the HTTPS port fails; so does a client that does not trust the CA.
    plain = boto3.session.Session().client(
        "s3", endpoint_url=f"http://127.0.0.1:{s3_port}", region_name="us-east-1",
        aws_access_key_id=key, aws_secret_access_key=secret,
        config=Config(signature_version="s3v4", retries={"max_attempts": 1}, connect_timeout=3, read_timeout=3))
    with pytest.raises(Exception):
        plain.list_objects_v2(Bucket="photos")
    from botocore.exceptions import SSLError

    untrusting = boto3.session.Session().client(
        "s3", endpoint_url=f"https://127.0.0.1:{s3_port}", region_name="us-east-1",
        aws_access_key_id=key, aws_secret_access_key=secret, verify=str(pki / "evilca-cert.pem"),
        config=Config(signature_version="s3v4", retries={"max_attempts": 1}, connect_timeout=3))
    with pytest.raises(SSLError):
        untrusting.list_objects_v2(Bucket="photos")


def _serve(tmp_path: Path, name: str, *args, config: str | None = None):
    """Starts `cistern serve` with ARGS; returns (process, log path, api port)."""
    nbd_port, api_port = free_ports(2)
    state = tmp_path / f"{name}-state"
    log = tmp_path / f"{name}.log"
    args = [str(a) for a in args]
    cmd = [cistern_bin(), "serve", "--state-dir", state, *args]
    # Loopback on free ports unless ARGS moves a listener elsewhere.
    if "--api" not in args:
        cmd += ["--api", f"127.0.0.1:{api_port}"]
    if "--nbd" not in args:
        cmd += ["--nbd", f"127.0.0.1:{nbd_port}"]
    if config is not None:
        cfgp = tmp_path / f"{name}.toml"
        cfgp.write_text(config)
        cmd += ["--config", cfgp]
    with open(log, "wb") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, "NO_COLOR": "1"})
    return p, log, api_port, nbd_port


@pytest.mark.parametrize("args,setting", [
    (["--nbd", "0.0.0.0:{port}"], '[nbd] tls = "require"'),
    (["--api", "0.0.0.0:{port}"], "[api] tls_cert and tls_key"),
    (["--s3", "0.0.0.0:{port}"], "[s3] tls_cert and tls_key"),
    (["--nfs", "0.0.0.0:{port}"], "--insecure"),
])
def test_public_bind_without_tls_is_refused(tmp_path, args, setting):
    (port,) = free_ports(1)
    p, log, _, _ = _serve(tmp_path, "pub", *[a.format(port=port) for a in args])
    rc = p.wait(timeout=30)
    text = log.read_text()
    assert rc != 0, text
    assert "refusing to start" in text and f"0.0.0.0:{port}" in text and setting in text, text
    assert "--insecure" in text, text
    assert not port_open(port)


def test_insecure_starts_with_one_warning_and_protected_public_bind_starts(tmp_path, pki):
    (port,) = free_ports(1)
    p, log, api_port, _ = _serve(tmp_path, "ins", "--nbd", f"0.0.0.0:{port}", "--insecure")
    try:
        helpers.wait_until(lambda: port_open(api_port) and port_open(port), 30, what="the insecure daemon")
        text = log.read_text()
        assert text.count("INSECURE") == 1, text
        assert f"NBD listens on 0.0.0.0:{port}" in text, text
    finally:
        p.terminate()
        assert p.wait(timeout=60) == 0
    # NBD on 0.0.0.0 with tls = "require" and client certificates needs no --insecure.
    cfg = tls_config(pki)
    p, log, api_port, _ = _serve(tmp_path, "prot", "--nbd", f"0.0.0.0:{port}", config=cfg)
    try:
        helpers.wait_until(lambda: port_open(api_port) and port_open(port), 30, what="the protected daemon")
        assert "INSECURE" not in log.read_text()
    finally:
        p.terminate()
        assert p.wait(timeout=60) == 0
    # tls = "on" is not enough for a public NBD listener.
    p, log, _, _ = _serve(tmp_path, "on", "--nbd", f"0.0.0.0:{port}", config=tls_config(pki, nbd_tls="on"))
    assert p.wait(timeout=30) != 0
    assert 'tls = \\"require\\"' in log.read_text() or 'tls = "require"' in log.read_text()
