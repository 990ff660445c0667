#!/bin/sh
# rsocket interop over soft-iWARP: examples/rstream_peer.rs (uverbs::stream and the siw
# provider, no librdmacm) against rdma-core's unmodified `rstream` (rdmacm-utils, librdmacm's
# rsockets and rdma-core's C siw provider) in both roles, on siw0. On iWARP both sides speak
# rsockets' message-send variant (RS_OPT_MSG_SEND: each message an RDMA write, if it carries
# bytes, then a 4-byte SEND; docs/rsocket-protocol.md). `rstream -T v` checks every byte it
# receives, and the Rust side checks every byte too; a C with C pairing first shows that the
# C side works on this kernel's siw. Then a plain TCP C program (tests/stream/tcp_echo.c,
# compiled here) under LD_PRELOAD=librspreload.so in both roles, every echoed byte checked.
# (xtask/guest/with_siw.sh adds siw0 on a dummy netdev; this script re-runs itself under it
# when UVERBS_SIW_ADDR is not set.)
#
# Runs in the test guest (`cargo xtask test`, first kernel only, or
# `cargo xtask guest -- 'sh tests/guest/rsocket_siw_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

if [ -z "${UVERBS_SIW_ADDR:-}" ]; then
    exec sh "${UVERBS_PROJECT:-$PWD}/xtask/guest/with_siw.sh" sh "$0" "$@"
fi

target=${UVERBS_TARGET_DIR:-$PWD/target}
peer=$target/debug/examples/rstream_peer
addr=$UVERBS_SIW_ADDR
preload=
for p in /usr/lib/x86_64-linux-gnu/rsocket/librspreload.so /usr/lib/*/rsocket/librspreload.so \
    /usr/lib64/rsocket/librspreload.so; do
    if [ -e "$p" ]; then preload=$p; break; fi
done

. "$(dirname "$0")/lib/pairs.sh"
need_examples "$peer"
need_commands rstream
if [ -z "$preload" ]; then
    echo "FAIL: librspreload.so (rdmacm-utils) is not installed"
    exit 1
fi
if ! cc -O2 -Wall -Werror -o "$logs/tcp_echo" tests/stream/tcp_echo.c >"$logs/cc.out" 2>&1; then
    cat "$logs/cc.out"
    echo "FAIL tests/stream/tcp_echo.c does not compile"
    exit 1
fi

# rstream's options: -S transfer size, -C transfers per iteration, -I iterations; -T b
# blocking calls, -T a poll()-driven, -T v verify every byte.
port=7720
rstream_pairs() {
    port=$((port + 1))
    pairs=$((pairs + 2))
    pair "rstream_peer server (Rust) <- rstream client (C) $1" $port \
        "$peer rstream-server $addr:$port $1" "rstream -s $addr -p $port $1 -T b -T v" || true
    port=$((port + 1))
    pair "rstream server (C) <- rstream_peer client (Rust) $1" $port \
        "rstream -b $addr -p $port $1 -T b -T v" "$peer rstream-client $addr:$port $1" || true
}

pairs=1
pair "rstream server (C) <- rstream client (C), the reference -S 65536 -C 4 -I 4" 7720 \
    "rstream -b $addr -p 7720 -S 65536 -C 4 -I 4 -T b -T v" \
    "rstream -s $addr -p 7720 -S 65536 -C 4 -I 4 -T b -T v" || true
for opts in "-S 16 -C 1 -I 1" "-S 100 -C 10 -I 3" "-S 4096 -C 8 -I 4" "-S 65536 -C 4 -I 4" \
    "-S 1000000 -C 1 -I 3"; do
    rstream_pairs "$opts"
done
pairs=$((pairs + 4))
pair "rstream_peer server (Rust) <- rstream client (C), poll()-driven" 7740 \
    "$peer rstream-server $addr:7740 -S 30000 -C 5 -I 5" \
    "rstream -s $addr -p 7740 -S 30000 -C 5 -I 5 -T a -T v" || true
pair "rstream server (C), poll()-driven <- rstream_peer client (Rust)" 7741 \
    "rstream -b $addr -p 7741 -S 30000 -C 5 -I 5 -T a -T v" \
    "$peer rstream-client $addr:7741 -S 30000 -C 5 -I 5" || true
pair "echo server (Rust) <- TCP C client under librspreload" 7742 \
    "$peer echo-server $addr:7742" \
    "env LD_PRELOAD=$preload $logs/tcp_echo client $addr 7742 4000000 50000" || true
pair "TCP C echo server under librspreload <- echo client (Rust)" 7743 \
    "env LD_PRELOAD=$preload $logs/tcp_echo server $addr 7743" \
    "$peer echo-client $addr:7743 -S 4000000 -B 50000" || true

if [ "$failures" -ne 0 ]; then
    echo "rsocket_siw_interop: $failures of $pairs pairings FAILED"
    exit 1
fi
echo "rsocket_siw_interop: all $pairs pairings passed over siw, every byte checked"
