#!/bin/sh
# RDMA CM interop over soft-iWARP: the Rust examples (uverbs::cm and the siw provider, no
# librdmacm) against rdma-core's unmodified C tools (librdmacm and rdma-core's C siw provider),
# every role, on siw0 (xtask/guest/with_siw.sh adds it on a dummy netdev; this script re-runs
# itself under it when UVERBS_SIW_ADDR is not set).
#
# rping (examples/rping.rs): C with C for the reference, then Rust server <- C client, C server
# <- Rust client, Rust with Rust, each `-C 10 -v -V`, at the default 64 bytes and at 5000 (RDMA
# READ and WRITE of several segments); each side's `-v` lines must be exactly the C programs'.
# cmatose (examples/cmatose.rs) with ucmatose, `-c 4 -C 50`, each role: both ends report
# `return status 0`. cm_hello (examples/cm_hello.rs) with librdmacm's rdma_server/rdma_client,
# each role.
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/siw_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

if [ -z "${UVERBS_SIW_ADDR:-}" ]; then
    exec sh "${UVERBS_PROJECT:-$PWD}/xtask/guest/with_siw.sh" sh "$0" "$@"
fi

target=${UVERBS_TARGET_DIR:-$PWD/target}
rping=$target/debug/examples/rping
cmatose=$target/debug/examples/cmatose
hello=$target/debug/examples/cm_hello
addr=$UVERBS_SIW_ADDR

for b in "$rping" "$cmatose" "$hello"; do
    if [ ! -x "$b" ]; then
        echo "FAIL: $b is missing: run 'cargo build -p uverbs --examples' first"
        exit 1
    fi
done
for c in rping ucmatose rdma_server rdma_client; do
    if ! command -v $c >/dev/null; then
        echo "FAIL: $c (rdmacm-utils) is not installed"
        exit 1
    fi
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/siw_interop.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# Waits (up to 60 s) until an rdma_cm id listens on port $1, while process $2 lives.
wait_listen() {
    n=0
    while [ "$n" -lt 600 ]; do
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
    cut -c1-120 "$2" | sed 's/^/    /'
}

failures=0

# pair NAME PORT SERVER_COMMAND CLIENT_COMMAND: the server first; stdout to $logs/PORT.server
# and $logs/PORT.client, stderr to the same with `.err`. Non-zero (a failure counted) unless
# both exit 0.
pair() {
    name=$1 port=$2
    slog=$logs/$port.server cl=$logs/$port.client
    : >"$cl"
    : >"$cl.err"
    timeout 240 sh -c "$3" >"$slog" 2>"$slog.err" &
    spid=$!
    crc=0
    if wait_listen "$port" "$spid"; then
        timeout 240 sh -c "$4" >"$cl" 2>"$cl.err" || crc=$?
    else
        echo "server never listened on port $port" >"$cl.err"
        crc=1
    fi
    src=0
    wait "$spid" || src=$?
    ok=0
    if [ "$src" -eq 0 ] && [ "$crc" -eq 0 ]; then
        echo "ok: $name"
    else
        echo "FAIL: $name (server exit $src, client exit $crc)"
        failures=$((failures + 1))
        ok=1
    fi
    for f in "$slog" "$slog.err" "$cl" "$cl.err"; do
        if [ -s "$f" ]; then
            show "${f#"$logs/$port."}" "$f"
        fi
    done
    return $ok
}

# same WHAT EXPECTED ACTUAL: the two files are equal (a failure counted if not).
same() {
    if cmp -s "$2" "$3"; then
        echo "ok: $1 ($(wc -l <"$3") lines, as the C program's)"
    else
        echo "FAIL: $1 differs from the C program's: $(cmp "$2" "$3" 2>&1 || true)"
        diff "$2" "$3" | cut -c1-120 | sed 's/^/    /' || true
        failures=$((failures + 1))
    fi
}

client_lines() { grep '^ping data: ' "$1" >"$2" || true; }
server_lines() { grep '^server ping data: ' "$1" >"$2" || true; }

rping_pair() {
    if pair "$1 ($ping_args)" "$2" "$3" "$4"; then
        client_lines "$logs/$2.client" "$logs/$2.cv"
        server_lines "$logs/$2.server" "$logs/$2.sv"
        same "$1: client's ping data" "$ref.client" "$logs/$2.cv"
        same "$1: server's ping data" "$ref.server" "$logs/$2.sv"
    fi
}

# rping_suite SIZE_ARGS PORT: the C reference, then Rust in each role (ports PORT to PORT+3).
rping_suite() {
    sz=$1 p=$2
    ping_args="-C 10 -v -V $sz"
    ref=$logs/ref$p
    if pair "rping -s (C) <- rping -c (C), the reference ($ping_args)" "$p" \
        "rping -s -a $addr -p $p -v $sz" "rping -c -a $addr -p $p $ping_args"; then
        client_lines "$logs/$p.client" "$ref.client"
        server_lines "$logs/$p.server" "$ref.server"
        if [ "$(wc -l <"$ref.client")" -ne 10 ] || [ "$(wc -l <"$ref.server")" -ne 10 ]; then
            echo "FAIL: the C reference did not print 10 pings on each side"
            failures=$((failures + 1))
        fi
    else
        echo "FAIL: no reference output; the rping comparisons ($ping_args) cannot run"
        return
    fi
    rping_pair "rping server (Rust) <- rping -c (C)" $((p + 1)) \
        "$rping -s -a $addr -p $((p + 1)) -v $sz" "rping -c -a $addr -p $((p + 1)) $ping_args"
    rping_pair "rping -s (C) <- rping client (Rust)" $((p + 2)) \
        "rping -s -a $addr -p $((p + 2)) -v $sz" "$rping -c -a $addr -p $((p + 2)) $ping_args"
    rping_pair "rping server (Rust) <- rping client (Rust)" $((p + 3)) \
        "$rping -s -a $addr -p $((p + 3)) -v $sz" "$rping -c -a $addr -p $((p + 3)) $ping_args"
}

rping_suite "" 7631
rping_suite "-S 5000" 7641

cm_args="-c 4 -C 50"
cmatose_pair() {
    if pair "$1" "$2" "$3" "$4"; then
        for side in server client; do
            if ! grep -qx "return status 0" "$logs/$2.$side"; then
                echo "FAIL: $1: the $side did not report 'return status 0'"
                failures=$((failures + 1))
            fi
        done
    fi
}
cmatose_pair "cmatose server (Rust) <- ucmatose client (C)" 7651 \
    "$cmatose -b $addr -p 7651 $cm_args" "ucmatose -s $addr -p 7651 $cm_args"
cmatose_pair "ucmatose server (C) <- cmatose client (Rust)" 7652 \
    "ucmatose -b $addr -p 7652 $cm_args" "$cmatose -s $addr -p 7652 $cm_args"
cmatose_pair "cmatose server (Rust) <- cmatose client (Rust)" 7653 \
    "$cmatose -b $addr -p 7653 $cm_args" "$cmatose -s $addr -p 7653 $cm_args"

pair "rdma_server (C) <- cm_hello client (Rust)" 7661 \
    "rdma_server -s $addr -p 7661" "$hello client $addr:7661" || true
pair "cm_hello server (Rust) <- rdma_client (C)" 7662 \
    "$hello server $addr:7662" "rdma_client -s $addr -p 7662" || true
pair "cm_hello server (Rust) <- cm_hello client (Rust)" 7663 \
    "$hello server $addr:7663" "$hello client $addr:7663" || true
# rdma_client and rdma_server report failures only in their output, not always in their status.
if grep -q "rdma_client: end -\|rdma_server: end -" "$logs"/766* 2>/dev/null; then
    echo "FAIL: a C program reported an error"
    failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] || exit 1
echo "siw_interop: all 14 pairings passed over siw, every rping output compared"
