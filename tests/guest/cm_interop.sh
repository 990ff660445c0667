#!/bin/sh
# RDMA CM interop: examples/cm_hello.rs (Rust, uverbs::cm, no librdmacm) with rdma-core's
# librdmacm examples rdma_server and rdma_client (rdmacm-utils): C server + Rust client, Rust
# server + C client, and Rust + Rust, on the address of the guest's rxe_cm device
# ($UVERBS_CM_ADDR, a dummy netdev: the CM cannot use loopback addresses).
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/cm_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

target=${UVERBS_TARGET_DIR:-$PWD/target}
rust=$target/debug/examples/cm_hello
addr=${UVERBS_CM_ADDR:-}

if [ -z "$addr" ]; then
    echo "FAIL: UVERBS_CM_ADDR is not set (the test guest sets it to rxe_cm's address)"
    exit 1
fi
if [ ! -x "$rust" ]; then
    echo "FAIL: $rust is missing: run 'cargo build -p uverbs --examples' first"
    exit 1
fi
for c in rdma_server rdma_client; do
    if ! command -v $c >/dev/null; then
        echo "FAIL: $c (rdmacm-utils) is not installed"
        exit 1
    fi
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/cm_interop.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# Waits (up to 30 s) until an rdma_cm id listens on port $1, while process $2 lives.
wait_listen() {
    n=0
    while [ "$n" -lt 300 ]; do
        if rdma resource show cm_id | grep -q "state LISTEN .*src-addr [^ ]*:$1 "; then
            return 0
        fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        n=$((n + 1))
    done
    return 1
}

show() {
    echo "---- $1:"
    sed 's/^/    /' "$2"
}

failures=0

# pair NAME PORT SERVER_COMMAND CLIENT_COMMAND (commands see $port)
pair() {
    name=$1 port=$2
    slog=$logs/$port.server cl=$logs/$port.client
    : >"$cl"
    timeout 60 sh -c "$3" >"$slog" 2>&1 &
    spid=$!
    crc=0
    if wait_listen "$port" "$spid"; then
        timeout 60 sh -c "$4" >"$cl" 2>&1 || crc=$?
    else
        echo "server never listened on port $port" >"$cl"
        crc=1
    fi
    src=0
    wait "$spid" || src=$?
    if [ "$src" -eq 0 ] && [ "$crc" -eq 0 ]; then
        echo "ok: $name"
        show server "$slog"
        show client "$cl"
    else
        echo "FAIL: $name (server exit $src, client exit $crc)"
        show server "$slog"
        show client "$cl"
        failures=$((failures + 1))
    fi
}

pair "rdma_server (C) <- cm_hello client (Rust)" 7481 \
    "rdma_server -s $addr -p 7481" "$rust client $addr:7481"
pair "cm_hello server (Rust) <- rdma_client (C)" 7482 \
    "$rust server $addr:7482" "rdma_client -s $addr -p 7482"
pair "cm_hello server (Rust) <- cm_hello client (Rust)" 7483 \
    "$rust server $addr:7483" "$rust client $addr:7483"

# rdma_client reports failures only in its output, not always in its exit status.
if grep -q "rdma_client: end -\|rdma_server: end -" "$logs"/* 2>/dev/null; then
    echo "FAIL: a C program reported an error"
    failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] || exit 1
echo "cm_interop: all 3 pairings passed"
