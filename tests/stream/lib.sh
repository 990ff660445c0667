# The prelude shared by tests/stream/bench.sh and callgrind.sh, which source it:
# `. "$(dirname "$0")/lib.sh"`. Not run by itself (not executable; `cargo xtask test` runs only
# the executable scripts directly in tests/guest/).
#
# Sets $peer (examples/rstream_peer, release build, under $UVERBS_TARGET_DIR or ./target) and
# $addr ($UVERBS_CM_ADDR, which the test guest sets; without it the script stops), makes the
# folder $work (removed on exit), and defines wait_listen.

target=${UVERBS_TARGET_DIR:-$PWD/target}
peer=$target/release/examples/rstream_peer
addr=${UVERBS_CM_ADDR:?the test guest sets UVERBS_CM_ADDR}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Waits until something listens on port $1: a cm_id ($2 = rdma) or a TCP socket ($2 = tcp).
# Stops the script with FAIL after about a minute.
wait_listen() {
    i=0
    while :; do
        if [ "$2" = rdma ]; then
            rdma resource show cm_id | grep "state LISTEN" | grep -q "src-addr [0-9.]*:$1 " && return
        else
            ss -ltn | grep -q ":$1 " && return
        fi
        i=$((i + 1))
        [ $i -le 600 ] || { echo "FAIL: nothing listens on port $1" >&2; exit 1; }
        sleep 0.1
    done
}
