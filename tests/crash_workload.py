#!/usr/bin/env python3
"""One writer of the crash test (tests/test_crash.py): run N of these at once.

Each worker owns a disjoint set of 4 KiB blocks of the volume, so that for
every block the order of its versions is the order the worker issued them:
- the "striped" area [0, striped): block b belongs to worker b % N, so
  neighbouring 4K blocks of one volblock are written by different connections;
- the "region" area [striped, total): one contiguous region per worker,
  written in runs of 1..32 blocks.

Every block written carries a header (magic, block number, version) and a
body derived from (block, version), so a read tells exactly which write it
came from. Versions are (epoch << 32 | seq), unique and increasing per worker
and per block across epochs (crash cycles).

Two connections per worker: A for writes, A or B for FLUSH (multi-conn: a
flush on B covers writes completed on A).

Journal (in --journal DIR):
  issued-W.log   "ver kind first count" written (and flushed to the kernel)
                 BEFORE the request is sent; kind = data | zero | trim.
  durable-W.log  "ver first count" appended and fsync'd only AFTER the server
                 acknowledged a FUA write or a FLUSH that covers that write.
On any NBD error (the daemon was killed) the worker exits 0.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import time

import nbd

BS = 4096
MAGIC = b"CSTNCRSH"
HDR = struct.Struct("<8sQQ")  # magic, block, version


def block_data(blk: int, ver: int) -> bytes:
    body = random.Random((blk << 64) | ver).randbytes(BS - HDR.size)
    return HDR.pack(MAGIC, blk, ver) + body


def parse_header(buf: bytes):
    magic, blk, ver = HDR.unpack_from(buf)
    if magic != MAGIC:
        return None
    return blk, ver


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uri", required=True)
    ap.add_argument("--worker", type=int, required=True)
    ap.add_argument("--workers", type=int, required=True)
    ap.add_argument("--striped", type=int, required=True, help="blocks in the striped area")
    ap.add_argument("--total", type=int, required=True, help="blocks in the volume")
    ap.add_argument("--epoch", type=int, required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--journal", required=True)
    ap.add_argument("--max-seconds", type=float, default=30)
    ap.add_argument("--no-zero", action="store_true", help="only writes and flushes (no WRITE_ZEROES/TRIM)")
    a = ap.parse_args()

    w, n = a.worker, a.workers
    rng = random.Random(a.seed)
    region_len = (a.total - a.striped) // n
    region0 = a.striped + w * region_len
    striped = list(range(w, a.striped, n))

    issued = open(os.path.join(a.journal, f"issued-{w}.log"), "a", buffering=1)
    durable_fd = os.open(os.path.join(a.journal, f"durable-{w}.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def mark_durable(writes):
        if not writes:
            return
        os.write(durable_fd, "".join(f"{v} {f} {c}\n" for v, f, c in writes).encode())
        os.fsync(durable_fd)

    try:
        ha, hb = nbd.NBD(), nbd.NBD()
        ha.connect_uri(a.uri)
        hb.connect_uri(a.uri)
    except nbd.Error as e:
        print(f"worker {w}: connect failed: {e}", file=sys.stderr)
        return 0
    open(os.path.join(a.journal, f"ready-{w}"), "w").close()

    seq = 0
    pending = []  # completed, not yet known durable: (ver, first, count)
    deadline = time.monotonic() + a.max_seconds
    stats = {"writes": 0, "fua": 0, "flush": 0, "zero": 0, "trim": 0}
    try:
        while time.monotonic() < deadline:
            seq += 1
            ver = (a.epoch << 32) | seq
            r = rng.random()
            if a.no_zero and r >= 0.94:
                r = rng.uniform(0.10, 0.94)
            if r < 0.10:
                h = ha if rng.random() < 0.5 else hb
                covered = list(pending)
                h.flush()
                stats["flush"] += 1
                pending.clear()
                mark_durable(covered)
                continue
            fua = rng.random() < 0.15
            flags = nbd.CMD_FLAG_FUA if fua else 0
            if r < 0.60:
                first, count, kind = rng.choice(striped), 1, "data"
            elif r < 0.94:
                count = rng.randint(1, 32)
                first, kind = region0 + rng.randrange(region_len - count + 1), "data"
            elif r < 0.97:
                count = rng.randint(1, 16)
                first, kind = region0 + rng.randrange(region_len - count + 1), "zero"
            else:  # trim whole 16K volblocks only
                count = 4 * rng.randint(1, 4)
                start = (region0 + 3) // 4 * 4
                first = start + 4 * rng.randrange((region0 + region_len - start - count) // 4 + 1)
                kind = "trim"
            issued.write(f"{ver} {kind} {first} {count}\n")
            issued.flush()
            off, ln = first * BS, count * BS
            if kind == "data":
                ha.pwrite(b"".join(block_data(b, ver) for b in range(first, first + count)), off, flags)
                stats["writes"] += 1
            elif kind == "zero":
                zf = flags | (nbd.CMD_FLAG_NO_HOLE if rng.random() < 0.5 else 0)
                ha.zero(ln, off, zf)
                stats["zero"] += 1
            else:
                ha.trim(ln, off, flags)
                stats["trim"] += 1
            if fua:
                stats["fua"] += 1
                mark_durable([(ver, first, count)])
            else:
                pending.append((ver, first, count))
    except nbd.Error as e:
        print(f"worker {w}: stopped by {e} after {stats}", file=sys.stderr)
        return 0
    finally:
        issued.close()
        os.close(durable_fd)
    print(f"worker {w}: deadline reached after {stats}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
