# The set-up shared by the drop-in provider's guest scripts (tests/guest/libibverbs_dropin.sh,
# libibverbs_dropin_siw.sh), which source it: `. "$(dirname "$0")/lib/dropin.sh"`. Not run by
# itself (not executable, and not directly in tests/guest/, so `cargo xtask test` does not take
# it for a script).
#
# The sourcing script sets, before sourcing it:
#   dev       the device the drop-in is to drive (rxe0, siw0)
#   suite     its own name, for the count line it prints when the provider is missing
#   log_exts  optional: the extensions of the logs in $work that `fail` shows (default: out)
# Without the provider (target/debug/libuverbs_rxe.so, or under $UVERBS_TARGET_DIR) it prints
# FAIL and the count line, and exits. Otherwise it makes the folder $work (removed on exit)
# with the provider linked in as libibverbs loads it, and sets RUST and C (the prefixes that
# run a program on the drop-in or on rdma-core's C provider), passed=0 and failed=0, and the
# functions pass, fail and wait_port.

: "${log_exts:=out}"

target=${UVERBS_TARGET_DIR:-target}
lib="$target/debug/libuverbs_rxe.so"
passed=0
failed=0

if [ ! -f "$lib" ]; then
    echo "FAIL provider not built: $lib is missing (run: cargo build -p uverbs-libibverbs)"
    echo "$suite: 0 passed, 1 failed"
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# libibverbs loads `<path>-rdmav34.so` for an absolute RDMAV_DRIVERS entry `<path>`.
ln -s "$(cd "$(dirname "$lib")" && pwd)/libuverbs_rxe.so" "$work/libuverbs_rxe-rdmav34.so"
RUST="env RDMAV_DRIVERS=$work/libuverbs_rxe UVERBS_PROVIDER_VERBOSE=1"
C="env"

# pass WHAT, fail WHAT: one PASS or FAIL line, counted; fail also shows the end of each log in
# $work with one of the extensions $log_exts.
pass() { passed=$((passed + 1)); echo "PASS $*"; }
fail() {
    failed=$((failed + 1))
    echo "FAIL $*"
    for ext in $log_exts; do
        for f in "$work"/*."$ext"; do
            [ -f "$f" ] || continue
            echo "---- $(basename "$f")"
            tail -n 15 "$f"
        done
    done
}

# Waits (up to 20 s) for a server to listen on TCP port $1 (siw, too, listens on a kernel TCP
# socket).
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
