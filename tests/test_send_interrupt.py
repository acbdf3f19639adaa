"""Interrupted daemon-to-daemon transfers (issue 14, "How it is checked"):
seeded random interruptions of `cistern send | cistern receive -s` — kill -9
of the sending daemon, kill -9 of the receiving daemon, the connection to
either cut (reset) after a random byte count by a TCP proxy the test owns
on 127.0.0.1 — each followed by a resume (`get receive_resume_token`,
`send -t`) that ends in a target equal bit for bit to the source, with no
half-received snapshot ever visible.

The default suite runs a bounded version (5 planned runs, seed 14, 8 MiB).
The long one is opt-in: CISTERN_SEND_INTERRUPT=1 runs RUNS (default 12;
CISTERN_SEND_INTERRUPT_RUNS) seeded runs of a CISTERN_SEND_INTERRUPT_MIB
(default 16) MiB volume, seed CISTERN_SEND_INTERRUPT_SEED (default 14);
decision 0045 records what passed (seeds 14, 1, 2, 3, 4 x 12 runs of
16 MiB; seed 7 x 20 runs of 32 MiB).
Every 5th run is aborted (`receive -A`) instead of resumed; every 3rd
resume first sends its stream with a byte flipped, which is refused."""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading
import time

import pytest

from conftest import cistern_bin
from helpers import MiB, connected, fill_random, two_daemons
from tcp_proxy import TcpProxy
from test_send import get_token, nbd_sha

RUNS = int(os.environ.get("CISTERN_SEND_INTERRUPT_RUNS", "12"))
SEED = int(os.environ.get("CISTERN_SEND_INTERRUPT_SEED", "14"))
SIZE = int(os.environ.get("CISTERN_SEND_INTERRUPT_MIB", "16")) * MiB
FAULTS = ["kill-sender", "kill-receiver", "cut-send", "cut-receive"]


class Transfer:
    """`cistern send ARGS | cistern receive -s TARGET`, the stream relayed
    (and counted) by the test; either CLI may talk to its daemon through a
    proxy (`send_api`, `recv_api`)."""

    def __init__(self, src, dst, send_args, target, send_api=None, recv_api=None):
        def env(d, api):
            e = d.env()
            if api:
                e["CISTERN_API"] = api
                e["CISTERN_TOKEN"] = d.token
                # Through the proxy, not the local socket (which skips it).
                e["CISTERN_SEND_LOCAL"] = "0"
            return e

        self.bytes = 0
        self.send = subprocess.Popen([cistern_bin(), "send", *send_args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(src, send_api))
        self.recv = subprocess.Popen([cistern_bin(), "receive", "-s", target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(dst, recv_api))
        self.relay = threading.Thread(target=self._relay, daemon=True)
        self.relay.start()

    def _relay(self):
        try:
            while chunk := self.send.stdout.read1(1 << 20):
                self.recv.stdin.write(chunk)
                self.bytes += len(chunk)
        except (OSError, ValueError):
            pass
        finally:
            for f in (self.recv.stdin, self.send.stdout):
                # the sender sees EPIPE instead of blocking on a full pipe
                try:
                    f.close()
                except OSError:
                    pass

    def wait(self, timeout=120):
        """(send rc, receive rc, receive stderr)."""
        self.relay.join(timeout)
        assert not self.relay.is_alive(), "transfer still running"
        try:
            # (not communicate(): the relay already closed the receive's stdin)
            self.recv.wait(timeout)
            err = self.recv.stderr.read().decode()
            self.send.wait(timeout)
        except subprocess.TimeoutExpired:
            self.send.kill()
            self.recv.kill()
            raise AssertionError("send | receive did not end after the interruption")
        return self.send.returncode, self.recv.returncode, err


def token_after(token: str) -> str | None:
    """The address a resume token restarts after (None: from the start)."""
    return json.loads(bytes.fromhex(token.removeprefix("1-")))["after"]


def snapshots(d) -> set[str]:
    return set(d.cli("list", "-H", "-o", "name", "-t", "snapshot").stdout.split())


def datasets(d) -> set[str]:
    return set(d.cli("list", "-H", "-o", "name").stdout.split())


def interrupted(src, dst, fault, at, send_args, target):
    """Runs the transfer with `fault` after `at` stream bytes; returns when
    both CLIs ended and both daemons run again."""
    if fault in ("kill-sender", "cut-send"):
        proxy = TcpProxy(src.api_port, at, "hold" if fault == "kill-sender" else "cut", "down")
        t = Transfer(src, dst, send_args, target, send_api=proxy.url)
    else:
        proxy = TcpProxy(dst.api_port, at, "hold" if fault == "kill-receiver" else "cut", "up")
        t = Transfer(src, dst, send_args, target, recv_api=proxy.url)
    try:
        if fault.startswith("kill"):
            assert proxy.tripped.wait(60), f"{fault}: the stream never reached byte {at}"
            victim = src if fault == "kill-sender" else dst
            time.sleep(0.2)  # the receiver applies (and checkpoints) what it got
            victim.kill9()
            proxy.close()
            rcs = t.wait()
            victim.start()
        else:
            rcs = t.wait()
    finally:
        proxy.close()
    assert proxy.passed <= at
    assert rcs[1] != 0, f"{fault} at byte {at}: the receive did not fail ({rcs})"
    return rcs


def retry_running(f, timeout=30):
    """f() again while the daemon still unwinds the interrupted receive."""
    deadline = time.monotonic() + timeout
    while True:
        p = f()
        err = p.stderr if isinstance(p.stderr, str) else p.stderr.decode()
        if p.returncode == 0 or "running" not in err or time.monotonic() > deadline:
            return p
        time.sleep(0.2)


def corrupt_resume_is_refused(src, dst, target, snap, token):
    """A resume stream with one byte flipped is refused: no snapshot, the
    partial state (and a token) kept."""
    rest = bytearray(subprocess.run([cistern_bin(), "send", "-t", token], capture_output=True, check=True, env=src.env(), timeout=120).stdout)
    rest[len(rest) // 2] ^= 0x04
    p = retry_running(lambda: subprocess.run([cistern_bin(), "receive", "-s", target], input=bytes(rest), capture_output=True, env=dst.env(), timeout=120, text=False))
    err = p.stderr.decode()
    assert p.returncode != 0, "a corrupted stream was received"
    assert "checksum" in err or "invalid send stream" in err, err
    assert snap not in snapshots(dst)
    assert get_token(dst, target).startswith("1-")


def resume(src, dst, send_args, target, snap, stream_len):
    """Finishes an interrupted transfer: `send -t` from the target's token,
    or the whole stream again when the receive left no state (it was cut
    before it began). Returns the bytes the resumed stream carried."""
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline, "cannot finish the interrupted transfer"
        if snap in snapshots(dst):
            return 0
        token = get_token(dst, target) if target in datasets(dst) else "-"
        if token.startswith("1-"):
            t = Transfer(src, dst, ["-t", token], target)
        else:
            t = Transfer(src, dst, send_args, target)
        send_rc, recv_rc, err = t.wait()
        if recv_rc == 0:
            assert send_rc == 0
            if token.startswith("1-") and token_after(token) is not None:
                # a resume sends the rest, not everything again
                assert t.bytes < stream_len, (t.bytes, stream_len)
            return t.bytes
        # The interrupted receive may still be unwinding in the daemon (or
        # had just created the target when the token was read): ask again.
        # A token's own stream is never refused for the partial state it
        # resumes (the seed 14 run 9 bug, decision 0045).
        assert "running" in err or (not token.startswith("1-") and "partially-complete" in err), err
        time.sleep(0.2)


def setup(make_daemon, disks, rng, size):
    """Both daemons, tank/vm@a (random) and @b (1/2 of its 64 KiB pieces
    rewritten), the full stream in a file; (src, dst, want, full, sizes)."""
    src, dst = two_daemons(make_daemon, disks, "tank", "backup", size="2G", small_txgs=True)
    src.cli("create", "-V", str(size), "-o", "compression=off", "tank/vm")
    fill_random(src, "tank/vm", size, rng.randbytes)
    src.cli("snapshot", "tank/vm@a")
    with connected(src.uri("tank/vm")) as c:
        for off in rng.sample(range(0, size, 64 * 1024), size // (128 * 1024)):
            c.pwrite(rng.randbytes(64 * 1024), off)
        c.flush()
    src.cli("snapshot", "tank/vm@b")
    want = {s: nbd_sha(src, f"tank/vm@{s}", size) for s in "ab"}
    full = disks / "full"
    with open(full, "wb") as f:
        subprocess.run([cistern_bin(), "send", "tank/vm@a"], stdout=f, check=True, env=src.env(), timeout=120)
    sizes = {"full": full.stat().st_size}
    sizes["incr"] = len(subprocess.run([cistern_bin(), "send", "-i", "@a", "tank/vm@b"], capture_output=True, check=True, env=src.env(), timeout=120).stdout)
    return src, dst, want, full, sizes


def interruptions(make_daemon, disks, seed, runs, size, plan=None):
    """`runs` interrupted transfers, each resumed (every 5th instead
    aborted with `receive -A`, then sent whole) to a target equal to the
    source. `plan`: (fault, incremental) per run, else from the seed.
    Returns how many resumes sent a part of the stream, not all of it."""
    rng = random.Random(seed)
    src, dst, want, full, sizes = setup(make_daemon, disks, rng, size)
    resumed_part = 0
    for run in range(runs):
        if plan:
            fault, incremental = plan[run % len(plan)]
        else:
            fault, incremental = FAULTS[run % len(FAULTS)], rng.random() < 0.5
        target = f"backup/r{run}"
        if incremental:
            with open(full, "rb") as f:
                subprocess.run([cistern_bin(), "receive", target], stdin=f, check=True, env=dst.env(), timeout=120)
            send_args, snap, n = ["-i", "@a", "tank/vm@b"], f"{target}@b", sizes["incr"]
        else:
            send_args, snap, n = ["tank/vm@a"], f"{target}@a", sizes["full"]
        at = rng.randrange(1, n - 64)
        what = f"run {run} (seed {seed}): {fault} after {at} of {n} bytes, {'incremental' if incremental else 'full'}"
        interrupted(src, dst, fault, at, send_args, target)
        # Never a half-received snapshot: the stream's snapshot is absent
        # (its base, for an incremental, intact)...
        have = snapshots(dst)
        assert snap not in have, f"{what}: {snap} appeared from a cut stream"
        if incremental:
            assert f"{target}@a" in have
            assert nbd_sha(dst, f"{target}@a", size) == want["a"], what
        token = get_token(dst, target) if target in datasets(dst) else "-"
        if token.startswith("1-") and run % 5 == 4:
            # receive -A: the target's old self, no token; then sent whole.
            p = retry_running(lambda: dst.cli("receive", "-A", target, check=False))
            assert p.returncode == 0, p.stderr
            if incremental:
                assert get_token(dst, target) == "-", what
                assert snapshots(dst) >= {f"{target}@a"} and snap not in snapshots(dst), what
                assert nbd_sha(dst, target, size) == want["a"], f"{what}: -A left changes"
            else:
                assert target not in datasets(dst), what
            t = Transfer(src, dst, send_args, target)
            assert t.wait()[:2] == (0, 0), what
        else:
            if token.startswith("1-") and run % 3 == 1:
                corrupt_resume_is_refused(src, dst, target, snap, token)
            sent = resume(src, dst, send_args, target, snap, n)
            if 0 < sent < n:
                resumed_part += 1
        assert get_token(dst, target) == "-", what
        assert nbd_sha(dst, snap, size) == want[snap[-1]], f"{what}: target differs from the source"
        dst.cli("destroy", "-r", target)
    assert not src.panics() and not dst.panics()
    return resumed_part


# The default suite's share: each fault once, full and incremental, fixed
# seeds (and the seed 14 run 9 case: receiver killed during an incremental
# before its first checkpoint, decision 0045). ~60 s on 2 busy cores.
BOUNDED = [("kill-receiver", True), ("cut-send", False), ("kill-sender", True), ("cut-receive", True), ("kill-receiver", False)]


def test_interruptions_resume_to_equal_bounded(make_daemon, disks):
    interruptions(make_daemon, disks, 14, len(BOUNDED), 8 * MiB, plan=BOUNDED)


@pytest.mark.skipif(os.environ.get("CISTERN_SEND_INTERRUPT") != "1", reason="opt-in: CISTERN_SEND_INTERRUPT=1 (the long version)")
def test_random_interruptions_resume_to_equal(make_daemon, disks):
    resumed_part = interruptions(make_daemon, disks, SEED, RUNS, SIZE)
    # The seeded runs include real resumes (a part of the stream, not all of it).
    assert resumed_part >= RUNS // 3, resumed_part


def test_kill9_of_the_sender_during_send_R_resumes_to_equal(make_daemon, disks):
    """kill -9 of the SENDING daemon in the middle of a `send -R` of a tree
    (the second of two volumes under tank/top): the receive fails, keeps
    what it had (no half-received snapshot, a token on the interrupted
    child), and after the sender's restart `send -t TOKEN | receive -s TOP`
    finishes the rest of the tree, equal bit for bit to the source."""
    size = 4 * MiB
    rng = random.Random(56)
    src, dst = two_daemons(make_daemon, disks, "tank", "backup", size="1G", small_txgs=True)
    src.cli("create", "tank/top")
    for v in ("v1", "v2"):
        src.cli("create", "-V", str(size), "-o", "compression=off", f"tank/top/{v}")
        fill_random(src, f"tank/top/{v}", size, rng.randbytes)
    src.cli("snapshot", "-r", "tank/top@a")
    send_args = ["-R", "tank/top@a"]
    n = len(subprocess.run([cistern_bin(), "send", *send_args], capture_output=True, check=True, env=src.env(), timeout=60).stdout)
    # 3/4 of the stream: inside v2's blocks (top, then v1, then v2).
    interrupted(src, dst, "kill-sender", n * 3 // 4, send_args, "backup/top")
    assert "backup/top/v2@a" not in snapshots(dst), "a half-received snapshot from a killed sender"
    assert {"backup/top@a", "backup/top/v1@a"} <= snapshots(dst)
    token = get_token(dst, "backup/top/v2")
    assert token.startswith("1-"), token
    # The restarted sender resumes the tree from the token, into the top.
    deadline = time.monotonic() + 30
    while True:
        t = Transfer(src, dst, ["-t", token], "backup/top")
        send_rc, recv_rc, err = t.wait()
        if recv_rc == 0 or "running" not in err or time.monotonic() > deadline:
            break
        time.sleep(0.2)  # the interrupted receive still unwinds
    assert (send_rc, recv_rc) == (0, 0), err
    assert 0 < t.bytes < n, (t.bytes, n)
    assert get_token(dst, "backup/top/v2") == "-"
    for v in ("v1", "v2"):
        assert nbd_sha(dst, f"backup/top/{v}@a", size) == nbd_sha(src, f"tank/top/{v}@a", size), v
    assert not src.panics() and not dst.panics()
