#!/bin/sh
# The drop-in provider (dropin/libibverbs) against rdma-core's C siw provider, through
# librdmacm: unmodified librdmacm programs (rping, ucmatose, rdma_server/rdma_client) connect
# over soft-iWARP (siw0 on 169.254.78.1), where a QP reaches RTS only through the connection
# manager. Each program runs as server and client once with both sides on the C provider (the
# reference), then with both on the drop-in, then each side on one provider; every run's
# output, per role, must be identical to the reference's, and every drop-in side must show
# that the drop-in drove siw0. Runs under xtask/guest/with_siw.sh (it re-runs itself there
# when UVERBS_SIW_ADDR is not set): `cargo xtask guest -- 'sh tests/guest/libibverbs_dropin_siw.sh'`
# after `cargo build -p uverbs-libibverbs`. One PASS or FAIL line per check; the last line
# counts them.
set -eu

if [ -z "${UVERBS_SIW_ADDR:-}" ]; then
    exec sh "${UVERBS_PROJECT:-$PWD}/xtask/guest/with_siw.sh" sh "$0" "$@"
fi

dev=siw0
addr=$UVERBS_SIW_ADDR
suite=libibverbs_dropin_siw
log_exts="out err diff"
. "$(dirname "$0")/lib/dropin.sh"

# Whether stderr file $1 shows the drop-in drove siw0.
rust_ran() { grep -q "^uverbs_rxe: claiming $dev .* for the Rust siw provider" "$1" \
    && grep -q "^uverbs_rxe: opened $dev" "$1"; }

# run NAME TAG SERVER_ENV CLIENT_ENV PORT "SERVER_CMD" "CLIENT_CMD": runs both roles, keeps
# their stdout as $work/TAG.server.txt and $work/TAG.client.txt; passes when both exit 0 and
# each drop-in side shows it drove siw0.
run() {
    name=$1 tag=$2 senv=$3 cenv=$4 port=$5 scmd=$6 ccmd=$7
    rm -f "$work"/*.out "$work"/*.err "$work"/*.diff
    # shellcheck disable=SC2086
    timeout 120 $senv $scmd >"$work/$tag.server.txt" 2>"$work/server.err" &
    spid=$!
    wait_port "$port"
    crc=0
    # shellcheck disable=SC2086
    timeout 120 $cenv $ccmd >"$work/$tag.client.txt" 2>"$work/client.err" || crc=$?
    src=0
    wait "$spid" || src=$?
    cp "$work/$tag.server.txt" "$work/server.out"
    cp "$work/$tag.client.txt" "$work/client.out"
    ok=1
    [ "$src" -eq 0 ] && [ "$crc" -eq 0 ] || ok=0
    if [ "$senv" = "$RUST" ] && ! rust_ran "$work/server.err"; then ok=0; fi
    if [ "$cenv" = "$RUST" ] && ! rust_ran "$work/client.err"; then ok=0; fi
    if [ $ok -eq 1 ]; then
        pass "$name runs (server rc=$src, client rc=$crc)"
    else
        fail "$name runs (server rc=$src, client rc=$crc)"
    fi
}

# same NAME REF TAG: each role's output of run TAG is identical to that of run REF.
same() {
    name=$1 ref=$2 tag=$3
    rm -f "$work"/*.out "$work"/*.err "$work"/*.diff
    ok=1
    # The reference must have printed something to compare with.
    if [ ! -s "$work/$ref.server.txt" ] && [ ! -s "$work/$ref.client.txt" ]; then
        echo "the reference printed nothing" >"$work/reference.out"
        ok=0
    fi
    for role in server client; do
        if ! cmp -s "$work/$ref.$role.txt" "$work/$tag.$role.txt"; then
            diff "$work/$ref.$role.txt" "$work/$tag.$role.txt" >"$work/$role.diff" || true
            ok=0
        fi
    done
    if [ $ok -eq 1 ]; then
        pass "$name: output identical to the C provider's ($(wc -l <"$work/$tag.server.txt") server, $(wc -l <"$work/$tag.client.txt") client lines)"
    else
        fail "$name: output identical to the C provider's"
    fi
}

# compare NAME PORT "SERVER_CMD" "CLIENT_CMD": the reference run on the C provider, then the
# drop-in on both sides and on each side alone, each compared with the reference.
# (sh has no local variables: each function's names are its own.)
compare() {
    c_name=$1 c_port=$2 c_scmd=$3 c_ccmd=$4
    c_tag=$(echo "$c_name" | tr -c 'a-zA-Z0-9\n' _)
    run "$c_name, C <-> C (reference)" "$c_tag.c" "$C" "$C" "$c_port" "$c_scmd" "$c_ccmd"
    run "$c_name, Rust <-> Rust" "$c_tag.rust" "$RUST" "$RUST" "$c_port" "$c_scmd" "$c_ccmd"
    same "$c_name, Rust <-> Rust" "$c_tag.c" "$c_tag.rust"
    run "$c_name, Rust server <-> C client" "$c_tag.rs" "$RUST" "$C" "$c_port" "$c_scmd" "$c_ccmd"
    same "$c_name, Rust server <-> C client" "$c_tag.c" "$c_tag.rs"
    run "$c_name, C server <-> Rust client" "$c_tag.rc" "$C" "$RUST" "$c_port" "$c_scmd" "$c_ccmd"
    same "$c_name, C server <-> Rust client" "$c_tag.c" "$c_tag.rc"
}

# 1. The device as libibverbs lists and describes it.
rm -f "$work"/*.out
ibv_devinfo -v -d $dev >"$work/devinfo.c.txt" 2>&1
if timeout 60 $RUST ibv_devinfo -v -d $dev >"$work/devinfo.rust.txt" 2>"$work/devinfo.err" \
    && rust_ran "$work/devinfo.err" && cmp -s "$work/devinfo.c.txt" "$work/devinfo.rust.txt"; then
    pass "ibv_devinfo -v -d $dev output identical to the C provider's"
else
    diff "$work/devinfo.c.txt" "$work/devinfo.rust.txt" >"$work/devinfo.diff" || true
    fail "ibv_devinfo -v -d $dev output identical to the C provider's"
fi

# 2. rping: sends, RDMA reads and writes of every ping (-v prints each ping's data).
compare "rping -v -C 20" 7174 "rping -s -v -V -C 20 -a $addr -p 7174" "rping -c -v -V -C 20 -a $addr -p 7174"
compare "rping -v -C 5 -S 4096" 7174 \
    "rping -s -v -V -C 5 -S 4096 -a $addr -p 7174" "rping -c -v -V -C 5 -S 4096 -a $addr -p 7174"

# 3. ucmatose: several connections at once, sends both ways, disconnects.
compare "ucmatose -c 4 -C 50" 7471 "ucmatose -c 4 -C 50 -p 7471 -b $addr" "ucmatose -c 4 -C 50 -p 7471 -s $addr"

# 4. rdma_server / rdma_client: librdmacm's synchronous endpoint calls (rdma_create_ep,
#    rdma_post_send/recv, rdma_get_send_comp).
compare "rdma_server/rdma_client" 7472 "rdma_server -s $addr -p 7472" "rdma_client -s $addr -p 7472"

echo "libibverbs_dropin_siw: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
