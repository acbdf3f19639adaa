"""Crash consistency: kill -9 under a FLUSH/FUA write load, and interrupted
txg commits. After every restart each 4 KiB block must hold either zeros or
exactly one of the versions issued for it, never older than the newest version
acknowledged as durable, and never different from what the previous recovery
showed unless it was written since."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import nbd
import pytest

from conftest import cistern_bin, popen
from crash_workload import BS, block_data, parse_header
from helpers import MiB, connected, wait_until

WORKLOAD = Path(__file__).resolve().parent / "crash_workload.py"
ZERO_BLOCK = bytes(BS)

VOL_BYTES = 64 * MiB
TOTAL_BLOCKS = VOL_BYTES // BS
STRIPED_BLOCKS = TOTAL_BLOCKS // 2
WORKERS = 4
CYCLES = int(os.environ.get("CISTERN_CRASH_CYCLES", "24"))
# Diagnosis knob: CISTERN_CRASH_NO_ZERO=1 leaves WRITE_ZEROES/TRIM out of the load.
NO_ZERO = os.environ.get("CISTERN_CRASH_NO_ZERO") == "1"

# Alternating engine configs: default txg timing, and very frequent txg commits
# (so kills land inside commits too), and tiny dirty limits (early commits).
CONFIGS = [
    None,
    "[engine]\ntxg_timeout_secs = 0.2\n",
    "[engine]\ntxg_timeout_secs = 1.0\ndirty_max_bytes = 1048576\n",
]


class Model:
    """What each block may contain."""

    def __init__(self):
        # Verified state per block after the last recovery: (version, is_zero).
        self.state: dict[int, tuple[int, bool]] = {}
        # Since then: versions issued per block, newest durable version per block.
        self.issued: dict[int, list[tuple[int, bool]]] = defaultdict(list)
        self.durable: dict[int, int] = {}
        self.n_issued = 0
        self.n_durable = 0

    def issue(self, ver: int, kind: str, first: int, count: int):
        for b in range(first, first + count):
            self.issued[b].append((ver, kind != "data"))
        self.n_issued += 1

    def make_durable(self, ver: int, first: int, count: int):
        for b in range(first, first + count):
            if ver > self.durable.get(b, 0):
                self.durable[b] = ver
        self.n_durable += 1

    def load_journal(self, jdir: Path):
        for p in sorted(jdir.glob("issued-*.log")):
            for line in p.read_text().splitlines():
                f = line.split()
                if len(f) == 4:  # a torn last line cannot happen (flushed per line) but be safe
                    self.issue(int(f[0]), f[1], int(f[2]), int(f[3]))
        for p in sorted(jdir.glob("durable-*.log")):
            for line in p.read_text().splitlines():
                f = line.split()
                if len(f) == 3:
                    self.make_durable(int(f[0]), int(f[1]), int(f[2]))

    def check_block(self, b: int, data: bytes) -> tuple[str | None, tuple[int, bool]]:
        prev = self.state.get(b, (0, True))
        floor = max(prev[0], self.durable.get(b, 0))
        cands = [prev] + self.issued.get(b, [])
        floor_kind = next(("zeros (WRITE_ZEROES/TRIM)" if z else "data" for v, z in cands if v == floor), "?")
        ok = [c for c in cands if c[0] >= floor]
        if data == ZERO_BLOCK:
            zeros = [c for c in ok if c[1]]
            if zeros:
                return None, zeros[0]
            return (f"block {b}: reads zeros, but version {floor:#x} ({floor_kind}) was acknowledged durable "
                    f"(or seen after the previous recovery)"), prev
        hdr = parse_header(data)
        if hdr is None:
            return f"block {b}: holds data that was never written (no tag; first bytes {data[:16].hex()})", prev
        hb, ver = hdr
        if hb != b:
            return f"block {b}: holds the tag of block {hb} version {ver:#x} (misplaced write)", prev
        if data != block_data(b, ver):
            return f"block {b}: tag version {ver:#x} but corrupted body", prev
        if not any(c[0] == ver and not c[1] for c in cands):
            return f"block {b}: version {ver:#x} was never issued for it since the last recovery (state {prev[0]:#x})", prev
        if ver < floor:
            return (f"block {b}: reads version {ver:#x}, older than version {floor:#x} ({floor_kind}) acknowledged "
                    f"durable (or seen after the previous recovery)"), prev
        return None, (ver, False)

    def verify(self, h: nbd.NBD, size: int) -> list[str]:
        errors = []
        new_state = {}
        chunk = 4 * MiB
        for off in range(0, size, chunk):
            buf = h.pread(chunk, off)
            for i in range(0, chunk, BS):
                b = (off + i) // BS
                data = buf[i:i + BS]
                if data == ZERO_BLOCK and b not in self.state and b not in self.issued:
                    continue
                err, st = self.check_block(b, data)
                if err:
                    errors.append(err)
                new_state[b] = st
        self.state = {b: s for b, s in new_state.items() if s != (0, True)}
        self.issued.clear()
        self.durable.clear()
        return errors


def _verify(d, vol: str, model: Model, what: str):
    with connected(d.uri(vol)) as h:
        errors = model.verify(h, VOL_BYTES)
    assert not errors, f"{what}: {len(errors)} bad blocks:\n" + "\n".join(errors[:20])


def _run_workers(d, vol: str, jdir: Path, epoch: int, rng: random.Random, kill_after: float,
                 workers: int = WORKERS, before_kill=None):
    jdir.mkdir()
    procs = []
    logs = []
    for w in range(workers):
        lf = open(jdir / f"worker-{w}.err", "wb")
        logs.append(lf)
        procs.append(popen([sys.executable, WORKLOAD, "--uri", d.uri(vol), "--worker", w, "--workers", workers,
                            "--striped", STRIPED_BLOCKS, "--total", TOTAL_BLOCKS, "--epoch", epoch,
                            "--seed", rng.randrange(1 << 30), "--journal", jdir, "--max-seconds", 30,
                            *(["--no-zero"] if NO_ZERO else [])],
                           stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
    try:
        wait_until(lambda: all((jdir / f"ready-{w}").exists() for w in range(workers))
                   or any(p.poll() is not None for p in procs), 30, interval=0.02, what="workers connected")
        assert all((jdir / f"ready-{w}").exists() for w in range(workers)), \
            "a worker failed to connect: " + " | ".join((jdir / f"worker-{w}.err").read_text() for w in range(workers))
        time.sleep(kill_after)
        assert d.alive(), f"the daemon died on its own under load (exit {d.proc.returncode})"
        if before_kill:
            before_kill()
        d.kill9()
        for p in procs:
            p.wait(30)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for lf in logs:
            lf.close()
    for w, p in enumerate(procs):
        assert p.returncode == 0, f"worker {w} failed: {(jdir / f'worker-{w}.err').read_text()}"


# The same load with the intent log on a separate log device (SLOG), single
# and mirrored: FLUSH then waits only for the log device (decision 0030).
# Fewer cycles for those (the log's own machinery is the same).
LOG_LAYOUTS = {None: [], "log": ["log", "l0"], "log-mirror": ["log", "mirror", "l0", "l1"]}


# The same load on an encrypted volume (decision 0026): sealed blocks and
# sealed log records; the key is in a file, so each import loads it and the
# log replays. Fewer cycles (the crash machinery is the same).
@pytest.mark.parametrize("log,encrypted", [(k, False) for k in LOG_LAYOUTS] + [(None, True)],
                         ids=lambda v: (v or "no-log") if not isinstance(v, bool) else ("encrypted" if v else "plain"))
def test_kill9_under_flush_fua_load(make_daemon, disks, tmp_path, log, encrypted):
    rng = random.Random(int(os.environ.get("CISTERN_CRASH_SEED", "1234")))
    d = make_daemon(config="")
    logs = [disks / w if w.startswith("l") and w != "log" else w for w in LOG_LAYOUTS[log]]
    d.cli("pool", "create", "-s", "1G", "tank", "mirror", disks / "d0", disks / "d1", *logs)
    if log:
        assert "logs" in d.cli("pool", "status", "tank").stdout
    crypt = []
    if encrypted:
        key = tmp_path / "crash.key"
        key.write_text("c3" * 32)
        crypt = ["-o", "encryption=on", "-o", "keyformat=hex", "-o", f"keylocation=file://{key}"]
    d.cli("create", "-V", str(VOL_BYTES), *crypt, "tank/crash")
    vol = "tank/crash"
    if encrypted:
        assert d.props(vol)["keystatus"] == "available"
    model = Model()
    t0 = time.monotonic()
    total_issued = total_durable = 0
    cycles = CYCLES if log is None and not encrypted else max(3, CYCLES // 3)
    for cycle in range(1, cycles + 1):
        kill_after = rng.uniform(0.2, 2.0)
        _run_workers(d, vol, tmp_path / f"journal-{cycle}", cycle, rng, kill_after)
        model.load_journal(tmp_path / f"journal-{cycle}")
        total_issued += model.n_issued
        total_durable += model.n_durable
        cfg = CONFIGS[cycle % len(CONFIGS)]
        d.config_path.write_text(cfg or "")
        if cycle % 5 == 0:
            # Also kill it while it imports the pool and replays the log.
            d.start(wait=False)
            time.sleep(rng.uniform(0.0, 0.4))
            d.kill9()
        d.start()
        _verify(d, vol, model, f"cycle {cycle} (killed {kill_after:.2f}s into the load)")
        model.n_issued = model.n_durable = 0
    assert total_durable > 100, f"workload too small to mean anything: {total_durable} durable writes"
    # A clean restart changes nothing, and the pool reports no checksum errors.
    d.restart()
    _verify(d, vol, model, "after a final clean restart")
    status = d.cli("pool", "status", "tank").stdout
    assert "ONLINE" in status, status
    if encrypted:
        assert d.props(vol)["keystatus"] == "available"
        assert d.props(vol)["encryption"] == "aes-256-gcm"
    if log:
        # The log device came back with the pool every time.
        st = d.cli_json("pool", "status", "tank")["pools"]["tank"]
        assert st["logs"] and st["logs"][0]["state"] == "ONLINE", st
    print(f"{cycles} cycles, {total_issued} writes issued, {total_durable} acknowledged durable, "
          f"{time.monotonic() - t0:.0f}s")


@pytest.mark.parametrize("path", ["thread", "ring"])
def test_kill9_with_overlapping_log_writes(make_daemon, disks, tmp_path, path):
    """Eight connections flushing at once put several intent-log writes in
    flight (decision 0041), so a kill can land with a later log batch on
    disk and an earlier one not (and, decision 0057, with FLUSHes queued on
    the log, answered by whichever thread's write makes them durable): replay must stop at the hole, and the
    records written after the restart must never bring the stale ones back
    (several kills in a row on the same log). Through the log writer threads
    (decision 0079; two of them, so their batches overlap) and through
    io_uring (decision 0068)."""
    rng = random.Random(int(os.environ.get("CISTERN_CRASH_SEED", "1234")) + 41)
    env = {"CISTERN_LOG_URING": "thread", "CISTERN_LOG_WRITERS": "2"} if path == "thread" else {}
    d = make_daemon(config="", env=env)
    d.cli("pool", "create", "-s", "1G", "tank", disks / "d0")
    d.cli("create", "-V", str(VOL_BYTES), "tank/crash")
    vol = "tank/crash"
    model = Model()
    overlapped = []
    deferred = []
    ring = []
    thread = []

    def before_kill():
        s = d.api("GET", "/v1/pools/tank/iostat")
        overlapped.append(s["log_overlapped"])
        deferred.append(s["log_deferred"])
        ring.append(s.get("log_ring", 0))
        thread.append(s.get("log_thread", 0))

    total_durable = 0
    for cycle in range(1, max(4, CYCLES // 4) + 1):
        _run_workers(d, vol, tmp_path / f"journal-{cycle}", cycle, rng, rng.uniform(0.3, 1.5), workers=8,
                     before_kill=before_kill)
        model.load_journal(tmp_path / f"journal-{cycle}")
        total_durable += model.n_durable
        d.start()
        _verify(d, vol, model, f"cycle {cycle}")
        model.n_issued = model.n_durable = 0
    assert total_durable > 100, f"workload too small to mean anything: {total_durable} durable writes"
    assert sum(overlapped) > 0, f"no log write ever overlapped another: {overlapped}"
    # The FLUSHes were answered by the threads that wrote the log, holding no
    # thread of their own while they waited (decision 0057): that path is
    # what the kills above hit.
    assert sum(deferred) > 0, f"no FLUSH took the deferred path: {deferred}"
    # Their log writes went the way asked for: the kills hit batches the
    # writer threads were writing (decision 0079), or batches in the ring
    # (decision 0068) where the kernel has io_uring.
    if path == "thread":
        assert sum(thread) > 0, f"no log write by the writer thread: {thread}"
        assert sum(ring) == 0, f"log writes through io_uring: {ring}"
    elif _io_uring_enabled():
        assert sum(ring) > 0, f"no log write went through io_uring: {ring}"
    d.restart()
    _verify(d, vol, model, "after a final clean restart")


def _io_uring_enabled() -> bool:
    """Whether this process may make an io_uring (the sysctl and any seccomp
    filter both allow it); the daemon, started from here, may then too."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    fd = libc.syscall(425, 1, params)  # io_uring_setup: 425 on every architecture
    if fd < 0:
        return False
    os.close(fd)
    return True


def _binary() -> bytes:
    try:
        return Path(cistern_bin()).read_bytes()
    except FileNotFoundError:
        return b""


@pytest.mark.parametrize("point", ["after_data", "after_meta_write"])
def test_interrupted_txg_commit(make_daemon, disks, point):
    binary = _binary()
    if b"CISTERN_FAULT_TXG_CRASH" not in binary:
        pytest.xfail("the engine does not implement CISTERN_FAULT_TXG_CRASH yet")
    if point == "after_meta_write" and b"after_meta_write" not in binary and b"after_meta" in binary:
        point = "after_meta"  # the engine's name for the same point (metadata written, not yet final)
    d = make_daemon(config="[engine]\ntxg_timeout_secs = 0.5\n")
    d.ignore_panics = True  # the injected fault may abort via a panic message
    d.cli("pool", "create", "-s", "1G", "tank", disks / "d0", disks / "d1")  # a stripe
    vol = "tank/v"
    d.cli("create", "-V", str(VOL_BYTES), vol)
    model = Model()
    rng = random.Random(7)
    ver = 0

    def write(h, first, count, flags=0):
        nonlocal ver
        ver += 1
        model.issue(ver, "data", first, count)
        h.pwrite(b"".join(block_data(b, ver) for b in range(first, first + count)), first * BS, flags)
        if flags & nbd.CMD_FLAG_FUA:
            model.make_durable(ver, first, count)
        return ver, first, count

    # Baseline, committed by a clean shutdown.
    with connected(d.uri(vol)) as h:
        for first in range(0, 4096, 64):
            write(h, first, 64)
    d.restart()
    _verify(d, vol, model, "baseline")

    # Now with the fault armed: the first txg commit that reaches `point` aborts.
    d.stop()
    d.start(env={"CISTERN_FAULT_TXG_CRASH": point}, wait=False)
    try:
        d.wait_ready(30)
        ready = True
    except AssertionError:
        ready = False  # crashed in a commit during import: fine, recovery is still tested
    if ready:
        try:
            with connected(d.uri(vol)) as h:
                done = []
                for _ in range(200):
                    first = rng.randrange(0, TOTAL_BLOCKS - 32)
                    done.append(write(h, first, rng.randint(1, 32)))
                h.flush()
                for w in done:
                    model.make_durable(*w)
                deadline = time.monotonic() + 30
                while d.alive() and time.monotonic() < deadline:
                    first = rng.randrange(0, TOTAL_BLOCKS - 32)
                    write(h, first, rng.randint(1, 32), nbd.CMD_FLAG_FUA if rng.random() < 0.2 else 0)
        except nbd.Error:
            pass
    wait_until(lambda: not d.alive(), 30, what=f"daemon to abort at {point}")
    rc = d.proc.returncode
    d.exit_codes.append(rc)
    assert rc != 0, f"daemon exited cleanly ({rc}) although the fault {point} was armed"
    d.start()  # recovery, fault not armed
    _verify(d, vol, model, f"after a txg commit interrupted {point}")
    # The pool keeps working: new writes, commit, restart, everything intact.
    with connected(d.uri(vol)) as h:
        done = [write(h, rng.randrange(0, TOTAL_BLOCKS - 32), 32) for _ in range(100)]
        h.flush()
        for w in done:
            model.make_durable(*w)
    d.restart()
    _verify(d, vol, model, f"after recovery from {point}, new writes and a clean restart")


@pytest.mark.parametrize("mib,conns", [(40, 1), (40, 3), (96, 2)])
def test_bulk_writes_then_one_flush_survive_kill9(make_daemon, disks, mib, conns):
    """Bulk writers (mkfs, nbdcopy, fio) write a lot and flush once: tens of
    MiB without a flush (more than the in-memory log buffer), one FLUSH,
    then kill -9. Every byte must be back."""
    from helpers import close, connect, pattern
    d = make_daemon()
    d.cli("pool", "create", "-s", "1G", "tank", disks / "d0")
    d.cli("create", "-V", "128M", "tank/bulk")
    hs = [connect(d.uri("tank/bulk")) for _ in range(conns)]
    try:
        for i in range(mib):
            hs[i % conns].pwrite(pattern(i, MiB), i * MiB)
        hs[-1].flush()
    finally:
        for h in hs:
            close(h)
    d.kill9()
    d.start()
    with connected(d.uri("tank/bulk")) as h:
        lost = [i for i in range(mib) if h.pread(MiB, i * MiB) != pattern(i, MiB)]
    assert not lost, f"{len(lost)} of {mib} MiB acknowledged by FLUSH lost after kill -9 (MiB #{lost[:8]}...)"


class _Nbdkit:
    """nbdkit's file plugin with the Daemon interface _run_workers needs:
    the reference server that the crash checker must find no fault in."""

    def __init__(self, path: Path, log: Path):
        from conftest import free_ports
        self.path, self.log = path, log
        (self.port,) = free_ports(1)
        self.proc = None

    def uri(self, export: str = "") -> str:
        return f"nbd://127.0.0.1:{self.port}/{export}"

    def start(self):
        from conftest import port_open
        with open(self.log, "ab") as lf:
            self.proc = popen(["nbdkit", "-f", "-i", "127.0.0.1", "-p", self.port, "file", self.path],
                              stdout=lf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(lambda: port_open(self.port), 30, what="nbdkit listening")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self):
        if self.alive():
            self.proc.kill()
        self.proc.wait()


def test_crash_checker_is_sound_against_nbdkit(tmp_path):
    """The checker passes a correct server (nbdkit file plugin, whose writes
    survive its own kill -9 in the page cache), and catches a lost durable
    write, a stale version and garbage when they are planted."""
    img = tmp_path / "ref.img"
    with open(img, "wb") as f:
        f.truncate(VOL_BYTES)
    srv = _Nbdkit(img, tmp_path / "nbdkit.log")
    model = Model()
    rng = random.Random(99)
    try:
        srv.start()
        for cycle in range(1, 4):
            _run_workers(srv, "", tmp_path / f"journal-{cycle}", cycle, rng, rng.uniform(0.3, 0.8))
            model.load_journal(tmp_path / f"journal-{cycle}")
            assert model.n_durable > 0
            srv.start()
            _verify(srv, "", model, f"nbdkit cycle {cycle}")
            model.n_issued = model.n_durable = 0
        # Plant faults the checker must see.
        durable_blocks = [b for b, (v, z) in sorted(model.state.items()) if not z]
        assert len(durable_blocks) > 10
        b1, b2, b3 = durable_blocks[0], durable_blocks[1], durable_blocks[2]
        with connected(srv.uri()) as h:
            h.pwrite(block_data(b1, model.state[b1][0] - 1), b1 * BS)  # stale (never issued) version
            h.pwrite(bytes(BS), b2 * BS)  # a durable block lost
            h.pwrite(os.urandom(BS), b3 * BS)  # garbage
            h.flush()
            errors = model.verify(h, VOL_BYTES)
        assert len(errors) == 3, errors
        assert any(f"block {b1}:" in e for e in errors) and any(f"block {b2}:" in e for e in errors)
        assert any(f"block {b3}:" in e and "never written" in e for e in errors)
    finally:
        srv.kill9() if srv.proc else None
