# Pairings of an RDMA CM server and client for the guest's interop scripts
# (tests/guest/cm_interop.sh, rping_cmatose_interop.sh, siw_interop.sh), which source it:
# `. "$(dirname "$0")/lib/pairs.sh"`. Not run by itself (not executable, and not directly in
# tests/guest/, so `cargo xtask test` does not take it for a script).
#
# It creates the log directory $logs (removed on exit) and sets failures=0; each pairing that
# fails adds one. The sourcing script may set, before sourcing it:
#   pair_seconds    each command's time limit (default 240)
#   listen_seconds  how long a server may take to listen (default 60)
# and, before rping_suite / rping_pair: $rping (examples/rping) and $addr (the server address).

: "${pair_seconds:=240}" "${listen_seconds:=60}"

. "$(dirname "$0")/lib/poll.sh"

logs=$(mktemp -d "${TMPDIR:-/tmp}/$(basename "$0" .sh).XXXXXX")
trap 'rm -rf "$logs"' EXIT
failures=0

# need_examples PATH...: each example is built, else FAIL and exit.
need_examples() {
    for b in "$@"; do
        if [ ! -x "$b" ]; then
            echo "FAIL: $b is missing: run 'cargo build -p uverbs --examples' first"
            exit 1
        fi
    done
}

# need_commands NAME...: each of rdmacm-utils' programs is installed, else FAIL and exit.
need_commands() {
    for c in "$@"; do
        if ! command -v "$c" >/dev/null; then
            echo "FAIL: $c (rdmacm-utils) is not installed"
            exit 1
        fi
    done
}

# Whether an rdma_cm id listens on port $1.
cm_listens() { rdma resource show cm_id | grep -q "state LISTEN .*src-addr [^ ]*:$1 "; }

# Waits (up to $listen_seconds) until an rdma_cm id listens on port $1, while process $2 lives.
wait_listen() { poll_until "$listen_seconds" "$2" cm_listens "$1"; }

# Shows a log, each line cut at 120 characters (rping -v prints whole buffers).
show() {
    echo "---- $1:"
    cut -c1-120 "$2" | sed 's/^/    /'
}

# pair NAME PORT SERVER_COMMAND CLIENT_COMMAND: runs both, the server first; their stdout
# goes to $logs/PORT.server and $logs/PORT.client, their stderr to the same with `.err` (kept
# apart: the C programs write stdout through a full buffer and stderr at once, so a merged log
# could have an stderr line inside a long stdout line). Shows every log that is not empty.
# Returns non-zero (and counts a failure) unless both exit 0.
pair() {
    name=$1 port=$2
    slog=$logs/$port.server cl=$logs/$port.client
    : >"$cl"
    : >"$cl.err"
    timeout "$pair_seconds" sh -c "$3" >"$slog" 2>"$slog.err" &
    spid=$!
    crc=0
    if wait_listen "$port" "$spid"; then
        timeout "$pair_seconds" sh -c "$4" >"$cl" 2>"$cl.err" || crc=$?
    else
        echo "server never listened on port $port" >"$cl.err"
        crc=1
    fi
    src=0
    wait "$spid" || src=$?
    ok=0
    if [ "$src" -eq 0 ] && [ "$crc" -eq 0 ]; then
        echo "ok: $name"
    else
        echo "FAIL: $name (server exit $src, client exit $crc)"
        failures=$((failures + 1))
        ok=1
    fi
    for f in "$slog" "$slog.err" "$cl" "$cl.err"; do
        if [ -s "$f" ]; then
            show "${f#"$logs/$port."}" "$f"
        fi
    done
    return $ok
}

# same WHAT EXPECTED ACTUAL: the two files are equal (a failure counted if not).
same() {
    if cmp -s "$2" "$3"; then
        echo "ok: $1 ($(wc -l <"$3") lines, as the C program's)"
    else
        echo "FAIL: $1 differs from the C program's: $(cmp "$2" "$3" 2>&1 || true)"
        diff "$2" "$3" | cut -c1-120 | sed 's/^/    /' || true
        failures=$((failures + 1))
    fi
}

# The `-v` lines of a log: the client's (`ping data: ...`) or the server's.
client_lines() { grep '^ping data: ' "$1" >"$2" || true; }
server_lines() { grep '^server ping data: ' "$1" >"$2" || true; }

# rping_pair NAME PORT SERVER_COMMAND CLIENT_COMMAND: a pair whose `-v` lines on each side
# are the C programs' (those of the reference run $ref; $ping_args names the run).
rping_pair() {
    if pair "$1 ($ping_args)" "$2" "$3" "$4"; then
        client_lines "$logs/$2.client" "$logs/$2.cv"
        server_lines "$logs/$2.server" "$logs/$2.sv"
        same "$1: client's ping data" "$ref.client" "$logs/$2.cv"
        same "$1: server's ping data" "$ref.server" "$logs/$2.sv"
    fi
}

# rping_suite SIZE_ARGS PORT: C with C for the reference (kept as $logs/refPORT.client and
# .server), then Rust in each role and Rust with Rust (ports PORT to PORT+3), each
# `-C 10 -v -V` with SIZE_ARGS on both sides.
rping_suite() {
    sz=$1 p=$2
    ping_args="-C 10 -v -V $sz"
    ref=$logs/ref$p
    if pair "rping -s (C) <- rping -c (C), the reference ($ping_args)" "$p" \
        "rping -s -a $addr -p $p -v $sz" "rping -c -a $addr -p $p $ping_args"; then
        client_lines "$logs/$p.client" "$ref.client"
        server_lines "$logs/$p.server" "$ref.server"
        if [ "$(wc -l <"$ref.client")" -ne 10 ] || [ "$(wc -l <"$ref.server")" -ne 10 ]; then
            echo "FAIL: the C reference did not print 10 pings on each side"
            failures=$((failures + 1))
        fi
    else
        echo "FAIL: no reference output; the rping comparisons ($ping_args) cannot run"
        return
    fi
    rping_pair "rping server (Rust) <- rping -c (C)" $((p + 1)) \
        "$rping -s -a $addr -p $((p + 1)) -v $sz" "rping -c -a $addr -p $((p + 1)) $ping_args"
    rping_pair "rping -s (C) <- rping client (Rust)" $((p + 2)) \
        "rping -s -a $addr -p $((p + 2)) -v $sz" "$rping -c -a $addr -p $((p + 2)) $ping_args"
    rping_pair "rping server (Rust) <- rping client (Rust)" $((p + 3)) \
        "$rping -s -a $addr -p $((p + 3)) -v $sz" "$rping -c -a $addr -p $((p + 3)) $ping_args"
}

# cmatose_pair NAME PORT SERVER_COMMAND CLIENT_COMMAND: a pair where both ends report
# `return status 0`.
cmatose_pair() {
    if pair "$1" "$2" "$3" "$4"; then
        for side in server client; do
            if ! grep -qx "return status 0" "$logs/$2.$side"; then
                echo "FAIL: $1: the $side did not report 'return status 0'"
                failures=$((failures + 1))
            fi
        done
    fi
}
