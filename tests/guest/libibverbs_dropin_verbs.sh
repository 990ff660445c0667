#!/bin/sh
# The drop-in provider (dropin/libibverbs) against rdma-core's C rxe provider, verb by verb:
# each tests/guest/c/dropin_*.c program is compiled against libibverbs, run on the C provider
# (the reference) and then on the drop-in, and the two outputs (completion fields, remote
# memory, error statuses) must be identical. Needs an rxe device (the test guest's rxe0, GID
# 1 = ::ffff:127.0.0.1), cc and libibverbs-dev, and the provider built beforehand:
#   cargo build -p uverbs-libibverbs
# dropin_mcast runs across a wire instead: a veth pair with an rxe device on each end (as in
# tests/two_hosts.rs), the sender on rxe_wa and the receivers on rxe_wb, whose netdev joins the
# group's IPv4 address (rxe hands a multicast datagram to its QPs only if the IP layer takes
# it in: docs/kernel-facts.md). Needs root, as the test guest runs.
# One PASS or FAIL line per program; the last line counts them.
set -eu

target=${UVERBS_TARGET_DIR:-target}
lib="$target/debug/libuverbs_rxe.so"
src=$(cd "$(dirname "$0")" && pwd)/c
dev=rxe0
passed=0
failed=0

pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() {
    failed=$((failed + 1))
    echo "FAIL $*"
    for f in "$work"/*.out; do
        [ -f "$f" ] || continue
        echo "---- $(basename "$f")"
        tail -n 25 "$f"
    done
}

if [ ! -f "$lib" ]; then
    echo "FAIL provider not built: $lib is missing (run: cargo build -p uverbs-libibverbs)"
    echo "libibverbs_dropin_verbs: 0 passed, 1 failed"
    exit 1
fi
if ! command -v cc >/dev/null 2>&1 || [ ! -f /usr/include/infiniband/verbs.h ]; then
    echo "FAIL cannot compile the comparison programs without cc and libibverbs-dev (cargo xtask test installs them)"
    echo "libibverbs_dropin_verbs: 0 passed, 1 failed"
    exit 1
fi

# The veth pair for dropin_mcast (tests/common/veth_up.sh, shared with tests/two_hosts.rs),
# and the group 239.1.2.3 (dropin_mcast's) joined on the receiving end.
common=$(cd "$(dirname "$0")/../common" && pwd)
wire_down() { sh "$common/veth_down.sh"; }
wire_up() {
    sh "$common/veth_up.sh" && ip addr add 239.1.2.3/32 dev uvwb autojoin || return 1
    # Until the IPv4 GIDs (index 1) are there.
    for _ in $(seq 100); do
        grep -q ffff /sys/class/infiniband/rxe_wa/ports/1/gids/1 2>/dev/null &&
            grep -q ffff /sys/class/infiniband/rxe_wb/ports/1/gids/1 2>/dev/null && return 0
        sleep 0.05
    done
    return 1
}

work=$(mktemp -d)
wired=0
trap 'rm -rf "$work"; [ $wired -eq 0 ] || wire_down >/dev/null 2>&1' EXIT
# libibverbs loads `<path>-rdmav34.so` for an absolute RDMAV_DRIVERS entry `<path>`.
ln -s "$(cd "$(dirname "$lib")" && pwd)/libuverbs_rxe.so" "$work/libuverbs_rxe-rdmav34.so"

for c in "$src"/dropin_*.c; do
    name=$(basename "$c" .c)
    rm -f "$work"/*.out
    if ! cc -O1 -Wall -Werror -I"$src" -o "$work/$name" "$c" -libverbs >"$work/cc.out" 2>&1; then
        fail "$name: does not compile"
        continue
    fi
    args=$dev
    if [ "$name" = dropin_mcast ]; then
        wire_down >/dev/null 2>&1 || true
        wired=1
        if ! wire_up >"$work/wire.out" 2>&1; then
            fail "$name: setting up the veth pair with rxe_wa and rxe_wb failed"
            continue
        fi
        args="rxe_wb rxe_wa"
    fi
    crc=0
    timeout 120 "$work/$name" $args >"$work/c.txt" 2>"$work/c_stderr.out" || crc=$?
    rrc=0
    timeout 120 env RDMAV_DRIVERS="$work/libuverbs_rxe" UVERBS_PROVIDER_VERBOSE=1 DROPIN_STRICT=1 "$work/$name" $args \
        >"$work/rust.txt" 2>"$work/rust_stderr.out" || rrc=$?
    if [ "$name" = dropin_mcast ]; then
        wire_down >/dev/null 2>&1 || true
        wired=0
    fi
    # Lines where rdma-core v44 does not do what its man pages say (bugs, most fixed upstream
    # since) are not compared; the program checks them itself on the drop-in (DROPIN_STRICT).
    grep -v "^v44-differs: " "$work/c.txt" >"$work/c.cmp" || true
    grep -v "^v44-differs: " "$work/rust.txt" >"$work/rust.cmp" || true
    if [ $crc -ne 0 ] || ! grep -q "^$name: OK" "$work/c.txt"; then
        cp "$work/c.txt" "$work/c_stdout.out"
        fail "$name: the reference run on the C provider failed (rc=$crc)"
    elif [ $rrc -ne 0 ] || ! grep -q "^uverbs_rxe: opened ${args%% *}" "$work/rust_stderr.out"; then
        cp "$work/rust.txt" "$work/rust_stdout.out"
        fail "$name: the run on the drop-in failed (rc=$rrc)"
    elif ! cmp -s "$work/c.cmp" "$work/rust.cmp"; then
        diff "$work/c.cmp" "$work/rust.cmp" >"$work/diff.out" || true
        fail "$name: the drop-in printed other results than the C provider"
    else
        known=$(grep -c "^v44-differs: " "$work/c.txt" || true)
        pass "$name: $(($(wc -l <"$work/c.cmp") - 1)) results identical on the C provider and the drop-in$(
            [ "$known" -eq 0 ] || echo " ($known more where rdma-core v44 has a bug, checked correct on the drop-in)")"
    fi
done

echo "libibverbs_dropin_verbs: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
