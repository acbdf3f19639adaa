"""Shared fixtures for the Cistern integration suite.

Every test gets its own daemon (`cistern serve`) on a fresh state directory and
free loopback ports; the daemon is stopped at teardown (SIGTERM, then SIGKILL)
and, if the test failed, the tail of its log is attached to the report.

Every child process is started with PR_SET_PDEATHSIG=SIGKILL, so nothing
outlives the pytest process even if it is killed itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import urllib.request
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import helpers  # noqa: E402  (tests/helpers.py)

MiB = 1 << 20
GiB = 1 << 30


def cistern_bin() -> str:
    b = os.environ.get("CISTERN_BIN") or str(REPO / "target" / "release" / "cistern")
    return b


# ------------------------------------------------------------------ processes

_libc = ctypes.CDLL(None, use_errno=True)
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    # Runs in the child between fork and exec.
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def popen(cmd, **kw):
    """subprocess.Popen whose child is SIGKILLed if this process dies."""
    kw.setdefault("preexec_fn", _die_with_parent)
    return subprocess.Popen([str(c) for c in cmd], **kw)


def run(cmd, *, check=True, timeout=120, input=None, env=None, cwd=None):
    """Runs a command, captures text output; raises with both streams on failure."""
    cmd = [str(c) for c in cmd]
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
        env=env,
        cwd=cwd,
        stdin=None if input is not None else subprocess.DEVNULL,
        preexec_fn=_die_with_parent,
    )
    if check and p.returncode != 0:
        raise AssertionError(
            f"command failed (exit {p.returncode}): {' '.join(cmd)}\n"
            f"--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}"
        )
    return p


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on 127.0.0.1 (all held open while choosing)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def port_open(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ------------------------------------------------------------------ daemon

_ALL_DAEMONS: list["Daemon"] = []


class Daemon:
    """One `cistern serve` process; can be stopped, killed and started again
    on the same state directory and ports."""

    def __init__(self, state_dir: Path, log_path: Path, config: str | None = None, env: dict | None = None):
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = Path(log_path)
        self.nbd_port, self.api_port = free_ports(2)
        self.config_path: Path | None = None
        if config is not None:
            self.config_path = self.state_dir.parent / f"{self.state_dir.name}.toml"
            self.config_path.write_text(config)
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exit_codes: list[int] = []
        self.ignore_panics = False  # set by tests that make the daemon abort on purpose
        self.s3_addr: str | None = None  # `--s3 ADDR` when set (tests/s3_helpers.py)
        self.serve_args: list[str] = []  # more `cistern serve` flags (e.g. --standby POOL LOCATION)
        _ALL_DAEMONS.append(self)

    # -- addresses
    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def token(self) -> str:
        """The API token the daemon created in its state directory."""
        return (self.state_dir / "api.token").read_text().strip()

    def api(self, method: str, path: str, body=None, timeout: float = 30):
        """One authenticated API request; returns the decoded JSON (or None)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.api_url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
        return json.loads(text) if text else None

    def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        req = urllib.request.Request(self.api_url + "/metrics", headers={"Authorization": f"Bearer {self.token}"})
        return urllib.request.urlopen(req, timeout=10).read().decode()

    @property
    def nbd_addr(self) -> str:
        return f"127.0.0.1:{self.nbd_port}"

    def uri(self, export: str = "") -> str:
        return f"nbd://127.0.0.1:{self.nbd_port}/{export}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def env(self) -> dict:
        e = dict(os.environ)
        e["CISTERN_API"] = self.api_url
        # A quicker owner heartbeat (default 1 s): every import waits one
        # interval for its claim, and the suite restarts daemons often.
        e.setdefault("CISTERN_MMP_INTERVAL_MS", "250")
        e.setdefault("RUST_BACKTRACE", "1")
        e.setdefault("NO_COLOR", "1")  # plain daemon logs
        return e

    # -- lifecycle
    def start(self, env: dict | None = None, wait: bool = True, timeout: float = 60):
        assert not self.alive(), "daemon already running"
        cmd = [cistern_bin(), "serve", "--state-dir", self.state_dir, "--nbd", self.nbd_addr, "--api", self.api_url.removeprefix("http://")]
        if self.config_path is not None:
            cmd += ["--config", self.config_path]
        if self.s3_addr is not None:
            cmd += ["--s3", self.s3_addr]
        cmd += self.serve_args
        e = self.env()
        e.update(self.extra_env)
        if env:
            e.update(env)
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(map(str, cmd))}\n".encode())
            log.flush()
            self.proc = popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=e)
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60):
        """Waits until both listeners accept and the API answers `pool list`."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if not self.alive() and self.starts == 1 and "Address already in use" in self.log_tail(5):
                # The suite runs on two workers: the other one can take a port
                # between free_ports() closing it and this daemon binding it.
                # Only a first start moves (later ones keep their addresses).
                self._log_note("a port was taken meanwhile; starting on new ports")
                self.proc = None
                self.starts = 0
                self.nbd_port, self.api_port = free_ports(2)
                self.start(wait=False)
                continue
            if not self.alive():
                raise AssertionError(
                    f"daemon exited during startup with {self.proc.returncode}\n{self.log_tail()}"
                )
            if port_open(self.api_port) and port_open(self.nbd_port):
                p = run([cistern_bin(), "pool", "list"], check=False, env=self.env(), timeout=30)
                if p.returncode == 0:
                    return
                last = p.stdout + p.stderr
            time.sleep(0.1)
        raise AssertionError(f"daemon not ready after {timeout}s (last CLI output: {last!r})\n{self.log_tail()}")

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM, wait, then SIGKILL. Returns the exit code (negative = signal)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._log_note(f"daemon did not exit {timeout}s after SIGTERM; SIGKILL")
                self.proc.kill()
                self.proc.wait()
                self.exit_codes.append(self.proc.returncode)
                raise AssertionError(f"daemon ignored SIGTERM for {timeout}s\n{self.log_tail()}")
        self.exit_codes.append(self.proc.returncode)
        return self.proc.returncode

    def kill9(self) -> None:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.exit_codes.append(self.proc.returncode)
        self._log_note("killed with SIGKILL by the test")

    def restart(self, **kw):
        rc = self.stop()
        assert rc == 0, f"daemon exited with {rc} on SIGTERM\n{self.log_tail()}"
        return self.start(**kw)

    def _log_note(self, msg: str):
        with open(self.log_path, "ab") as log:
            log.write(f"===== {msg}\n".encode())

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 150) -> str:
        t = self.log_text().splitlines()
        return f"--- daemon log {self.log_path} (last {min(lines, len(t))} of {len(t)} lines)\n" + "\n".join(t[-lines:])

    def panics(self) -> list[str]:
        if self.ignore_panics:
            return []
        return [l for l in self.log_text().splitlines() if "panicked at" in l]

    # -- CLI
    def cli(self, *args, check=True, timeout=120, input=None, cwd=None) -> subprocess.CompletedProcess:
        return run([cistern_bin(), *args], check=check, timeout=timeout, input=input, env=self.env(), cwd=cwd)

    def cli_json(self, *args, timeout=120):
        p = self.cli(*args, "--json", timeout=timeout)
        try:
            return json.loads(p.stdout)
        except json.JSONDecodeError as e:
            raise AssertionError(f"cistern {' '.join(args)} --json printed no JSON: {e}\n{p.stdout}") from e

    def props(self, dataset: str) -> dict[str, str]:
        """`cistern get -Hp all DATASET` as {property: parsable value}."""
        return helpers.parse_get(self.cli("get", "-Hp", "all", dataset).stdout)

    def prop(self, dataset: str, name: str) -> str:
        out = self.cli("get", "-Hp", name, dataset).stdout
        d = helpers.parse_get(out)
        assert name in d, f"`cistern get -Hp {name} {dataset}` did not print {name}: {out!r}"
        return d[name]


# ------------------------------------------------------------------ fixtures


@pytest.fixture
def make_daemon(tmp_path, request):
    """Factory: make_daemon(name="d", config=None, start=True, env=None) -> Daemon."""
    made: list[Daemon] = []

    def make(name: str = "d", config: str | None = None, start: bool = True, env: dict | None = None) -> Daemon:
        d = Daemon(tmp_path / f"{name}-state", tmp_path / f"{name}.log", config=config, env=env)
        made.append(d)
        request.node._cistern_daemons = made
        if start:
            d.start()
        return d

    yield make
    errors = []
    for d in made:
        try:
            d.stop(timeout=30)
        except AssertionError as e:  # noqa: PERF203
            errors.append(str(e))
        finally:
            if d in _ALL_DAEMONS:
                _ALL_DAEMONS.remove(d)
    panics = [(d.log_path, d.panics()) for d in made if d.panics()]
    if errors:
        pytest.fail("\n".join(errors))
    if panics:
        pytest.fail(f"daemon panicked: {panics}")


@pytest.fixture
def daemon(make_daemon) -> Daemon:
    return make_daemon()


@pytest.fixture
def cistern(daemon):
    """cistern("pool", "list", check=True) -> CompletedProcess, with CISTERN_API
    pointing at the test's daemon."""
    return daemon.cli


@pytest.fixture
def disks(tmp_path) -> Path:
    d = tmp_path / "disks"
    d.mkdir()
    return d


@pytest.fixture
def pool(daemon, disks) -> str:
    """Pool `tank`: a 2-way mirror of two sparse 2 GiB files."""
    daemon.cli("pool", "create", "-s", "2G", "tank", "mirror", disks / "d0", disks / "d1")
    return "tank"


@pytest.fixture
def make_volume(daemon, pool):
    """Factory: make_volume(name="vol0", size="1G", **props) -> Volume."""

    def make(name: str = "vol0", size: str = "1G", **props) -> helpers.Volume:
        args = ["create", "-V", size]
        for k, v in props.items():
            args += ["-o", f"{k}={v}"]
        full = f"{pool}/{name}"
        daemon.cli(*args, full)
        return helpers.Volume(daemon, full)

    return make


@pytest.fixture
def volume(make_volume) -> helpers.Volume:
    return make_volume()


@pytest.fixture
def make_s3(make_daemon, tmp_path):
    """Factory: make_s3(name="d", env=None) -> an S3 endpoint with a key pair
    (tests/s3_helpers.py): Cistern's `serve --s3`, or MinIO when
    CISTERN_S3_REFERENCE names its binary."""
    import s3_helpers

    made = []

    def make(name: str = "d", env: dict | None = None, pool_size: str = "2G"):
        ref = os.environ.get("CISTERN_S3_REFERENCE")
        if os.environ.get("CISTERN_S3_EXTERNAL"):
            ep = s3_helpers.ExternalS3(os.environ["CISTERN_S3_EXTERNAL"], tmp_path / f"{name}-ext")
        elif ref:
            ep = s3_helpers.MinioS3(ref, tmp_path / f"{name}-minio")
        else:
            disks = tmp_path / f"{name}-disks"
            disks.mkdir(exist_ok=True)
            ep = s3_helpers.CisternS3(make_daemon, disks, tmp_path, name=name, env=env, pool_size=pool_size)
        made.append(ep)
        return ep

    yield make
    for ep in made:
        if ep.kind != "cistern":  # make_daemon stops Cistern's daemons
            ep.stop()


@pytest.fixture
def s3(make_s3):
    return make_s3()


# ------------------------------------------------------------------ reporting


@pytest.fixture(autouse=True)
def _free_disk_space(request, tmp_path):
    """After a passing test, delete its big files (disk images, pool devices,
    copies) at once; a full run would otherwise leave ~20 GB behind."""
    yield
    rep = getattr(request.node, "_rep_call", None)
    if rep is None or not rep.passed:
        return
    for p in sorted(tmp_path.rglob("*"), reverse=True):
        with contextlib.suppress(OSError):
            if p.is_file() and not p.is_symlink() and p.stat().st_size > (1 << 20):
                p.unlink()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item._rep_call = rep
    if rep.failed:
        for d in getattr(item, "_cistern_daemons", []):
            rep.sections.append((f"cistern daemon log {d.log_path.name}", d.log_tail(200)))


def pytest_sessionfinish(session, exitstatus):
    for d in list(_ALL_DAEMONS):  # belt and braces: nothing outlives the suite
        with contextlib.suppress(Exception):
            if d.alive():
                d.proc.kill()
                d.proc.wait()
