#!/bin/sh
# Throughput and round-trip latency of uverbs::stream against C rsockets and TCP, in one
# test guest run (real rxe on the dummy netdev of $UVERBS_CM_ADDR): rstream's exchange
# (`-S size -C count -I iterations`: each iteration `count` transfers of `size` bytes from
# the client, then as many back; no verification) between two Rust peers
# (examples/rstream_peer, release build), two C `rstream`s (librdmacm's rsockets) and two
# `rstream -T s` (the same C program on ordinary TCP sockets, to the same address: the kernel
# routes a local address through loopback). Latency: 64 B, one transfer each way per
# iteration; rstream's usec/xfer is half a round trip.
#
#   cargo build --release -p uverbs --example rstream_peer
#   cargo xtask guest -- 'sh tests/stream/bench.sh'
#
# Prints a Markdown table (`cargo xtask bench --stream` runs this after callgrind.sh in the
# same boot and writes the table into docs/benchmarks.md). Under QEMU TCG these times
# are the emulated CPU's: not evidence of native speed.
set -eu

. "$(dirname "$0")/lib.sh"
port=7930

# One exchange: $1 rust|c|tcp, $2 size, $3 count, $4 iterations. Prints "MiB/s usec/xfer"
# (both directions' bytes over the exchange's time, as rstream counts them).
run() {
    port=$((port + 1))
    case $1 in
    rust)
        server="$peer rstream-server $addr:$port -S $2 -C $3 -I $4 -v 0"
        client="$peer rstream-client $addr:$port -S $2 -C $3 -I $4 -v 0"
        kind=rdma
        ;;
    c)
        server="rstream -b $addr -p $port -S $2 -C $3 -I $4 -T b"
        client="rstream -s $addr -p $port -S $2 -C $3 -I $4 -T b"
        kind=rdma
        ;;
    tcp)
        server="rstream -b $addr -p $port -S $2 -C $3 -I $4 -T s -T b"
        client="rstream -s $addr -p $port -S $2 -C $3 -I $4 -T s -T b"
        kind=tcp
        ;;
    esac
    timeout 600 $server >"$work/server.out" 2>&1 &
    spid=$!
    wait_listen $port $kind
    if ! timeout 600 $client >"$work/client.out" 2>&1 </dev/null; then
        cat "$work/client.out" "$work/server.out" >&2
        echo "FAIL: $client" >&2
        exit 1
    fi
    wait $spid
    if [ "$1" = rust ]; then
        # "exchange: B bytes in S s, G Gb/s, U usec/xfer"
        awk '$1 == "exchange:" { printf "%.2f %s\n", $2 / $5 / 1048576, $9 }' "$work/client.out"
    else
        # name bytes xfers iters total time Gb/sec usec/xfer (time as "3.75s")
        awk -v b=$((2 * $2 * $3 * $4)) '$1 == "custom" { sub("s$", "", $6); printf "%.2f %s\n", b / $6 / 1048576, $8 }' "$work/client.out"
    fi
}

echo "| test | size x transfers x iterations | Rust stream | C rsockets (rstream) | TCP (rstream -T s) |"
echo "|---|---|---|---|---|"
# UVERBS_STREAM_BENCH_SPECS: "size count iterations" entries separated by commas.
specs=${UVERBS_STREAM_BENCH_SPECS:-64 2000 1,4096 500 1,65536 64 1,1048576 4 2}
echo "$specs" | tr ',' '\n' | while read -r size c i; do
    row="| throughput, MiB/s | $size B x $c x $i |"
    for who in rust c tcp; do
        row="$row $(run $who "$size" "$c" "$i" | awk '{print $1}') |"
    done
    echo "$row"
done
lat=${UVERBS_STREAM_BENCH_LAT:-1000}
row="| 64 B round trip, usec | 64 B x 1 x $lat |"
for who in rust c tcp; do
    row="$row $(run $who 64 1 "$lat" | awk '{printf "%.1f", 2 * $2}') |"
done
echo "$row"
