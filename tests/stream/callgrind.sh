#!/bin/sh
# Instructions per byte moved, uverbs::stream against C rsockets, counted by callgrind in the
# test guest (real rxe): the client of rstream's exchange (`-S size -C count -I iterations`,
# data both ways, no verification on either side) is examples/rstream_peer (release build)
# or rdma-core's `rstream`, each time against a C `rstream` server. Each client runs twice
# under callgrind, with I1 and I2 iterations; the difference of the two totals over the
# difference of the bytes moved (sent plus received) is the marginal cost of a byte: set-up,
# connection and teardown cancel out. All threads count (rsockets' service threads included).
#
#   cargo xtask bench --stream     (builds rstream_peer, runs this in the guest, writes the
#                                   table into docs/benchmarks.md: xtask/src/bench/stream.rs)
# or by hand:
#   cargo build --release -p uverbs --example rstream_peer
#   UVERBS_GUEST_TIMEOUT=3000 cargo xtask guest -- 'sh tests/stream/callgrind.sh'
#
# Prints a Markdown table. Where $UVERBS_RESULTS names a folder (the guest harness sets it;
# xtask copies it back to the host), the raw results go there too: env.txt (kernel, versions,
# the specs), totals.txt (one line per client run: `IMPL SIZE COUNT ITERATIONS TOTAL`) and
# each run's dump (cg.IMPL.SIZE.ITERATIONS).
set -eu

. "$(dirname "$0")/lib.sh"
port=7900

# Total instructions of one client run: $1 rust|c, $2 size, $3 count, $4 iterations, $5 the
# port (fresh each run).
count() {
    port=$5 dump=cg.$1.$2.$4
    timeout 600 rstream -b "$addr" -p $port -S "$2" -C "$3" -I "$4" -T b >"$work/server.out" 2>&1 &
    spid=$!
    wait_listen $port rdma
    if [ "$1" = rust ]; then
        set -- "$peer" rstream-client "$addr:$port" -S "$2" -C "$3" -I "$4" -v 0
    else
        set -- rstream -s "$addr" -p $port -S "$2" -C "$3" -I "$4" -T b
    fi
    timeout 1200 valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" "$@" >"$work/client.out" 2>&1 || {
        cat "$work/client.out" "$work/server.out" >&2
        echo "FAIL: $*" >&2
        exit 1
    }
    wait $spid
    if [ -n "$results" ]; then
        cp "$work/cg.out" "$results/$dump"
    fi
    sed -n 's/^totals: *\([0-9]*\).*/\1/p;s/^summary: *\([0-9]*\).*/\1/p' "$work/cg.out" | head -n 1
}

# UVERBS_STREAM_CG_SPECS: "size count i1 i2" entries separated by commas.
specs=${UVERBS_STREAM_CG_SPECS:-64 200 5 10,4096 20 5 10,65536 4 3 6,1048576 1 2 4}
results=${UVERBS_RESULTS:-}
if [ -n "$results" ]; then
    mkdir -p "$results"
    : >"$results/totals.txt"
    {
        echo "guest_kernel=$(uname -r)"
        echo "rdma_core=$(dpkg-query -W -f '${Version}' rdma-core 2>/dev/null)"
        echo "valgrind=$(valgrind --version 2>/dev/null)"
        echo "specs=$specs"
    } >"$results/env.txt"
fi

echo "| message | transfers x iterations | Rust stream Ir/byte | C rsockets (rstream) Ir/byte |"
echo "|---|---|---|---|"
echo "$specs" | tr ',' '\n' | while read -r size c i1 i2; do
    bytes=$((2 * size * c * (i2 - i1)))
    row="| $size B | $c x ($i1 vs $i2) |"
    for who in rust c; do
        port=$((port + 2))
        a=$(count $who $size $c $i1 $port)
        b=$(count $who $size $c $i2 $((port + 1)))
        if [ -n "$results" ]; then
            echo "$who $size $c $i1 $a" >>"$results/totals.txt"
            echo "$who $size $c $i2 $b" >>"$results/totals.txt"
        fi
        row="$row $(echo "$a $b $bytes" | awk '{printf "%.2f", ($2 - $1) / $3}') |"
    done
    echo "$row"
done
