#!/usr/bin/env bash
# Runs the frame_decoder fuzz target for N seconds (default 30), seeded with
# the frames in spec/vectors. Exits non-zero if the target crashes.
# Skips (exit 0, with a message) when no nightly toolchain can be had.
#
#   scripts/fuzz-smoke.sh [SECONDS]
set -euo pipefail

secs="${1:-30}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

skip() {
    echo "fuzz-smoke: SKIPPED: $*"
    exit 0
}

if ! command -v rustup >/dev/null 2>&1; then
    skip "rustup not found; cargo-fuzz needs a nightly toolchain"
fi
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz-smoke: no nightly toolchain; trying to install it"
    timeout 300 rustup toolchain install nightly --profile minimal >/dev/null 2>&1 ||
        skip "no nightly toolchain and it could not be installed"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: cargo-fuzz missing; installing it"
    timeout 900 cargo install cargo-fuzz --locked >/dev/null 2>&1 ||
        skip "cargo-fuzz is not installed and could not be installed"
fi

cd "$root/fuzz"

# Seed the corpus with every frame of the test vectors.
corpus="corpus/frame_decoder"
mkdir -p "$corpus"
if command -v xxd >/dev/null 2>&1; then
    n=0
    for f in "$root"/spec/vectors/*.json; do
        while read -r hex; do
            n=$((n + 1))
            printf '%s' "$hex" | xxd -r -p >"$corpus/vector-$(basename "$f" .json)-$n"
        done < <(grep -o '"hex": "[0-9a-f]*"' "$f" | sed 's/.*: "\(.*\)"/\1/')
    done
fi

echo "fuzz-smoke: fuzzing frame_decoder for ${secs}s"
cargo +nightly fuzz run frame_decoder "$corpus" -- \
    -max_total_time="$secs" -max_len=131072 -rss_limit_mb=2048 -print_final_stats=1
echo "fuzz-smoke: no crash in ${secs}s"
