#!/bin/sh
# The Rust rxe provider (providers/rxe/libibverbs) as a drop-in for rdma-core's C one:
# unmodified Debian binaries (ibverbs-utils, perftest) run on it, alone and against the C
# provider. Needs an rxe device (the test guest has rxe0 on lo, GID 1 = ::ffff:127.0.0.1) and
# the provider built beforehand:  cargo build -p uverbs-rxe-libibverbs
# Each check prints one PASS/FAIL/KNOWN line; the last line counts them.
set -eu

target=${UVERBS_TARGET_DIR:-target}
lib="$target/debug/libuverbs_rxe.so"
dev=rxe0
passed=0
failed=0
known=0

if [ ! -f "$lib" ]; then
    echo "FAIL provider not built: $lib is missing (run: cargo build -p uverbs-rxe-libibverbs)"
    echo "libibverbs_dropin: 0 passed, 1 failed"
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# libibverbs loads `<path>-rdmav34.so` for an absolute RDMAV_DRIVERS entry `<path>`.
ln -s "$(cd "$(dirname "$lib")" && pwd)/libuverbs_rxe.so" "$work/libuverbs_rxe-rdmav34.so"
RUST="env RDMAV_DRIVERS=$work/libuverbs_rxe UVERBS_PROVIDER_VERBOSE=1"
C="env"

pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() {
    failed=$((failed + 1))
    echo "FAIL $*"
    for f in "$work"/*.out; do
        [ -f "$f" ] || continue
        echo "---- $(basename "$f")"
        tail -n 15 "$f"
    done
}

# Waits (up to 20 s) for a server to listen on TCP port $1.
wait_port() {
    i=0
    while [ $i -lt 100 ]; do
        if command -v ss >/dev/null 2>&1; then
            ss -ltn 2>/dev/null | grep -q ":$1 " && return 0
        else
            [ $i -ge 10 ] && return 0
        fi
        sleep 0.2
        i=$((i + 1))
    done
    return 0
}

# Whether output file $1 shows the Rust provider drove the device.
rust_ran() { grep -q "^uverbs_rxe: opened $dev" "$1"; }

# pair NAME SERVER_ENV CLIENT_ENV PORT CMD...: runs CMD as server and `CMD localhost` as
# client; passes when both exit 0 and each Rust side says it opened the device.
pair() {
    name=$1 senv=$2 cenv=$3 port=$4
    shift 4
    rm -f "$work"/*.out
    # shellcheck disable=SC2086
    timeout 120 $senv "$@" >"$work/server.out" 2>&1 &
    spid=$!
    wait_port "$port"
    crc=0
    # shellcheck disable=SC2086
    timeout 120 $cenv "$@" localhost >"$work/client.out" 2>&1 || crc=$?
    src=0
    wait "$spid" || src=$?
    ok=1
    [ "$src" -eq 0 ] && [ "$crc" -eq 0 ] || ok=0
    if [ "$senv" = "$RUST" ] && ! rust_ran "$work/server.out"; then ok=0; fi
    if [ "$cenv" = "$RUST" ] && ! rust_ran "$work/client.out"; then ok=0; fi
    if [ $ok -eq 1 ]; then
        pass "$name"
    else
        fail "$name (server rc=$src, client rc=$crc)"
    fi
}

# 1. Loading, registering, matching.
if $RUST ibv_devices >"$work/rust.out" 2>"$work/rust.err" \
    && grep -q "^uverbs_rxe: loaded: " "$work/rust.err" \
    && grep -q "^uverbs_rxe: claiming $dev " "$work/rust.err"; then
    pass "provider loads, registers (IBVERBS_PRIVATE_34) and claims $dev"
else
    cat "$work/rust.err" >"$work/stderr.out"
    fail "provider loads, registers and claims $dev"
fi
ibv_devices >"$work/c.out" 2>&1
if cmp -s "$work/c.out" "$work/rust.out"; then
    pass "ibv_devices output identical to the C provider's"
else
    diff "$work/c.out" "$work/rust.out" >"$work/diff.out" || true
    fail "ibv_devices output identical to the C provider's"
fi

# 2. ibv_devinfo -v: every device, port and GID attribute as the C provider reports them.
rm -f "$work"/*.out
ibv_devinfo -v -d $dev >"$work/c.txt" 2>&1
if timeout 60 $RUST ibv_devinfo -v -d $dev >"$work/rust.txt" 2>"$work/rust.err" \
    && rust_ran "$work/rust.err" && cmp -s "$work/c.txt" "$work/rust.txt"; then
    pass "ibv_devinfo -v output identical to the C provider's"
else
    diff "$work/c.txt" "$work/rust.txt" >"$work/diff.out" || true
    cp "$work/rust.err" "$work/stderr.out"
    fail "ibv_devinfo -v output identical to the C provider's"
fi

# 3. RC ping-pong: both sides Rust, and against the C provider either way round.
pp="-g 1 -d $dev"
pair "ibv_rc_pingpong -n 10000, Rust <-> Rust" "$RUST" "$RUST" 18515 ibv_rc_pingpong $pp -n 10000
pair "ibv_rc_pingpong -n 10000, Rust server <-> C client" "$RUST" "$C" 18515 ibv_rc_pingpong $pp -n 10000
pair "ibv_rc_pingpong -n 10000, C server <-> Rust client" "$C" "$RUST" 18515 ibv_rc_pingpong $pp -n 10000

# 4. The other transports and SRQs.
pair "ibv_uc_pingpong -n 1000, Rust <-> Rust" "$RUST" "$RUST" 18515 ibv_uc_pingpong $pp -n 1000
pair "ibv_uc_pingpong -n 1000, Rust server <-> C client" "$RUST" "$C" 18515 ibv_uc_pingpong $pp -n 1000
pair "ibv_ud_pingpong -n 1000, Rust <-> Rust" "$RUST" "$RUST" 18515 ibv_ud_pingpong $pp -n 1000
pair "ibv_ud_pingpong -n 1000, C server <-> Rust client" "$C" "$RUST" 18515 ibv_ud_pingpong $pp -n 1000
pair "ibv_srq_pingpong -n 1000, Rust <-> Rust" "$RUST" "$RUST" 18515 ibv_srq_pingpong $pp -n 1000
pair "ibv_srq_pingpong -n 1000, Rust server <-> C client" "$RUST" "$C" 18515 ibv_srq_pingpong $pp -n 1000

# 5. perftest, both sides Rust (loopback over GID 1).
pt="-d $dev -x 1 -n 500"
for t in ib_send_lat ib_write_lat ib_read_lat ib_atomic_lat ib_send_bw ib_write_bw ib_read_bw; do
    pair "$t (RC), Rust <-> Rust" "$RUST" "$RUST" 18515 $t $pt
done
pair "ib_send_bw -c UC, Rust <-> Rust" "$RUST" "$RUST" 18515 ib_send_bw $pt -c UC
pair "ib_send_bw -c UD, Rust <-> Rust" "$RUST" "$RUST" 18515 ib_send_bw $pt -c UD
pair "ib_send_bw --use-srq, Rust <-> Rust" "$RUST" "$RUST" 18515 ib_send_bw $pt --use-srq
pair "ib_write_bw, Rust server <-> C client" "$RUST" "$C" 18515 ib_write_bw $pt

# 6. Known gap: completion channels (event mode). Must fail cleanly, not crash.
rm -f "$work"/*.out
rc=0
timeout 30 $RUST ibv_rc_pingpong $pp -n 10 -e >"$work/server.out" 2>&1 || rc=$?
if [ $rc -ne 0 ] && grep -q "completion channels are not supported" "$work/server.out"; then
    known=$((known + 1))
    echo "KNOWN ibv_rc_pingpong -e: completion channels not supported yet (fails cleanly, rc=$rc)"
else
    fail "ibv_rc_pingpong -e should fail cleanly while completion channels are unsupported (rc=$rc)"
fi

echo "libibverbs_dropin: $passed passed, $failed failed ($known known gaps)"
[ "$failed" -eq 0 ]
