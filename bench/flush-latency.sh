#!/usr/bin/env bash
# bench/flush-latency.sh: where an intent-log write's time goes in the 4 KiB
# random write + FLUSH job (issue 15; decision 0077). A benchmark, not a test.
#
#   bash bench/flush-latency.sh BIN [COMP] [SECONDS]
#
# Runs bench/flush-cost.sh (its two lines are printed too) and, from 4 s in,
# records TRACE (2) seconds of system-wide tracepoints (io_uring submit and
# complete, block insert/issue/complete, sched wakeup/switch). Then, per log
# batch written through io_uring (O_DIRECT + RWF_DSYNC, decision 0068), the
# split of its time from submission to the completion the reaper takes:
#   dev write   submit -> the data request completes (block layer)
#   to flush    -> the cache flush is issued (the dio-completion kworker has
#                  to run; the flush matched is the first one issued after)
#   dev flush   -> that flush completes
#   to cqe      -> the completion is posted (kworker again, then the task
#                  work on the submitting runtime thread)
# With the log writer thread (decision 0079; pwritev2 with RWF_DSYNC by
# the `log-writer` thread), per log write the split
# of the syscall's time: enter -> data issued, dev write, -> cache flush
# issued (in the thread: any ext4 fast commit or journal wait is here),
# dev flush, -> syscall returns; block writes and fast commits per log
# write, the thread's time between log writes and its wake-ups per write.
# Also block writes by issuing thread (jbd2 = full journal commits: ext4
# extents allocated in the sparse pool file).
# plus: batches in the ring at each submission, flushes per batch, how long
# woken kworkers and daemon threads wait for a CPU, which CPU takes the
# disk's completions, and the idle share of each CPU.
# Needs perf (tracepoints), fio, python3; root. Only 127.0.0.1.
set -u
BIN="$1"; COMP="${2:-off}"; RT="${3:-10}"; TRACE="${TRACE:-2}"
((RT >= TRACE + 6)) || { echo "flush-latency.sh: SECONDS must be at least TRACE + 6" >&2; exit 2; }
OUT=$(mktemp -d /tmp/ffl.XXXX)
HERE=$(dirname "$0")
bash "$HERE/flush-cost.sh" "$BIN" "$COMP" "$RT" &
COST=$!
sleep 4
perf record -a -q -o "$OUT/trace.data" \
    -e io_uring:io_uring_submit_req -e io_uring:io_uring_complete \
    -e block:block_rq_insert -e block:block_rq_issue -e block:block_rq_complete \
    -e sched:sched_wakeup -e sched:sched_switch \
    -e syscalls:sys_enter_pwritev2 -e syscalls:sys_exit_pwritev2 \
    -e ext4:ext4_fc_commit_start -e jbd2:jbd2_start_commit -- sleep "$TRACE" >/dev/null 2>&1
wait $COST
perf script -i "$OUT/trace.data" -F comm,tid,cpu,time,event,trace 2>/dev/null >"$OUT/trace.txt"
python3 - "$OUT/trace.txt" <<'PY'
import bisect, collections, re, sys
R = re.compile(r'\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+([\d.]+):\s+(\S+):\s+(.*)')
ev = []
for line in open(sys.argv[1]):
    m = R.match(line)
    if m:
        comm, tid, cpu, t, e, rest = m.groups()
        ev.append((float(t), comm, int(tid), int(cpu), e, rest))
if not ev:
    sys.exit("no trace events (perf missing or not root?)")
# Each CPU's buffer starts at its own time: use the window all of them cover.
first = collections.defaultdict(lambda: None)
for t, comm, tid, cpu, e, rest in ev:
    if first[cpu] is None:
        first[cpu] = t
t0 = max(first.values()) + 0.005
t1 = ev[-1][0] - 0.005
sub, cqe, ins = {}, {}, collections.defaultdict(list)
data_done, ff_issue, ff_done = {}, [], []
irq_cpu = collections.Counter()
ff_by = collections.Counter()
woken, wait = {}, collections.defaultdict(list)
# What runs on a CPU when a kworker is woken there, and the wait it causes.
running, blame = {}, collections.Counter()
idle = collections.Counter(); last_switch = {}; cur_idle = {}
for t, comm, tid, cpu, e, rest in ev:
    if e == 'io_uring:io_uring_submit_req' and 'opcode WRITE' in rest:
        ud = re.search(r'user_data (0x[0-9a-f]+)', rest).group(1)
        sub[ud] = (t, tid)
    elif e == 'io_uring:io_uring_complete':
        ud = re.search(r'user_data (0x[0-9a-f]+)', rest).group(1)
        cqe.setdefault(ud, t)
    elif e.startswith('block:'):
        p = rest.split()
        rwbs = p[1]
        if e == 'block:block_rq_insert' and rwbs.startswith('W'):
            ins[tid].append((t, p[4] if p[3] == '()' else p[3]))
        elif e == 'block:block_rq_issue' and rwbs == 'FF':
            ff_issue.append(t)
            if t0 <= t <= t1:
                ff_by[comm.split('/')[0].split('-')[0]] += 1
        elif e == 'block:block_rq_complete':
            irq_cpu[cpu] += 1
            if rwbs == 'FF':
                ff_done.append(t)
            elif p[3] != '0':
                data_done.setdefault(p[3], t)
    elif e == 'sched:sched_wakeup':
        m = re.search(r'comm=(.+?) pid=(\d+) .*target_cpu=(\d+)', rest)
        if not m:
            continue
        woken[int(m.group(2))] = (t, m.group(1), running.get(int(m.group(3)), '?'))
    elif e == 'sched:sched_switch':
        m = re.search(r'next_comm=(.+?) next_pid=(\d+)', rest)
        if not m:
            continue
        nxt = int(m.group(2))
        running[cpu] = m.group(1)
        if nxt in woken:
            tw, name, holder = woken.pop(nxt)
            kind = 'kworker' if name.startswith('kworker') else name.split('-')[0]
            if t0 <= tw <= t1:
                wait[kind].append(t - tw)
                if kind == 'kworker':
                    blame[holder.split('-')[0].split('/')[0]] += t - tw
        if cpu in last_switch and cur_idle.get(cpu) and t0 <= t <= t1:
            idle[cpu] += t - max(last_switch[cpu], t0)
        last_switch[cpu] = t
        cur_idle[cpu] = nxt == 0
rows, inflight = [], []
open_batches = sorted((t, ud) for ud, (t, _) in sub.items())
for ud, (ts, tid) in sub.items():
    if not (t0 <= ts <= t1) or ud not in cqe:
        continue
    tc = cqe[ud]
    L = ins[tid]
    i = bisect.bisect_left(L, (ts, ''))
    if i >= len(L) or L[i][0] - ts > 0.001:
        continue
    td = data_done.get(L[i][1])
    if td is None or not ts <= td <= tc:
        continue
    j = bisect.bisect_left(ff_issue, td)
    fi = ff_issue[j] if j < len(ff_issue) and ff_issue[j] <= tc else None
    k = bisect.bisect_left(ff_done, fi) if fi else None
    fd = ff_done[k] if fi and k < len(ff_done) and ff_done[k] <= tc else None
    n = sum(1 for u, (s, _) in sub.items() if s < ts and cqe.get(u, 1e18) > ts)
    inflight.append(n)
    rows.append((ts, td, fi, fd, tc))
def pr(name, v):
    v = sorted(x * 1e6 for x in v if x is not None)
    n = len(v)
    if n:
        print(f"  {name:12s} n={n:5d} mean={sum(v)/n:6.0f} p50={v[n//2]:5.0f} p90={v[n*9//10]:6.0f} p99={v[n*99//100]:6.0f} us")
span = t1 - t0
n_sub = sum(1 for t, _ in sub.values() if t0 <= t <= t1)
print(f"log writes submitted to the ring: {n_sub} in {span:.2f} s ({len(rows)} traced through the "
      f"block layer); cache flushes per log write {sum(1 for t in ff_issue if t0 <= t <= t1) / max(1, n_sub):.2f}")
full = [r for r in rows if r[2] and r[3]]
pr("dev write", [r[1] - r[0] for r in rows])
pr("to flush", [r[2] - r[1] for r in full])
pr("dev flush", [r[3] - r[2] for r in full])
pr("to cqe", [r[4] - r[3] for r in full])
pr("total", [r[4] - r[0] for r in rows])
c = collections.Counter(inflight)
print("  batches already in the ring at submission: " + " ".join(f"{k}:{c[k]}" for k in sorted(c)))
print("wait for a CPU after a wake-up:")
for kind in sorted(wait, key=lambda k: -len(wait[k]))[:6]:
    pr(kind[:12], wait[kind])
print("a woken kworker's wait for a CPU (ms in the window), by what ran there: "
      + " ".join(f"{k}:{v*1e3:.0f}" for k, v in blame.most_common(6)))
print("cache flushes issued by: " + " ".join(f"{k}:{v}" for k, v in ff_by.most_common(4)))
print("disk completions by CPU: " + " ".join(f"cpu{k}:{v}" for k, v in sorted(irq_cpu.items())))
# The log writer thread (decision 0079).
W = re.compile(r'log-writer')
wr_sys = collections.defaultdict(list)   # tid -> [(enter, exit)]: one log write each
open_sys = {}
issues = collections.defaultdict(list)   # tid -> [(t, rwbs, sector)]
done_at = {}
wr_by = collections.Counter(); meta_by = collections.Counter(); fc_by = collections.Counter(); jbd2 = 0
wakes = 0
for t, comm, tid, cpu, e, rest in ev:
    if e == 'syscalls:sys_enter_pwritev2' and W.search(comm):
        open_sys.setdefault(tid, t)
    elif e == 'syscalls:sys_exit_pwritev2' and W.search(comm):
        if tid in open_sys:
            wr_sys[tid].append((open_sys.pop(tid), t))
    elif e == 'block:block_rq_issue':
        p = rest.split()
        if t0 <= t <= t1 and p[1].startswith('W'):
            wr_by[comm.split('/')[0].split('-')[0]] += 1
            if 'M' in p[1]:
                meta_by[comm.split('/')[0].split('-')[0]] += 1
        issues[tid].append((t, p[1], p[4] if p[3] == '()' else p[3]))
    elif e == 'block:block_rq_complete':
        p = rest.split()
        done_at.setdefault((p[1], p[3]), []).append(t)
    elif e == 'ext4:ext4_fc_commit_start' and t0 <= t <= t1:
        fc_by[comm.split('/')[0].split('-')[0]] += 1
    elif e == 'jbd2:jbd2_start_commit' and t0 <= t <= t1:
        jbd2 += 1
    elif e == 'sched:sched_wakeup' and 'comm=log-writer' in rest and t0 <= t <= t1:
        wakes += 1
def first_done(key, after):
    L = done_at.get(key, [])
    i = bisect.bisect_left(L, after)
    return L[i] if i < len(L) else None
lw = []
for tid, calls in wr_sys.items():
    for start, tx in calls:
        if t0 <= start <= t1:
            L = issues[tid]
            iss = L[bisect.bisect_left(L, (start,)):bisect.bisect_right(L, (tx, '~'))]
            dw = [x for x in iss if x[1].startswith('W') and 'M' not in x[1]]
            ff = [x for x in iss if x[1] == 'FF']
            d0 = dw[0] if dw else None
            dd = first_done((d0[1], d0[2]), d0[0]) if d0 else None
            # The cache flush is issued by kblockd's flush machinery, not
            # this thread: the first one issued after the data completes.
            j = bisect.bisect_left(ff_issue, dd) if dd else None
            f0 = (ff_issue[j], 'FF', '0') if dd and j < len(ff_issue) and ff_issue[j] <= tx else None
            k = bisect.bisect_left(ff_done, f0[0]) if f0 else None
            fd = ff_done[k] if f0 and k < len(ff_done) and ff_done[k] <= tx else None
            lw.append((start, d0[0] if d0 else None, dd, f0[0] if f0 else None, fd, tx, len(dw), len(ff), tid))
if lw:
    n_ff = sum(1 for t in ff_issue if t0 <= t <= t1)
    print(f"log writes by the log-writer thread: {len(lw)} in {span:.2f} s; block writes it issued per log write "
          f"{sum(r[6] for r in lw)/len(lw):.2f}, cache flushes (any) per log write {n_ff/len(lw):.2f}; "
          f"wake-ups of the thread per log write {wakes/len(lw):.2f}")
    ok = [r for r in lw if r[1] and r[2] and r[3] and r[4]]
    pr("to issue", [r[1] - r[0] for r in ok])
    pr("dev write", [r[2] - r[1] for r in ok])
    pr("to flush", [r[3] - r[2] for r in ok])
    pr("dev flush", [r[4] - r[3] for r in ok])
    pr("to return", [r[5] - r[4] for r in ok])
    pr("total", [r[5] - r[0] for r in lw])
    gaps = []
    bytid = collections.defaultdict(list)
    for r in lw:
        bytid[r[8]].append(r)
    for L in bytid.values():
        L.sort()
        gaps += [b[0] - a[5] for a, b in zip(L, L[1:])]
    pr("between", gaps)
print("block writes issued by: " + " ".join(f"{k}:{v}" for k, v in wr_by.most_common(6))
      + f"; fast commits by: " + " ".join(f"{k}:{v}" for k, v in fc_by.most_common(4))
      + f"; jbd2 commits started: {jbd2}")
n_lw = max(1, len(lw) + n_sub)
print("ext4 metadata writes (rwbs M: journal / fast commit) by: " + " ".join(f"{k}:{v}" for k, v in meta_by.most_common(6))
      + f"; per log write {sum(meta_by.values()) / n_lw:.2f}")
print("idle share by CPU: " + " ".join(f"cpu{k}:{idle[k]/span:.2f}" for k in sorted(last_switch)))
PY
rm -rf "$OUT"
