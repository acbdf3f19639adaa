#!/usr/bin/env bash
# bench/pjdfstest.sh: the C pjdfstest suite (POSIX semantics of chmod, chown,
# link, mkdir, mkfifo, mknod, open, rename, rmdir, symlink, truncate, unlink,
# utimensat... : 238 files, 8,827 tests on Linux) over ext4 and over Cistern's
# FUSE mount. Opt-in and long (ext4: ~3.5 min; FUSE targets longer); not part of
# scripts/test.sh, which runs fsx and a pjdfstest subset (tests/test_fs_tools.py).
#
#   bash bench/pjdfstest.sh                          # ext4 (validates the build), then Cistern
#   TARGETS=ext4 TESTS="rename chmod/00.t" bash bench/pjdfstest.sh
#
# The suite is third-party and never committed: it is built out of this tree
# from PJDFSTEST_SRC (a git directory such as a mirror of github:pjd/pjdfstest,
# or an unpacked source tree) into PJDFSTEST_BUILD with autoreconf, configure
# and make (needs autoconf, automake, a C compiler; prove/TAP::Harness from perl).
#
# Each test file runs under TAP::Harness (what `prove -r` runs), in a fresh
# directory of the target, as root, each file bounded by TEST_TIMEOUT. Printed:
# planned / passed / failed / skipped per file (every file, "!" marks failures,
# with the failing test numbers), the totals, and the files excluded. Results
# as TSV in BENCH_DIR/<target>.tsv, TAP of failing files in BENCH_DIR/<target>.tap/.
# Exit status: 1 if any test that was run failed.
#
# Targets:
#   ext4      a directory on BENCH_DIR's filesystem (must be ext4: the
#             reference, where every test passes)
#   bindfs    bindfs over such a directory (a FUSE passthrough: what FUSE itself
#             changes, to tell Cistern's failures from the kernel's)
#   cistern   `cistern mount` of bench/fs on a daemon with a file-backed pool;
#             the files listed in EXCLUDE are not run (EXCLUDE_TARGETS)
#
# Environment:
#   TARGETS="ext4 cistern"
#   TESTS=""                test directories or files under tests/ (default: all)
#   EXCLUDE=bench/pjdfstest-exclude.txt   one entry a line: a path under tests/
#                           (a file or a directory/) then the reason; # comments
#   EXCLUDE_TARGETS="cistern"   the targets that skip the excluded files
#   PJDFSTEST_SRC=/work/.mirror/pjd+pjdfstest/repo
#   PJDFSTEST_BUILD=bench/out/pjdfstest-build
#   TEST_TIMEOUT=600        seconds a test file may take
#   BENCH_DIR=bench/out/pjdfstest-<time>
#   CISTERN_BIN=target/release/cistern  POOL_SIZE=8G
#   BINDFS_OPTS="--multithreaded"
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
need_apt autoconf automake gcc make perl

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGETS="${TARGETS:-ext4 cistern}"
TESTS="${TESTS:-}"
EXCLUDE="${EXCLUDE:-$ROOT/bench/pjdfstest-exclude.txt}"
EXCLUDE_TARGETS="${EXCLUDE_TARGETS:-cistern}"
PJDFSTEST_SRC="${PJDFSTEST_SRC:-/work/.mirror/pjd+pjdfstest/repo}"
PJDFSTEST_BUILD="${PJDFSTEST_BUILD:-$ROOT/bench/out/pjdfstest-build}"
TEST_TIMEOUT="${TEST_TIMEOUT:-600}"
BENCH_DIR="${BENCH_DIR:-$ROOT/bench/out/pjdfstest-$(date +%Y%m%d-%H%M%S)}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
POOL_SIZE="${POOL_SIZE:-8G}"
BINDFS_OPTS="${BINDFS_OPTS:---multithreaded}"

[[ "$(id -u)" == 0 ]] || { echo "bench/pjdfstest.sh: pjdfstest must run as root (it switches users)" >&2; exit 1; }
for tool in perl make cc autoreconf timeout; do
    command -v "$tool" >/dev/null || { echo "bench/pjdfstest.sh: $tool is not installed (apt-get install autoconf automake gcc make perl)" >&2; exit 1; }
done
perl -MTAP::Harness -e 1 || { echo "bench/pjdfstest.sh: perl's TAP::Harness is missing" >&2; exit 1; }

# ---------------------------------------------------------------- build
build_suite() {
    local b="$PJDFSTEST_BUILD"
    [[ -x "$b/pjdfstest" && -d "$b/tests" ]] && return 0
    echo "==> building pjdfstest from $PJDFSTEST_SRC into $b" >&2
    rm -rf "$b"
    mkdir -p "$b"
    if git --git-dir="$PJDFSTEST_SRC" rev-parse --verify -q HEAD >/dev/null 2>&1; then
        git --git-dir="$PJDFSTEST_SRC" archive HEAD | tar -x -C "$b"
        git --git-dir="$PJDFSTEST_SRC" log -1 --format='%H %cs %s' >"$b/VERSION"
    elif [[ -f "$PJDFSTEST_SRC/configure.ac" ]]; then
        cp -a "$PJDFSTEST_SRC/." "$b/"
        echo "source tree $PJDFSTEST_SRC" >"$b/VERSION"
    else
        echo "PJDFSTEST_SRC=$PJDFSTEST_SRC is neither a git directory nor a pjdfstest source tree" >&2
        echo "(mirror github:pjd/pjdfstest, e.g. with the search tool's fetch, or unpack a release)" >&2
        exit 1
    fi
    (cd "$b" && autoreconf -ifs && ./configure && make pjdfstest) >"$b/build.log" 2>&1 ||
        { tail -30 "$b/build.log" >&2; exit 1; }
}
build_suite
SUITE="$PJDFSTEST_BUILD/tests"

# ---------------------------------------------------------------- excludes
# Prints the excluded paths (relative to tests/); fails on an entry without a
# reason, and warns about entries that match nothing.
read_excludes() {
    [[ -f "$EXCLUDE" ]] || return 0
    local line path reason n=0
    while IFS= read -r line || [[ -n "$line" ]]; do
        n=$((n + 1))
        line="${line%%#*}"
        [[ -z "${line// /}" ]] && continue
        read -r path reason <<<"$line"
        [[ -n "$reason" ]] || { echo "$EXCLUDE:$n: $path has no reason" >&2; return 1; }
        [[ -e "$SUITE/$path" ]] || echo "warning: $EXCLUDE:$n: no $path in the suite" >&2
        echo "$path"
    done <"$EXCLUDE"
}

# The test files (relative to tests/) a target runs.
list_tests() { # apply-excludes(0|1)
    local sel=() f
    if [[ -n "$TESTS" ]]; then
        for f in $TESTS; do sel+=("$f"); done
    else
        sel=(.)
    fi
    (cd "$SUITE" && find "${sel[@]}" -name '*.t' -type f | sed 's|^\./||' | sort) >"$BENCH_DIR/all.list"
    if [[ "$1" == 1 ]]; then
        local ex
        ex=$(read_excludes) || exit 1
        python3 - "$BENCH_DIR/all.list" <<EOF
import sys
ex = [e.rstrip("/") for e in """$ex""".split() if e]
for t in open(sys.argv[1]).read().split():
    if not any(t == e or t.startswith(e + "/") for e in ex):
        print(t)
EOF
    else
        cat "$BENCH_DIR/all.list"
    fi
}

# ---------------------------------------------------------------- run
# run_suite TARGET DIR: the suite in DIR/pjdfstest, results in BENCH_DIR/TARGET.tsv
run_suite() {
    local target="$1" dir="$2/pjdfstest" list="$BENCH_DIR/$1.list" ex=0
    [[ " $EXCLUDE_TARGETS " == *" $target "* ]] && ex=1
    mkdir -p "$dir" "$BENCH_DIR/$target.tap"
    list_tests "$ex" >"$list"
    echo "==> $target: $(wc -l <"$list") test files in $dir" >&2
    (cd "$dir" && perl - "$SUITE" "$list" "$BENCH_DIR/$target.tsv" "$BENCH_DIR/$target.tap" "$TEST_TIMEOUT" <<'EOF')
use strict;
use warnings;
use TAP::Harness;
my ($suite, $list, $out, $tapdir, $timeout) = @ARGV;
open my $lf, '<', $list or die "$list: $!";
chomp(my @tests = grep { /\S/ } <$lf>);
my %tap;
my $h = TAP::Harness->new({
    verbosity => -3,
    merge     => 1,
    # Each file is a sh script; a hung one is killed after $timeout s.
    exec      => ['timeout', '-k', '10', $timeout, '/bin/sh'],
});
# Keep the TAP of every file, to show what failed.
$h->callback(made_parser => sub {
    my ($p, $test) = @_;
    my $name = $test->[1];
    $p->callback(ALL => sub { push @{ $tap{$name} }, $_[0]->as_string });
});
$| = 1;
my $agg = $h->runtests(map { ["$suite/$_", $_] } @tests);
open my $o, '>', $out or die "$out: $!";
for my $t (@tests) {
    my ($p) = $agg->parsers($t);
    my $planned = $p->tests_planned // 0;
    my $run = $p->tests_run;
    my @failed = $p->failed;
    my $missing = $planned > $run ? $planned - $run : 0;
    my $nfail = @failed + $missing;
    $nfail = 1 if !$nfail && ($p->exit || !$planned);
    my $passed = $run - @failed;
    my $skipped = () = $p->skipped;
    print $o join("\t", $t, $planned, $passed, $nfail, $skipped, $p->exit // 0, join(",", @failed)), "\n";
    if ($nfail) {
        (my $name = $t) =~ s{/}{_}g;
        open my $tf, '>', "$tapdir/$name" or die;
        print $tf "$_\n" for @{ $tap{$t} || [] };
    }
}
EOF
}

report() { # target
    python3 - "$BENCH_DIR/$1.tsv" "$1" <<'EOF'
import sys
path, target = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
tot = [0, 0, 0, 0]
print(f"{target}: per test file (planned / passed / failed / skipped)")
for f, planned, passed, failed, skipped, exit_, which in rows:
    mark = "!" if int(failed) else " "
    extra = f"  failed: {which}" if which else (f"  exit {exit_}" if int(failed) else "")
    print(f" {mark} {f:<26} {planned:>5} {passed:>5} {failed:>4} {skipped:>4}{extra}")
    for i, v in enumerate((planned, passed, failed, skipped)):
        tot[i] += int(v)
bad = sum(1 for r in rows if int(r[3]))
print(f"{target}: {len(rows)} files, {tot[0]} tests planned: {tot[1]} passed, {tot[2]} failed, {tot[3]} skipped; {bad} files with failures")
EOF
}

PIDS=()
MOUNTS=()
cleanup() {
    local m
    for m in "${MOUNTS[@]}"; do
        mountpoint -q "$m" || continue
        fusermount3 -u "$m" 2>/dev/null || "$CISTERN_BIN" unmount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
    done
    MOUNTS=()
    stop_pids
}
trap cleanup EXIT
trap 'exit 130' INT TERM

mkdir -p "$BENCH_DIR"
BENCH_DIR="$(cd "$BENCH_DIR" && pwd)"
echo "==> bench/pjdfstest.sh: TARGETS=\"$TARGETS\" suite $(cat "$PJDFSTEST_BUILD/VERSION" 2>/dev/null)" >&2
rc=0
for t in $TARGETS; do
    case "$t" in
    ext4)
        fstype=$(df --output=fstype "$BENCH_DIR" | tail -1 | tr -d ' ')
        [[ "$fstype" == ext4 ]] || { echo "BENCH_DIR is on $fstype, not ext4" >&2; exit 1; }
        rm -rf "$BENCH_DIR/ext4"
        mkdir -p "$BENCH_DIR/ext4"
        run_suite ext4 "$BENCH_DIR/ext4"
        ;;
    bindfs)
        src="$BENCH_DIR/bindfs/src" mnt="$BENCH_DIR/bindfs/mnt"
        mkdir -p "$src" "$mnt"
        # shellcheck disable=SC2086
        bindfs -f $BINDFS_OPTS "$src" "$mnt" >"$BENCH_DIR/bindfs/bindfs.log" 2>&1 &
        PIDS+=($!)
        MOUNTS+=("$mnt")
        wait_mounted "$mnt" 30 "$!"
        run_suite bindfs "$mnt"
        cleanup
        ;;
    cistern)
        "$CISTERN_BIN" mount --help >/dev/null 2>&1 ||
            { echo "bench/pjdfstest.sh: $CISTERN_BIN has no \`mount\` subcommand yet" >&2; exit 1; }
        dir="$BENCH_DIR/cistern"
        start_cistern "$dir"
        "$CISTERN_BIN" create bench/fs >/dev/null
        mkdir -p "$dir/mnt"
        "$CISTERN_BIN" mount bench/fs "$dir/mnt"
        MOUNTS+=("$dir/mnt")
        wait_mounted "$dir/mnt" 30 "$CISTERN_PID"
        run_suite cistern "$dir/mnt"
        cleanup
        unset CISTERN_API
        grep -q "panicked at" "$dir/daemon.log" && echo "warning: the daemon panicked, see $dir/daemon.log" >&2
        rm -rf "$dir/disks" "$dir/state"
        ;;
    *) echo "unknown target $t" >&2; exit 2 ;;
    esac
    report "$t" | tee "$BENCH_DIR/$t.summary"
    awk -F'\t' '$4 > 0 {bad=1} END {exit bad}' "$BENCH_DIR/$t.tsv" || rc=1
    if [[ " $EXCLUDE_TARGETS " == *" $t "* ]]; then
        echo "$t: excluded (from $EXCLUDE):" | tee -a "$BENCH_DIR/$t.summary"
        grep -v '^\s*\(#\|$\)' "$EXCLUDE" | sed 's/^/   /' | tee -a "$BENCH_DIR/$t.summary" || true
    fi
done
echo "(TSV, TAP of failing files, logs: $BENCH_DIR)" >&2
exit "$rc"
