#!/usr/bin/env bash
# Runs every check and test of the project. Installs what it needs itself.
#
#   scripts/test.sh            everything (format, lints, docs, all tests, fuzz smoke)
#   FUZZ_SECONDS=0 scripts/test.sh   skip the fuzz smoke run
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    step "installing Rust (rustup, stable)"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal
    # shellcheck disable=SC1091
    . "$HOME/.cargo/env"
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true

step "format"
cargo fmt --all -- --check

step "lints"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "docs (broken links in the API docs, private items included)"
# The `tubeway` binary's docs go where the `tubeway` library's do
# (rust-lang/cargo#6313): documented at the same time, one can remove files
# the other is writing. So the binary goes second.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --exclude tubeway-cli --no-deps --document-private-items --locked
RUSTDOCFLAGS="-D warnings" cargo doc -p tubeway-cli --no-deps --document-private-items --locked

step "build (the CLI tests run the real binary)"
cargo build --workspace --all-targets --locked

step "tests"
cargo test --workspace --locked 2>&1 | tee target/test-output.txt

step "loom model of the shared-memory ring protocol"
# --cfg loom swaps the ring's atomics and futex for loom's models; its own
# target directory keeps those flags from invalidating the build above.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p tubeway-ring --test ring_loom --locked 2>&1 | tee -a target/test-output.txt

passed=$(grep -Eo '^test result: ok\. [0-9]+ passed' target/test-output.txt | awk '{s+=$4} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed' target/test-output.txt | awk '{s+=$1} END {print s+0}')

step "python package (bindings/python: release build, virtual environment, pytest)"
bash scripts/python-test.sh 2>&1 | tee target/python-test-output.txt
# pytest's summary, e.g. "140 passed, 60 skipped in 20.1s"; a count it
# leaves out is 0 (grep finding nothing must not end the script).
py_summary=$(grep -E '^=* ?[0-9]+ (passed|failed)' target/python-test-output.txt | tail -1 || true)
py_passed=$(echo "$py_summary" | grep -Eo '[0-9]+ passed' | awk '{print $1+0}' || true)
py_failed=$(echo "$py_summary" | grep -Eo '[0-9]+ failed' | awk '{print $1+0}' || true)
passed=$((passed + ${py_passed:-0}))
failed=$((failed + ${py_failed:-0}))

fuzz_seconds="${FUZZ_SECONDS:-20}"
if [ "$fuzz_seconds" != "0" ]; then
    step "fuzz smoke run (${fuzz_seconds}s)"
    bash scripts/fuzz-smoke.sh "$fuzz_seconds"
fi

printf '\n%s passed, %s failed\n' "$passed" "$failed"
