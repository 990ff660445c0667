#!/bin/sh
# rsocket interop: examples/rstream_peer.rs (uverbs::stream, no librdmacm) against rdma-core's
# unmodified `rstream` (rdmacm-utils) in both roles at several sizes, transfer counts and
# iterations (`-T v`: rstream checks every byte it receives; the Rust side checks every byte
# too), and against a plain TCP C program (tests/stream/tcp_echo.c, ordinary sockets, compiled
# here) run under LD_PRELOAD=librspreload.so, in both roles, every echoed byte checked. On the
# address of the guest's rxe_cm device ($UVERBS_CM_ADDR, a dummy netdev).
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/rsocket_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

target=${UVERBS_TARGET_DIR:-$PWD/target}
peer=$target/debug/examples/rstream_peer
addr=${UVERBS_CM_ADDR:-}
preload=
for p in /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so /usr/lib/*/rsocket/librspreload.so \
    /usr/lib64/rsocket/librspreload.so; do
    if [ -e "$p" ]; then preload=$p; break; fi
done

if [ -z "$addr" ]; then
    echo "FAIL: UVERBS_CM_ADDR is not set (the test guest sets it to rxe_cm's address)"
    exit 1
fi
if [ ! -x "$peer" ]; then
    echo "FAIL: $peer is missing: run 'cargo build -p uverbs --examples' first"
    exit 1
fi
if ! command -v rstream >/dev/null; then
    echo "FAIL: rstream (rdmacm-utils) is not installed"
    exit 1
fi
if [ -z "$preload" ]; then
    echo "FAIL: librspreload.so (rdmacm-utils) is not installed"
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! cc -O2 -Wall -Werror -o "$work/tcp_echo" tests/stream/tcp_echo.c >"$work/cc.out" 2>&1; then
    cat "$work/cc.out"
    echo "FAIL tests/stream/tcp_echo.c does not compile"
    exit 1
fi

# Waits until a cm_id listens on port $1 (the server is up; C programs' stdout is
# block-buffered into a file, so their output cannot say so), at most 60 s.
wait_listen() {
    i=0
    while ! rdma resource show cm_id | grep "state LISTEN" | grep -q "src-addr [0-9.]*:$1 "; do
        i=$((i + 1))
        if [ $i -gt 600 ]; then
            echo "FAIL: nothing listens on port $1 after 60 s:"
            rdma resource show cm_id
            return 1
        fi
        sleep 0.1
    done
}

failed=0
passed=0
port=7700

# Runs one pairing: $1 its name, $2 the server command, $3 the client command (PORT in
# either: the pairing's port). Both must exit 0.
pair() {
    port=$((port + 1))
    name=$1
    server=$(echo "$2" | sed "s/PORT/$port/g")
    client=$(echo "$3" | sed "s/PORT/$port/g")
    echo "---- $name"
    echo "server: $server"
    echo "client: $client"
    sh -c "exec timeout 300 $server" >"$work/server.out" 2>&1 &
    spid=$!
    if ! wait_listen $port; then
        kill $spid 2>/dev/null || true
        failed=$((failed + 1))
        return 0
    fi
    crc=0
    sh -c "exec timeout 300 $client" >"$work/client.out" 2>&1 || crc=$?
    src=0
    wait $spid || src=$?
    sed 's/^/  server| /' "$work/server.out"
    sed 's/^/  client| /' "$work/client.out"
    if [ $crc -eq 0 ] && [ $src -eq 0 ]; then
        echo "ok $name"
        passed=$((passed + 1))
    else
        echo "FAIL $name (server exit $src, client exit $crc)"
        failed=$((failed + 1))
    fi
}

# rstream's options: -S transfer size, -C transfers per iteration, -I iterations; -T b
# blocking calls, -T a poll()-driven, -T v verify every byte.
for opts in "-S 16 -C 1 -I 1" "-S 100 -C 10 -I 3" "-S 4096 -C 8 -I 4" "-S 65536 -C 4 -I 4" \
    "-S 1000000 -C 1 -I 3"; do
    pair "Rust server <- rstream client $opts" \
        "$peer rstream-server $addr:PORT $opts" \
        "rstream -s $addr -p PORT $opts -T b -T v"
    pair "rstream server <- Rust client $opts" \
        "rstream -b $addr -p PORT $opts -T b -T v" \
        "$peer rstream-client $addr:PORT $opts"
done
pair "Rust server <- rstream client, poll()-driven" \
    "$peer rstream-server $addr:PORT -S 30000 -C 5 -I 5" \
    "rstream -s $addr -p PORT -S 30000 -C 5 -I 5 -T a -T v"
pair "rstream server, poll()-driven <- Rust client" \
    "rstream -b $addr -p PORT -S 30000 -C 5 -I 5 -T a -T v" \
    "$peer rstream-client $addr:PORT -S 30000 -C 5 -I 5"

# A plain TCP program under librspreload.so.
pair "Rust echo server <- TCP C client under librspreload" \
    "$peer echo-server $addr:PORT" \
    "env LD_PRELOAD=$preload $work/tcp_echo client $addr PORT 4000000 50000"
pair "TCP C echo server under librspreload <- Rust client" \
    "env LD_PRELOAD=$preload $work/tcp_echo server $addr PORT" \
    "$peer echo-client $addr:PORT -S 4000000 -B 50000"

if [ $failed -ne 0 ]; then
    echo "rsocket_interop: $failed of $((passed + failed)) pairings FAILED"
    exit 1
fi
echo "rsocket_interop: all $passed pairings passed, every byte checked"
