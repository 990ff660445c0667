#!/bin/sh
# The benchmark run of `cargo xtask bench`, inside one guest boot (or natively on a host with an
# rxe device): the Rust harness, the C harness on rdma-core's C provider, the C harness on the
# Rust drop-in provider, the same three under callgrind, a perf profile of the drain, and
# perftest on either provider.
#
#   benches/guest.sh RUST_BENCH C_BENCH DROPIN_SO
#
# Writes into $UVERBS_RESULTS: results.jsonl (one JSON line per measurement), cg/ (callgrind
# dumps, one per measured region), profile/ (perf reports of the drain), perftest/ (raw
# perftest output), env.txt and log.txt.
# Knobs: UVERBS_BENCH_REPS (harness repetitions, default 5), UVERBS_BENCH_PERFTEST_REPS
# (perftest repetitions, default 15),
# UVERBS_BENCH_SKIP (comma list of: timing, callgrind, profile, perftest).
set -u

rust=$1 c=$2 so=$3
out=${UVERBS_RESULTS:?UVERBS_RESULTS must name the output directory}
reps=${UVERBS_BENCH_REPS:-5}
skip=",${UVERBS_BENCH_SKIP:-},"
dev=rxe0
gidx=1
mkdir -p "$out/cg" "$out/perftest"
results=$out/results.jsonl
log=$out/log.txt
: >"$results"
: >"$log"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# libibverbs loads `<path>-rdmav34.so` for an absolute RDMAV_DRIVERS entry `<path>`.
ln -s "$so" "$work/libuverbs_rxe-rdmav34.so"
dropin="env RDMAV_DRIVERS=$work/libuverbs_rxe"

{
    echo "guest_kernel=$(uname -r)"
    echo "guest_cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
    echo "guest_cpus=$(grep -c ^processor /proc/cpuinfo)"
    echo "rdma_core=$(dpkg-query -W -f '${Version}' rdma-core 2>/dev/null)"
    echo "perftest=$(dpkg-query -W -f '${Version}' perftest 2>/dev/null)"
    echo "valgrind=$(valgrind --version 2>/dev/null)"
} >"$out/env.txt"

failures=0
# step NAME REP CMD...: runs CMD; its stdout (JSON lines) goes to results.jsonl, each line
# tagged with the repetition REP, its stderr to the log.
step() {
    name=$1 rep=$2
    shift 2
    echo "bench: $name" >&2
    echo "==== $name" >>"$log"
    if "$@" >"$work/step.out" 2>>"$log"; then
        sed "s/^{/{\"rep\":$rep,/" "$work/step.out" >>"$results"
    else
        echo "bench: FAILED: $name (see log.txt)" >&2
        failures=$((failures + 1))
    fi
}

harness="--device $dev --gid-index $gidx"
if [ "${skip#*,timing,}" = "$skip" ]; then
    # Interleaved, so that drift in the emulator's speed hits every implementation alike.
    for group in drain,empty,post,post_built,post_safe,srq_post_built,srq_post_safe,recv_built,recv_safe,inplace,inplace_copy drain_replay,drain_floor pingpong,rate; do
        i=0
        while [ $i -lt "$reps" ]; do
            i=$((i + 1))
            step "rust $group ($i/$reps)" $i "$rust" $harness --only $group
            step "c $group ($i/$reps)" $i "$c" $harness --only $group
            # shellcheck disable=SC2086
            step "dropin $group ($i/$reps)" $i $dropin "$c" --impl dropin $harness --only $group
        done
    done
fi

if [ "${skip#*,callgrind,}" = "$skip" ]; then
    # Only the dumps count here: the harnesses' timings under valgrind go to the log.
    cg="valgrind --tool=callgrind --collect-atstart=no --callgrind-out-file"
    run_cg() {
        name=$1
        shift
        echo "bench: callgrind $name" >&2
        echo "==== callgrind $name" >>"$log"
        if ! "$@" >>"$log" 2>&1; then
            echo "bench: FAILED: callgrind $name (see log.txt)" >&2
            failures=$((failures + 1))
        fi
    }
    # shellcheck disable=SC2086
    run_cg rust $cg="$out/cg/rust.out" "$rust" $harness --callgrind \
        --only drain,empty,post,post_built,post_safe,srq_post_built,srq_post_safe,recv_built,recv_safe,inplace,inplace_copy,drain_replay,drain_floor
    # shellcheck disable=SC2086
    run_cg c $cg="$out/cg/c.out" "$c" $harness --callgrind --only drain,empty,post,inplace,drain_replay
    # shellcheck disable=SC2086
    run_cg dropin $dropin $cg="$out/cg/dropin.out" "$c" --impl dropin $harness --callgrind \
        --only drain,empty,post,inplace,drain_replay
fi

if [ "${skip#*,profile,}" = "$skip" ]; then
    # Where the drain's time goes on the emulated CPU: perf's software clock (the host has no
    # hardware counters) sampling every 50 us of CPU time, over four runs of the drain workload
    # per side. Under TCG a sample lands where the guest next takes an interrupt, which is the
    # start of a translated block: a sample names the block that follows the one that ran.
    mkdir -p "$out/profile"
    # (As root; elsewhere perf keeps its limits and may sample less often.)
    echo 100000 2>/dev/null >/proc/sys/kernel/perf_event_max_sample_rate
    echo 0 2>/dev/null >/proc/sys/kernel/perf_cpu_time_max_percent
    for side in rust c; do
        if [ $side = rust ]; then bin=$rust; else bin=$c; fi
        data=$out/profile/$side.data
        echo "bench: profile $side" >&2
        echo "==== profile $side" >>"$log"
        # shellcheck disable=SC2086
        if ! perf record -q -e cpu-clock -c 50000 -o "$data" -- sh -c \
            "for i in 1 2 3 4; do $bin $harness --only drain >/dev/null || exit 1; done" >>"$log" 2>&1; then
            echo "bench: FAILED: profile $side (see log.txt)" >&2
            failures=$((failures + 1))
            continue
        fi
        # User-space samples by function; then the provider's poll code instruction by
        # instruction (the Rust one has symbols; Debian's librxe is stripped, so C's samples
        # are by address).
        perf report -i "$data" --stdio --sort dso,sym 2>>"$log" | grep -v '\[k\]' >"$out/profile/$side.report.txt"
        if [ $side = rust ]; then
            for f in take_avx take_few_avx; do
                perf annotate -i "$data" --stdio -s "uverbs::providers::rxe::cq::$f" 2>>"$log"
            done >"$out/profile/$side.annotate.txt"
        fi
        rm -f "$data"
    done
fi

# Waits (up to 20 s) for a server to listen on TCP port $1.
wait_port() {
    n=0
    while [ $n -lt 100 ]; do
        ss -ltn 2>/dev/null | grep -q ":$1 " && return 0
        sleep 0.2
        n=$((n + 1))
    done
}

# perftest IMPL TEST REP ARGS...: server and client of TEST on provider IMPL (c, or dropin for
# the Rust one), both in this guest over loopback; one JSON line from the client's report.
perftest() {
    impl=$1 test=$2 rep=$3
    shift 3
    envp=env
    [ "$impl" = dropin ] && envp=$dropin
    base="$out/perftest/$test.$impl.$rep"
    # Up to three attempts, the later ones only after perftest failed to calibrate its cycle
    # counter ("Can't produce a report": the emulated CPU's clock, on either provider, now and
    # then); each retry is logged. Any other failure counts at once.
    for attempt in 1 2 3; do
        # shellcheck disable=SC2086
        timeout 300 $envp "$test" -d $dev -x $gidx "$@" >"$base.server" 2>&1 &
        spid=$!
        wait_port 18515
        # shellcheck disable=SC2086
        timeout 300 $envp "$test" -d $dev -x $gidx "$@" localhost >"$base.client" 2>&1
        crc=$?
        wait $spid
        src=$?
        [ $crc -ne 0 ] || [ $src -ne 0 ] || break
        grep -q "Can't produce a report" "$base.server" "$base.client" || break
        echo "==== $test $impl $rep: perftest's clock calibration failed (attempt $attempt)" >>"$log"
        grep -h "Correlation coefficient" "$base.server" "$base.client" >>"$log"
    done
    # The line under the `#bytes` header: latency tests give t_min t_max t_typical t_avg ...,
    # bandwidth tests BW peak, BW average, MsgRate.
    line=$(awk '/^ *#bytes/ { getline; print; exit }' "$base.client")
    if [ $crc -ne 0 ] || [ $src -ne 0 ] || [ -z "$line" ]; then
        echo "bench: FAILED: $test on $impl (server rc=$src, client rc=$crc)" >&2
        echo "==== $test $impl $rep failed" >>"$log"
        tail -n 20 "$base.server" "$base.client" >>"$log"
        failures=$((failures + 1))
        return
    fi
    # shellcheck disable=SC2086
    set -- $line
    case $test in
    *_lat) printf '{"rep":%s,"impl":"%s","workload":"%s","param":%s,"unit":"us","samples":[%s],"t_avg":%s}\n' \
        "$rep" "$impl" "$test" "$1" "$5" "$6" >>"$results" ;;
    *) printf '{"rep":%s,"impl":"%s","workload":"%s","param":%s,"unit":"Mpps","samples":[%s],"bw_avg":%s}\n' \
        "$rep" "$impl" "$test" "$1" "$5" "$4" >>"$results" ;;
    esac
}

if [ "${skip#*,perftest,}" = "$skip" ]; then
    # perftest's numbers jump between modes from run to run under TCG (e.g. 0.034 or 0.050
    # Mpps for the same program), so it gets more repetitions than the harnesses, and the
    # provider that goes first alternates.
    preps=${UVERBS_BENCH_PERFTEST_REPS:-15}
    i=0
    while [ $i -lt "$preps" ]; do
        i=$((i + 1))
        echo "bench: perftest ($i/$preps)" >&2
        order="c dropin"
        [ $((i % 2)) -eq 0 ] && order="dropin c"
        # Each test on both providers back to back, so that they share the host's mood.
        for impl in $order; do perftest $impl ib_send_lat $i -s 64 -n 5000; done
        for impl in $order; do perftest $impl ib_write_bw $i -s 64 -n 20000; done
        for impl in $order; do perftest $impl ib_send_bw $i -s 64 -n 20000; done
    done
fi

echo "bench: done, $failures failed step(s)" >&2
[ $failures -eq 0 ]
