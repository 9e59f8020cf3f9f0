#!/usr/bin/env bash
# Builds the tubeway binary and shows it working: a broker on a free port,
# then functions (and a worker), queues, topics and statistics from the
# command line.
#
#   bash scripts/demo.sh
#
# Every command is printed before it runs. The broker is stopped (SIGTERM)
# at the end, and on any failure.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "building the release binary (cargo build --release -p tubeway-cli)"
cargo build --release -p tubeway-cli
BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/tubeway"
[ -x "$BIN" ] || { echo "demo: $BIN was not built" >&2; exit 1; }

work="$(mktemp -d "${TMPDIR:-/tmp}/tubeway-demo.XXXXXX")"
server_pid=""
subscriber_pid=""
worker_pid=""

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    local pid
    for pid in "$subscriber_pid" "$worker_pid"; do
        if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
    if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
        kill -TERM "$server_pid" 2>/dev/null || true
        # Graceful shutdown takes at most a few seconds; then force it.
        for _ in $(seq 100); do
            kill -0 "$server_pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -KILL "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    if [ "$status" -ne 0 ]; then
        echo "demo: failed (exit status $status); server log:" >&2
        cat "$work/server.log" >&2 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Quotes $1 the way one would type it in a shell.
quote() {
    if [[ $1 =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
        printf '%s' "$1"
    else
        printf "'%s'" "${1//\'/\'\\\'\'}"
    fi
}

# Prints a command as it would be typed, then runs it.
tubeway() {
    printf '\n$ tubeway'
    local arg
    for arg in "$@"; do
        printf ' '
        quote "$arg"
    done
    printf '\n'
    "$BIN" "$@"
}

# Waits up to $1 seconds for the command that follows to succeed.
wait_until() {
    local seconds=$1
    shift
    local deadline=$((SECONDS + seconds))
    until "$@"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "demo: timed out after ${seconds}s waiting for: $*" >&2
            return 1
        fi
        sleep 0.1
    done
}

# Whether process $1 has ended.
exited() { ! kill -0 "$1" 2>/dev/null; }

# Waits for the background $1 (pid $2, output in $work/$1.out and .err)
# to end and shows what it printed; fails if it failed.
finish_background() {
    local name=$1 pid=$2
    wait_until 20 exited "$pid"
    if ! wait "$pid"; then
        echo "demo: the $name failed:" >&2
        cat "$work/$name.err" >&2
        return 1
    fi
    echo "(the $name printed:)"
    cat "$work/$name.out"
}

step "starting the broker on a free port"
SHM_URL="shm://tubeway-demo-$$"
printf '$ tubeway server --listen tcp://127.0.0.1:0 --listen %s &\n' "$SHM_URL"
"$BIN" server --listen tcp://127.0.0.1:0 --listen "$SHM_URL" >"$work/server.out" 2>"$work/server.log" &
server_pid=$!
wait_until 20 grep -q '^listening on ' "$work/server.out"
cat "$work/server.out"
wait_until 20 grep -q "^listening on shm://" "$work/server.out"
TUBEWAY_URL="$(sed -n 's/^listening on //p' "$work/server.out" | head -n 1)"
export TUBEWAY_URL
printf '$ export TUBEWAY_URL=%s\n' "$TUBEWAY_URL"

step "functions: call the built-in echo"
tubeway call echo 'Hello, Tubeway!'
tubeway call echo --data '{"order": 42, "items": ["tea", "cake"]}' --json

step "the same call over shared memory: only the URL changes"
tubeway call echo 'Hello over shared memory!' --url "$SHM_URL"

step "a function served by another process: a worker from the shell"
printf "\n\$ tubeway serve upper --command 'tr a-z A-Z' --count 1 &\n"
"$BIN" serve upper --command 'tr a-z A-Z' --count 1 >"$work/worker.out" 2>"$work/worker.err" &
worker_pid=$!
serving() { "$BIN" function status upper --json 2>/dev/null | grep -q '"workers":1[,}]'; }
wait_until 20 serving
tubeway call upper 'shout, please'
finish_background worker "$worker_pid"
worker_pid=""

step "queues: offer three messages, poll them back in order"
tubeway queue create jobs --capacity 100
tubeway offer jobs 'resize image 1'
tubeway offer jobs 'resize image 2'
tubeway offer jobs --data '{"resize": 3}'
tubeway poll jobs --count 3 --wait 5s
tubeway queue status jobs

step "topics: a subscriber in the background, two messages published"
tubeway topic create news
printf '\n$ tubeway subscribe news --count 2 &\n'
"$BIN" subscribe news --count 2 >"$work/subscriber.out" 2>"$work/subscriber.err" &
subscriber_pid=$!

subscribed() { "$BIN" stats --json | grep -q '"name":"news","subscribers":1[,}]'; }
wait_until 20 subscribed

tubeway publish news 'first edition'
tubeway publish news 'second edition'

finish_background subscriber "$subscriber_pid"
subscriber_pid=""

step "statistics"
tubeway stats

step "stopping the broker (SIGTERM)"
printf '$ kill -TERM %s\n' "$server_pid"
kill -TERM "$server_pid"
wait_until 10 exited "$server_pid"
if wait "$server_pid"; then
    echo "broker stopped cleanly"
else
    status=$?
    server_pid=""
    echo "demo: the broker exited with status $status" >&2
    exit 1
fi
server_pid=""

step "done"
