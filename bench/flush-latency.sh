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
    -e sched:sched_wakeup -e sched:sched_switch -- sleep "$TRACE" >/dev/null 2>&1
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
print("idle share by CPU: " + " ".join(f"cpu{k}:{idle[k]/span:.2f}" for k in sorted(last_switch)))
PY
rm -rf "$OUT"
