#!/usr/bin/env bash
# ceph/s3-tests against Cistern's S3 endpoint, and against MinIO in the same run
# (opt-in, not part of CI: it fetches s3-tests and makes its own venv).
#
#   bash bench/s3-tests.sh                        # Cistern only
#   CISTERN_S3TESTS_MINIO=/path/to/minio bash bench/s3-tests.sh   # and MinIO, same selection
#
# Prints passed/failed/error counts per server and the Cistern/MinIO pass ratio.
# s3-tests' code is fetched into the cache (never into the repo):
#   CISTERN_S3TESTS_CACHE  where its work tree, venv and run logs live
#                          (default ${XDG_CACHE_HOME:-~/.cache}/cistern-s3tests)
#   CISTERN_S3TESTS_GITDIR a git dir of ceph/s3-tests to export from when
#                          github.com cannot be reached (e.g. a local mirror)
#   CISTERN_S3TESTS_K      the -k selection (default: the groups issue 11 names)
#   CISTERN_S3TESTS_PATHS  what pytest runs (default s3tests/functional/test_s3.py)
#   CISTERN_S3TESTS_ONLY   "minio" skips Cistern (to get MinIO's baseline alone)
#   CISTERN_S3TESTS_ENDPOINT=HOST:PORT,KEY,SECRET  test a server already running
#                          instead of starting Cistern (one key: alt is main)
#   CISTERN_BIN            the cistern binary (default target/release/cistern)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

CACHE="${CISTERN_S3TESTS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cistern-s3tests}"
SRC="$CACHE/s3-tests"
VENV="$CACHE/venv"
K="${CISTERN_S3TESTS_K:-bucket_list or object_write or multipart_upload or ranged_request or object_copy or versioning or conditional or checksum or tagging}"
PATHS="${CISTERN_S3TESTS_PATHS:-s3tests/functional/test_s3.py}"
CISTERN_BIN="${CISTERN_BIN:-$ROOT/target/release/cistern}"
MINIO="${CISTERN_S3TESTS_MINIO:-}"
ONLY="${CISTERN_S3TESTS_ONLY:-}"
mkdir -p "$CACHE"

log() { printf '==> %s\n' "$*" >&2; }

# ---------------------------------------------------------------- s3-tests and its venv
if [[ ! -f "$SRC/s3tests.conf.SAMPLE" ]]; then
    rm -rf "$SRC"
    if timeout 120 git clone -q --depth 1 https://github.com/ceph/s3-tests.git "$SRC" 2>/dev/null; then
        log "cloned ceph/s3-tests"
    elif [[ -n "${CISTERN_S3TESTS_GITDIR:-}" ]]; then
        mkdir -p "$SRC"
        git --git-dir="$CISTERN_S3TESTS_GITDIR" archive HEAD | tar -x -C "$SRC"
        log "exported ceph/s3-tests from $CISTERN_S3TESTS_GITDIR"
    else
        echo "error: cannot clone ceph/s3-tests; set CISTERN_S3TESTS_GITDIR to a git dir of it" >&2
        exit 1
    fi
fi
if [[ ! -f "$VENV/.ready" ]]; then
    log "making $VENV (s3-tests' requirements)"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    # tox only wraps pytest; the rest is what the tests import
    grep -v '^tox' "$SRC/requirements.txt" >"$CACHE/requirements.txt"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r "$CACHE/requirements.txt" </dev/null
    touch "$VENV/.ready"
fi

# ---------------------------------------------------------------- servers
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cistern-s3tests.XXXXXX")"
PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

# write_conf FILE PORT MAIN_KEY MAIN_SECRET ALT_KEY ALT_SECRET
write_conf() {
    cat >"$1" <<EOF
[DEFAULT]
host = 127.0.0.1
port = $2
is_secure = False
ssl_verify = False

[fixtures]
bucket prefix = s3t-{random}-
iam name prefix = s3-tests-
iam path prefix = /s3-tests/

[s3 main]
display_name = M. Tester
user_id = testid
email = tester@example.com
api_name = default
access_key = $3
secret_key = $4

[s3 alt]
display_name = john.doe
email = john.doe@example.com
user_id = johndoe
access_key = $5
secret_key = $6

[s3 tenant]
display_name = testx\$tenanteduser
user_id = testx\$9876543210abcdef
access_key = $5
secret_key = $6
email = tenanteduser@example.com
tenant = testx

[iam]
email = s3@example.com
user_id = testid
access_key = $3
secret_key = $4
display_name = youruseridhere

[iam root]
access_key = $3
secret_key = $4
user_id = RGW11111111111111111
email = account1@ceph.com

[iam alt root]
access_key = $5
secret_key = $6
user_id = RGW22222222222222222
email = account2@ceph.com
EOF
}

RESULTS=()
# run_suite NAME CONF: runs the selection, appends "NAME passed failed errors skipped" to RESULTS
run_suite() {
    local name=$1 conf=$2 xml="$CACHE/$1.xml" out="$CACHE/$1.log"
    log "s3-tests against $name (log: $out)"
    (cd "$SRC" && S3TEST_CONF="$conf" timeout -k 30 3600 "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
        --junitxml="$xml" -k "$K" -m "not fails_on_aws" $PATHS \
        >"$out" 2>&1) || true
    tail -n 1 "$out" >&2
    RESULTS+=("$name $(count "$xml" all) $(count "$xml" first5)")
}

# count JUNIT_XML all|first5 -> "passed failed errors": a test whose only error is
# in teardown (s3-tests' bucket cleanup) passed, as pytest's own summary counts it;
# first5: the first five groups of the default selection (issue 11's MinIO baseline).
count() {
    python3 - "$1" "$2" <<'EOF'
import sys, xml.etree.ElementTree as ET
groups = ["bucket_list", "object_write", "multipart_upload", "ranged_request", "object_copy"]
n = {"pass": 0, "fail": 0, "error": 0}
for c in ET.parse(sys.argv[1]).getroot().iter("testcase"):
    if sys.argv[2] == "first5" and not any(g in c.get("name", "") for g in groups):
        continue
    if c.find("skipped") is not None:
        continue
    err = c.find("error")
    if c.find("failure") is not None:
        n["fail"] += 1
    elif err is not None and "failed on teardown" not in (err.get("message") or ""):
        n["error"] += 1
    else:
        n["pass"] += 1
print(n["pass"], n["fail"], n["error"])
EOF
}

start_cistern() {
    local port api nbd state="$WORK/cistern"
    port=$(free_port); api=$(free_port); nbd=$(free_port)
    mkdir -p "$state" "$WORK/disks"
    printf '[s3]\nparent = "tank"\n' >"$WORK/cistern.toml"
    export CISTERN_API="http://127.0.0.1:$api"
    "$CISTERN_BIN" serve --state-dir "$state" --api "127.0.0.1:$api" --nbd "127.0.0.1:$nbd" \
        --s3 "127.0.0.1:$port" --config "$WORK/cistern.toml" >"$CACHE/cistern-daemon.log" 2>&1 &
    PIDS+=($!)
    wait_port "$api" 60
    wait_port "$port" 60
    "$CISTERN_BIN" pool create -s 20G tank mirror "$WORK/disks/d0" "$WORK/disks/d1" >/dev/null
    local main alt
    # -H: NAME<TAB>ACCESS_KEY<TAB>SECRET
    main=$("$CISTERN_BIN" user add -H main --grant '*=rw' 2>/dev/null | cut -f2,3)
    alt=$("$CISTERN_BIN" user add -H alt --grant '*=rw' 2>/dev/null | cut -f2,3)
    # shellcheck disable=SC2086
    write_conf "$WORK/cistern.conf" "$port" $main $alt
}

start_minio() {
    local port console
    port=$(free_port); console=$(free_port)
    mkdir -p "$WORK/minio"
    MINIO_ROOT_USER=s3testsmain MINIO_ROOT_PASSWORD=s3testsmain-secret MINIO_BROWSER=off MINIO_UPDATE=off \
        "$MINIO" server "$WORK/minio" --address "127.0.0.1:$port" --console-address "127.0.0.1:$console" \
        >"$CACHE/minio-daemon.log" 2>&1 &
    PIDS+=($!)
    wait_port "$port" 60
    sleep 1
    # MinIO has one root key here (users need its admin client): alt is the same user
    write_conf "$WORK/minio.conf" "$port" s3testsmain s3testsmain-secret s3testsmain s3testsmain-secret
}

if [[ -n "${CISTERN_S3TESTS_ENDPOINT:-}" ]]; then
    IFS=, read -r ep key secret <<<"$CISTERN_S3TESTS_ENDPOINT"
    write_conf "$WORK/external.conf" "${ep##*:}" "$key" "$secret" "$key" "$secret"
    run_suite cistern "$WORK/external.conf"
elif [[ "$ONLY" != minio ]]; then
    [[ -x "$CISTERN_BIN" ]] || { echo "error: $CISTERN_BIN is not built (cargo build --release)" >&2; exit 1; }
    start_cistern
    run_suite cistern "$WORK/cistern.conf"
fi
if [[ -n "$MINIO" ]]; then
    start_minio
    run_suite minio "$WORK/minio.conf"
fi

printf '\ns3-tests: -k "%s" -m "not fails_on_aws" %s\n' "$K" "$PATHS"
printf '%-8s %7s %7s %7s   | first five groups: %7s %7s %7s\n' server passed failed errors passed failed errors
for r in "${RESULTS[@]}"; do
    # shellcheck disable=SC2086
    printf '%-8s %7s %7s %7s   |                    %7s %7s %7s\n' $r
done
if ((${#RESULTS[@]} == 2)); then
    read -r _ cp _ _ c5 _ <<<"${RESULTS[0]}"
    read -r _ mp _ _ m5 _ <<<"${RESULTS[1]}"
    python3 -c "import sys; c, m, c5, m5 = map(int, sys.argv[1:]); print(f'cistern/minio passes: {c}/{m} = {c / max(m, 1):.2f} (first five groups {c5}/{m5} = {c5 / max(m5, 1):.2f})')" "$cp" "$mp" "$c5" "$m5"
    # what to work on: tests MinIO passes and Cistern does not
    python3 - "$CACHE/cistern.xml" "$CACHE/minio.xml" >"$CACHE/minio-only-passes.txt" <<'EOF'
import sys, xml.etree.ElementTree as ET
def passed(path):
    out = set()
    for c in ET.parse(path).getroot().iter("testcase"):
        err = c.find("error")
        if c.find("failure") is None and c.find("skipped") is None and (
                err is None or "failed on teardown" in (err.get("message") or "")):
            out.add(c.get("name"))
    return out
for n in sorted(passed(sys.argv[2]) - passed(sys.argv[1])):
    print(n)
EOF
    echo "passed by MinIO only: $(wc -l <"$CACHE/minio-only-passes.txt") tests, listed in $CACHE/minio-only-passes.txt"
fi
