#!/bin/sh
# Interop of examples/rc_pingpong.rs (Rust, uverbs) with rdma-core's ibv_rc_pingpong (C,
# libibverbs) on rxe0 over loopback: Rust server + C client, C server + Rust client, and
# Rust + Rust, each with 10000 iterations on GID index 1 (::ffff:127.0.0.1, RoCE v2).
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/rc_pingpong_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

target=${UVERBS_TARGET_DIR:-$PWD/target}
rust=$target/debug/examples/rc_pingpong
cbin=$(command -v ibv_rc_pingpong || true)
iters=10000
common="-n $iters -g 1 -d rxe0"

if [ ! -x "$rust" ]; then
    echo "FAIL: $rust is missing: run 'cargo build -p uverbs --examples' first"
    exit 1
fi
if [ -z "$cbin" ]; then
    echo "FAIL: ibv_rc_pingpong (ibverbs-utils) is not installed"
    exit 1
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/rc_pingpong_interop.XXXXXX")
trap 'rm -rf "$logs"' EXIT

. "$(dirname "$0")/lib/poll.sh"

# Whether a TCP socket listens on port $1 (state 0A in /proc/net/tcp*).
tcp_listens() {
    grep -Eq "^ *[0-9]+: [0-9A-F]+:$(printf '%04X' "$1") [0-9A-F]+:0000 0A " \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# Waits (up to 30 s) until something listens on TCP port $1, while process $2 lives.
wait_listen() { poll_until 30 "$2" tcp_listens "$1"; }

show() {
    echo "---- $1:"
    sed 's/^/    /' "$2"
}

failures=0

# pair NAME PORT SERVER_BIN CLIENT_BIN
pair() {
    name=$1 port=$2 server=$3 client=$4
    slog=$logs/$port.server cl=$logs/$port.client
    : >"$cl"
    # shellcheck disable=SC2086 # $common is a list of options
    timeout 120 "$server" $common -p "$port" >"$slog" 2>&1 &
    spid=$!
    crc=0
    if wait_listen "$port" "$spid"; then
        # shellcheck disable=SC2086
        timeout 120 "$client" $common -p "$port" 127.0.0.1 >"$cl" 2>&1 || crc=$?
    else
        echo "server never listened on port $port" >"$cl"
        crc=254
    fi
    if [ "$crc" -ne 0 ]; then
        # The server may still wait for a client or completions: stop it (timeout passes
        # the signal on) rather than sit out its time limit.
        kill "$spid" 2>/dev/null || true
    fi
    src=0
    wait "$spid" || src=$?

    ok=1
    [ "$src" -eq 0 ] || ok=0
    [ "$crc" -eq 0 ] || ok=0
    grep -q "^$iters iters in " "$slog" || ok=0
    grep -q "^$iters iters in " "$cl" || ok=0
    if [ "$ok" -eq 1 ]; then
        echo "PASS $name (port $port)"
        grep -E " (bytes|iters) in " "$slog" | sed 's/^/    server: /'
        grep -E " (bytes|iters) in " "$cl" | sed 's/^/    client: /'
    else
        echo "FAIL $name (port $port): server exit $src, client exit $crc"
        show "server ($server)" "$slog"
        show "client ($client)" "$cl"
        failures=$((failures + 1))
    fi
}

pair "Rust server + C client" 18531 "$rust" "$cbin"
pair "C server + Rust client" 18532 "$cbin" "$rust"
pair "Rust server + Rust client" 18533 "$rust" "$rust"

if [ "$failures" -ne 0 ]; then
    echo "rc_pingpong interop: $failures of 3 pairings failed"
    exit 1
fi
echo "rc_pingpong interop: all 3 pairings passed"
