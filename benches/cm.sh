#!/bin/sh
# The connection-setup benchmark of `cargo xtask bench-cm`, inside one guest boot: rdma-core's
# C `ucmatose` (librdmacm) and the Rust `cmatose` example (uverbs::cm), each as server and
# client of itself, establishing and tearing down N connections with no messages (`-C 0`).
# Each pair runs twice for each N: both sides under `strace -f -c` (the system calls each
# side makes), then both under callgrind (the user-space instructions each side executes).
#
#   benches/cm.sh RUST_CMATOSE
#
# Writes into $UVERBS_RESULTS: for each implementation (c, rust), role (server, client) and
# N, strace.IMPL.ROLE.N (strace's summary table) and cg.IMPL.ROLE.N (the callgrind dump), and
# log.txt. Knobs: UVERBS_BENCH_CM_N (the two connection counts, default "10 50": the
# per-connection figures are the differences between them, so that start-up cancels out).
set -u

rust=$1
out=${UVERBS_RESULTS:?UVERBS_RESULTS must name the output directory}
addr=${UVERBS_CM_ADDR:?UVERBS_CM_ADDR must name the address of an RDMA device}
counts=${UVERBS_BENCH_CM_N:-10 50}
log=$out/log.txt
: >"$log"
{
    echo "guest_kernel=$(uname -r)"
    echo "rdma_core=$(dpkg-query -W -f '${Version}' rdma-core 2>/dev/null)"
    echo "valgrind=$(valgrind --version 2>/dev/null)"
    echo "strace=$(strace -V 2>/dev/null | head -1)"
} >"$out/env.txt"

# Waits (up to 60 s) until an rdma_cm id listens on port $1, while process $2 lives.
wait_listen() {
    w=0
    while [ "$w" -lt 600 ]; do
        if rdma resource show cm_id | grep -q "state LISTEN .*src-addr [^ ]*:$1 "; then
            return 0
        fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        w=$((w + 1))
    done
    return 1
}

failures=0
port=7600
# run IMPL PROGRAM N TOOL: server and client of PROGRAM with N connections, each side under
# TOOL (strace or callgrind), on a port of its own.
run() {
    impl=$1 prog=$2 n=$3 tool=$4
    port=$((port + 1))
    case $tool in
    strace) wrap_s="strace -f -c -o $out/strace.$impl.server.$n" wrap_c="strace -f -c -o $out/strace.$impl.client.$n" ;;
    callgrind)
        wrap_s="valgrind --tool=callgrind --callgrind-out-file=$out/cg.$impl.server.$n"
        wrap_c="valgrind --tool=callgrind --callgrind-out-file=$out/cg.$impl.client.$n"
        ;;
    esac
    echo "==== $impl $tool N=$n (port $port)" >>"$log"
    timeout 600 $wrap_s "$prog" -b "$addr" -p "$port" -c "$n" -C 0 >>"$log" 2>&1 &
    spid=$!
    crc=0
    if wait_listen "$port" "$spid"; then
        timeout 600 $wrap_c "$prog" -s "$addr" -p "$port" -c "$n" -C 0 >>"$log" 2>&1 || crc=$?
    else
        echo "server never listened on port $port" >>"$log"
        crc=1
    fi
    src=0
    wait "$spid" || src=$?
    if [ "$src" -ne 0 ] || [ "$crc" -ne 0 ]; then
        echo "bench-cm: FAILED: $impl $tool N=$n (server exit $src, client exit $crc; see log.txt)" >&2
        failures=$((failures + 1))
    else
        echo "bench-cm: $impl $tool N=$n" >&2
    fi
}

for n in $counts; do
    for tool in strace callgrind; do
        run c ucmatose "$n" "$tool"
        run rust "$rust" "$n" "$tool"
    done
done
exit $((failures > 0))
