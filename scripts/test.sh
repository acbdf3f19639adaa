#!/usr/bin/env bash
# THE test command: `bash scripts/test.sh [PYTEST ARGS...]`.
#
# 1. installs the apt packages the suite needs, only those missing;
# 2. makes .venv (system site packages, so python3-libnbd's `nbd` module is
#    importable) and pip-installs pytest into it, only if missing;
# 3. cargo build --release --workspace --all-targets (and cargo install cargo-deb,
#    fsx, pjdfstest if missing), starts cargo test --release --workspace in the
#    background;
# 4. pytest -q tests/ against target/release/cistern (env CISTERN_BIN), then
#    waits for cargo test and prints its output.
#
# Runs unattended (CI=true, no stdin); exits non-zero on any failure.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k crash -x`).
# CISTERN_SKIP_CARGO_TEST=1 skips step 3's `cargo test` (the build still runs);
# CISTERN_TEST_TIMEOUT=SECONDS bounds the pytest run (default 2400),
# CISTERN_CARGO_TEST_TIMEOUT=SECONDS the cargo test run (default 1200),
# CISTERN_CARGO_TEST_SERIAL=1 runs cargo test alone before pytest,
# CISTERN_TEST_WORKERS=N the pytest workers (default 2; 0 = one process).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { printf '\n==> %s\n' "$*" >&2; }

# ---------------------------------------------------------------- apt packages
APT_PACKAGES=(nbdkit libnbd-bin python3-libnbd nbdfuse fio fuse3 qemu-utils e2fsprogs curl python3-venv lz4 zstd
    rclone restic  # S3 clients (tests/test_s3_clients.py)
    samba samba-vfs-modules smbclient samba-testsuite avahi-utils)  # SMB (tests/test_smb.py, bench/smbtorture.sh)
# Filesystem checkers (tests/test_fs_tools.py, test_fuse.py, test_nfs.py); the benches' own
# references (bonnie++, postmark, bindfs, nfs-ganesha) are installed by bench/fs.sh and bench/nfs.sh.
APT_PACKAGES+=(attr acl rsync libnfs-utils)
# The web dashboard in a real browser (tests/test_ui.py, Selenium): Debian's own
# Chromium and its driver, never a downloaded browser.
APT_PACKAGES+=(chromium chromium-driver)

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed' && return 0
    # On Debian 12 nbdfuse ships inside libnbd-bin (apt resolves the name to it).
    [[ "$1" == nbdfuse ]] && command -v nbdfuse >/dev/null 2>&1
}

missing=()
for p in "${APT_PACKAGES[@]}"; do
    installed "$p" || missing+=("$p")
done
if ((${#missing[@]})); then
    log "installing apt packages: ${missing[*]}"
    SUDO=()
    if [[ "$(id -u)" != 0 ]]; then SUDO=(sudo -n); fi
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -q </dev/null
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" </dev/null
fi

# ---------------------------------------------------------------- python venv
# python3-libnbd installs into /usr/lib/python3/dist-packages for Debian's
# /usr/bin/python3, so the venv must be made from exactly that interpreter.
SYS_PY=/usr/bin/python3
VENV="$ROOT/.venv"
venv_ok() {
    [[ -x "$VENV/bin/python" ]] && grep -qx 'include-system-site-packages = true' "$VENV/pyvenv.cfg" 2>/dev/null &&
        "$VENV/bin/python" -c 'import nbd' 2>/dev/null
}
if ! venv_ok; then
    log "creating $VENV"
    rm -rf "$VENV"
    "$SYS_PY" -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -c 'import nbd' 2>/dev/null; then
    echo "error: 'import nbd' fails inside $VENV (is python3-libnbd installed for $SYS_PY?)" >&2
    "$VENV/bin/python" -c 'import nbd'
    exit 1
fi
# boto3 and awscli drive the S3 tests; awscrt gives botocore CRC32C checksums.
# selenium drives Chromium for tests/test_ui.py.
# pytest-xdist runs the integration tests on two workers (see below).
PY_PACKAGES=(pytest boto3 awscli awscrt selenium xdist=pytest-xdist)
pip_missing=()
for m in "${PY_PACKAGES[@]}"; do
    "$VENV/bin/python" -c "import ${m%%=*}" 2>/dev/null || pip_missing+=("${m#*=}")
done
if ((${#pip_missing[@]})); then
    log "pip installing: ${pip_missing[*]}"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${pip_missing[@]}" </dev/null
fi

# ---------------------------------------------------------------- rust
# versitygw (an S3 server with conditional writes) stands in for S3 in the
# object-store log tests (crates/objstore/tests/versitygw.rs, the bucket-pool
# tests); built once. On a fresh machine its `go install` is mostly module
# downloads, so it runs in the background while cargo builds.
export CISTERN_GO_TOOLS="${CISTERN_GO_TOOLS:-/work/cache/go-bin}"
export VERSITYGW="$CISTERN_GO_TOOLS/versitygw"
go_pid=
if [[ ! -x "$VERSITYGW" ]] && command -v go >/dev/null 2>&1; then
    log "go install versitygw into $CISTERN_GO_TOOLS (in the background)"
    mkdir -p "$CISTERN_GO_TOOLS"
    (GOBIN="$CISTERN_GO_TOOLS" go install github.com/versity/versitygw/cmd/versitygw@v1.8.0 \
        >"$CISTERN_GO_TOOLS/install.log" 2>&1 </dev/null) &
    go_pid=$!
fi
wait_for_versitygw() {
    [[ -n "$go_pid" ]] || return 0
    wait "$go_pid" || { cat "$CISTERN_GO_TOOLS/install.log" >&2
        echo "warning: cannot install versitygw; the objstore S3 and bucket-pool tests will fail" >&2; }
    go_pid=
}

# One build for the daemon and the tests: `cargo build --release` alone
# resolves features without the dev-dependencies, so the `cargo test` after
# it rebuilt tokio and everything above it (the whole workspace) a second
# time with the test features. --all-targets is exactly what cargo test
# builds (tests and examples), and the daemon pytest runs is the same binary.
if [[ "${CISTERN_SKIP_CARGO_TEST:-0}" == 1 ]]; then
    log "cargo build --release"
    cargo build --release 2>&1
else
    log "cargo build --release --workspace --all-targets"
    cargo build --release --workspace --all-targets 2>&1
fi
# cargo-deb builds the Debian package tests/test_packaging.py installs;
# installed once (a few minutes of compiling), then reused.
if ! cargo deb --version >/dev/null 2>&1; then
    log "cargo install cargo-deb"
    cargo install cargo-deb --locked 2>&1 || echo "warning: cannot install cargo-deb; the package test will skip" >&2
fi
# fsx and pjdfstest (crates.io, pinned) check the FUSE mount
# (tests/test_fs_tools.py); installed once into CISTERN_CARGO_TOOLS, then reused.
export CISTERN_CARGO_TOOLS="${CISTERN_CARGO_TOOLS:-/work/cache/cargo-tools}"
for tool in fsx@0.3.2 pjdfstest@0.2.2; do
    if [[ ! -x "$CISTERN_CARGO_TOOLS/bin/${tool%@*}" ]]; then
        log "cargo install $tool into $CISTERN_CARGO_TOOLS"
        cargo install --locked --root "$CISTERN_CARGO_TOOLS" "$tool" 2>&1 ||
            echo "warning: cannot install $tool; tests/test_fs_tools.py will fail" >&2
    fi
done
wait_for_versitygw
# A failing `cargo test` does not hide the integration results: both run,
# and the script fails if either did.
#
# The test binaries were built above (the CPU-bound part); `cargo test`
# runs in the background while pytest runs: both mostly wait on fsync,
# timers and daemons (cargo test used 31% of one core over its 164 s, the
# pytest suite under half a core), so on 2 cores running them side by side
# takes about the pytest time instead of the sum. Its output is printed
# after pytest's. CISTERN_CARGO_TEST_SERIAL=1 runs it first, alone, as before.
cargo_rc=0
cargo_pid=
CARGO_TEST_LOG="${CARGO_TARGET_DIR:-$ROOT/target}/cargo-test.log"
if [[ "${CISTERN_SKIP_CARGO_TEST:-0}" != 1 ]]; then
    # --no-fail-fast: every crate's tests run; bounded so a deadlock cannot stall CI.
    if [[ "${CISTERN_CARGO_TEST_SERIAL:-0}" == 1 ]]; then
        log "cargo test --release --workspace"
        timeout -k 30 "${CISTERN_CARGO_TEST_TIMEOUT:-1200}" \
            cargo test --release --workspace --no-fail-fast 2>&1 || cargo_rc=$?
    else
        log "cargo test --release --workspace (in the background, output in $CARGO_TEST_LOG)"
        timeout -k 30 "${CISTERN_CARGO_TEST_TIMEOUT:-1200}" \
            cargo test --release --workspace --no-fail-fast >"$CARGO_TEST_LOG" 2>&1 </dev/null &
        cargo_pid=$!
        # Nothing outlives the script (an early exit below, a signal).
        trap '[[ -n "$cargo_pid" ]] && kill "$cargo_pid" 2>/dev/null; true' EXIT
    fi
fi

TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export CISTERN_BIN="$TARGET_DIR/release/cistern"
[[ -x "$CISTERN_BIN" ]] || { echo "error: $CISTERN_BIN was not built" >&2; exit 1; }

# ---------------------------------------------------------------- integration
log "pytest tests/ (CISTERN_BIN=$CISTERN_BIN)"
pytest_rc=0
# Bounded as a whole (default 40 min; the suite takes ~10): a hung test kills
# pytest, and every process it started dies with it (PR_SET_PDEATHSIG).
# Two workers (CISTERN_TEST_WORKERS; 0 runs in one process), a test file per
# worker at a time: most tests wait on daemons, fsync and timers rather than
# on the CPU, so two at once took 786 s where one took 1518 s on the same
# loaded machine. Every test makes its own daemons, ports and directories.
workers=(-n "${CISTERN_TEST_WORKERS:-2}" --dist loadfile)
timeout -k 30 "${CISTERN_TEST_TIMEOUT:-2400}" \
    "$VENV/bin/python" -m pytest -q -rfEsxX --durations=30 "${workers[@]}" tests/ "$@" </dev/null || pytest_rc=$?

if [[ -n "$cargo_pid" ]]; then
    log "cargo test --release --workspace (ran beside pytest)"
    wait "$cargo_pid" || cargo_rc=$?
    cargo_pid=
    cat "$CARGO_TEST_LOG"
fi

if ((cargo_rc != 0)); then
    echo "FAILED: cargo test --release --workspace (exit $cargo_rc)" >&2
fi
if ((pytest_rc != 0)); then
    echo "FAILED: pytest tests/ (exit $pytest_rc)" >&2
fi
if ((cargo_rc != 0 || pytest_rc != 0)); then
    exit 1
fi
echo "all tests passed" >&2
