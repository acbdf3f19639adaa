"""bench/send.sh's body (see there)."""

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = os.environ["CISTERN_BIN"]
OUT = Path(os.environ["BENCH_DIR"])
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
s = os.environ.get("SIZE", "4G")
SIZE = int(s[:-1]) * UNITS[s[-1]] if s[-1] in UNITS else int(s)
MiB = 1 << 20
REPEAT = max(1, int(os.environ.get("REPEAT", "3")))
# Raw streams (`send -w`) by default: blocks cross as stored, as nbdcopy's
# bytes land as written (RAW=0 measures the logical stream instead).
RAW = ["-w"] if os.environ.get("RAW", "1") != "0" else []
procs = []


def free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


class Daemon:
    def __init__(self, name):
        self.state = OUT / f"{name}-state"
        self.state.mkdir(parents=True, exist_ok=True)
        self.nbd, self.apiport = free_port(), free_port()
        self.env = dict(os.environ, CISTERN_API=f"http://127.0.0.1:{self.apiport}", NO_COLOR="1")
        log = open(OUT / f"{name}.log", "ab")
        self.proc = subprocess.Popen([BIN, "serve", "--state-dir", self.state, "--nbd", f"127.0.0.1:{self.nbd}",
                                      "--api", f"127.0.0.1:{self.apiport}"], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=self.env)
        procs.append(self.proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.cli("pool", "list", check=False).returncode == 0:
                return
            time.sleep(0.2)
        sys.exit(f"daemon {name} did not start; see {OUT}/{name}.log")

    def cli(self, *args, check=True, **kw):
        p = subprocess.run([BIN, *map(str, args)], env=self.env, capture_output=True, **kw)
        if check and p.returncode != 0:
            sys.exit(f"cistern {' '.join(map(str, args))}: {p.stderr.decode()}")
        return p

    def uri(self, name):
        return f"nbd://127.0.0.1:{self.nbd}/{name}"

    def metric(self, name) -> float:
        """A metric from /metrics, summed over its labels (0 if absent)."""
        import urllib.request
        token = (self.state / "api.token").read_text().strip()
        req = urllib.request.Request(f"http://127.0.0.1:{self.apiport}/metrics",
                                     headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return sum(float(line.rsplit(None, 1)[1]) for line in r.read().decode().splitlines()
                       if line.startswith((name + " ", name + "{")))

    def rss(self) -> str:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(("VmHWM", "VmRSS")):
                yield line.split(":")[0] + " " + " ".join(line.split()[1:])


def cpu(pid) -> float:
    """utime + stime of a process, in seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


# CPU seconds of the full sends: sender daemon, receiver daemon, the two CLIs
# (load-independent, unlike the wall-clock ratio).
send_cpu = {"sender": 0.0, "receiver": 0.0, "cli": 0.0}


def transfer(src, dst, args, target, account=False):
    c0 = (cpu(src.proc.pid), cpu(dst.proc.pid), children_cpu())
    t = time.monotonic()
    send = subprocess.Popen([BIN, "send", *args], stdout=subprocess.PIPE, env=src.env)
    recv = subprocess.run([BIN, "receive", target], stdin=send.stdout, capture_output=True, env=dst.env)
    send.stdout.close()
    send.wait()
    if send.returncode != 0 or recv.returncode != 0:
        sys.exit(f"send {args} | receive {target} failed: {recv.stderr.decode()}")
    took = time.monotonic() - t
    if account:
        c1 = (cpu(src.proc.pid), cpu(dst.proc.pid), children_cpu())
        for k, a, b in zip(("sender", "receiver", "cli"), c0, c1):
            send_cpu[k] += b - a
    return took


def change(d, vol, fraction, rng):
    """Rewrites `fraction` of the volume in random 1 MiB pieces."""
    import nbd
    h = nbd.NBD()
    h.connect_uri(d.uri(vol))
    pieces = SIZE // MiB
    for p in rng.sample(range(pieces), max(1, int(pieces * fraction))):
        h.pwrite(os.urandom(MiB), p * MiB)
    h.flush()
    h.shutdown()


def main():
    print(f"bench/send: {SIZE >> 20} MiB volume, random data; output in {OUT}")
    src, dst = Daemon("src"), Daemon("dst")
    # The reference, the received volume and its snapshot each reserve SIZE.
    pool_size = f"{(SIZE * 4 + (1 << 30)) >> 20}M"
    src.cli("pool", "create", "-s", pool_size, "tank", OUT / "src-d0")
    dst.cli("pool", "create", "-s", pool_size, "backup", OUT / "dst-d0")
    # Fair: both sides store what they get without compressing it. The
    # reference volume and the source have compression off; a raw stream
    # keeps the source's blocks as stored (here uncompressed), so the
    # receiver never runs a compressor either (a logical stream, RAW=0,
    # lands with the target pool's default compression).
    src.cli("create", "-V", SIZE, "-o", "compression=off", "tank/vm")
    dst.cli("create", "-V", SIZE, "-o", "compression=off", "backup/ref")
    # Fill with random data through NBD (1 MiB writes).
    change(src, "tank/vm", 1.0, random.Random(1))
    src.cli("snapshot", "tank/vm@s0")
    print("source after the fill: " + ", ".join(src.rss())
          + f"; ARC {src.metric('cistern_arc_size_bytes') / MiB:.0f} MiB")

    print("target before the sends: " + ", ".join(dst.rss()))
    print(f"load average before: {os.getloadavg()[0]:.2f}; REPEAT={REPEAT}; send {' '.join(RAW) or '(logical)'}")
    copies, fulls = [], []
    for r in range(REPEAT):
        if r > 0:
            dst.cli("destroy", "-r", "backup/vm")
        # Alternated so neither side always runs first on a busy machine.
        order = ("copy", "send") if r % 2 == 0 else ("send", "copy")
        for what in order:
            if what == "copy":
                t = time.monotonic()
                subprocess.run(["nbdcopy", "--flush", src.uri("tank/vm@s0"), dst.uri("backup/ref")], check=True)
                copies.append(time.monotonic() - t)
            else:
                fulls.append(transfer(src, dst, [*RAW, "tank/vm@s0"], "backup/vm", account=True))
        print(f"run {r + 1}: nbdcopy {copies[-1]:.2f} s, send|receive {fulls[-1]:.2f} s, ratio {copies[-1] / fulls[-1]:.2f}x")
    t_copy, t_full = sorted(copies)[len(copies) // 2], sorted(fulls)[len(fulls) // 2]
    print(f"nbdcopy {SIZE >> 20} MiB (median of {REPEAT}): {t_copy:.2f} s ({SIZE / MiB / t_copy:.0f} MiB/s)")
    print(f"full send | receive (median of {REPEAT}): {t_full:.2f} s ({SIZE / MiB / t_full:.0f} MiB/s)")
    print(f"ratio nbdcopy/send: {t_copy / t_full:.2f}x (target >= 1.0x)")
    gib = SIZE * REPEAT / (1 << 30)
    print("full send CPU s/GiB: " + ", ".join(f"{k} {v / gib:.2f}" for k, v in send_cpu.items())
          + f", total {sum(send_cpu.values()) / gib:.2f}")
    for name, d in (("source", src), ("target", dst)):
        print(f"{name} daemon after the full sends: " + ", ".join(d.rss()))
    rng = random.Random(2)
    prev = "s0"
    # INCR=0: the full sends only (quicker, for measuring the full send).
    fracs = [0.01, 0.10, 0.50] if os.environ.get("INCR", "1") != "0" else []
    for i, frac in enumerate(fracs, 1):
        change(src, "tank/vm", frac, rng)
        snap = f"s{i}"
        src.cli("snapshot", f"tank/vm@{snap}")
        t_i = transfer(src, dst, [*RAW, "-i", f"@{prev}", f"tank/vm@{snap}"], "backup/vm")
        print(f"incremental {frac:.0%}: {t_i:.2f} s = {t_i / t_full:.1%} of the full send's time"
              + (" (target <= 5%)" if frac == 0.01 else ""))
        prev = snap
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    for name, d in (("source", src), ("target", dst)):
        # The ARC (cache_max_bytes) holds what was written and read: the
        # RSS beyond it is the daemon's own.
        print(f"{name} daemon: " + ", ".join(d.rss())
              + f"; ARC {d.metric('cistern_arc_size_bytes') / MiB:.0f} MiB"
              + f" (max {d.metric('cistern_arc_max_bytes') / MiB:.0f} MiB)")


try:
    main()
finally:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
