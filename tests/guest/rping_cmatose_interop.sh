#!/bin/sh
# rping and cmatose interop: examples/rping.rs and examples/cmatose.rs (Rust, uverbs::cm, no
# librdmacm) against rdma-core's unmodified `rping` and `ucmatose` (rdmacm-utils), each role
# both ways, on the address of the guest's rxe_cm device ($UVERBS_CM_ADDR, a dummy netdev: the
# CM cannot use loopback addresses).
#
# rping, at the default 64 bytes and at 5000: C with C first, for the reference output; then
# Rust server <- C client, C server <- Rust client, Rust with Rust, each `-C 10 -v -V` (the
# client checks every echo) and each side's `-v` lines compared with the reference: the
# client's `ping data: ...` lines and the server's `server ping data: ...` lines must be
# exactly the C programs' own.
# cmatose: Rust server <- ucmatose client, ucmatose server <- Rust client, Rust with Rust, each
# `-c 4 -C 50`; both ends must report `return status 0`, and each Rust side must print the
# very lines ucmatose prints in its role; then the C/Rust pairings with ucmatose's -t and -a.
# Then the C/Rust pairings of both again across the veth pair of tests/two_hosts.rs.
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/rping_cmatose_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

target=${UVERBS_TARGET_DIR:-$PWD/target}
rping=$target/debug/examples/rping
cmatose=$target/debug/examples/cmatose
addr=${UVERBS_CM_ADDR:-}

if [ -z "$addr" ]; then
    echo "FAIL: UVERBS_CM_ADDR is not set (the test guest sets it to rxe_cm's address)"
    exit 1
fi
for b in "$rping" "$cmatose"; do
    if [ ! -x "$b" ]; then
        echo "FAIL: $b is missing: run 'cargo build -p uverbs --examples' first"
        exit 1
    fi
done
for c in rping ucmatose; do
    if ! command -v $c >/dev/null; then
        echo "FAIL: $c (rdmacm-utils) is not installed"
        exit 1
    fi
done

logs=$(mktemp -d "${TMPDIR:-/tmp}/rping_cmatose.XXXXXX")
trap 'rm -rf "$logs"' EXIT

# Waits (up to 60 s) until an rdma_cm id listens on port $1, while process $2 lives.
wait_listen() {
    n=0
    while [ "$n" -lt 600 ]; do
        if rdma resource show cm_id | grep -q "state LISTEN .*src-addr [^ ]*:$1 "; then
            return 0
        fi
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.1
        n=$((n + 1))
    done
    return 1
}

# Shows a log, each line cut at 120 characters (rping -v prints whole buffers).
show() {
    echo "---- $1:"
    cut -c1-120 "$2" | sed 's/^/    /'
}

failures=0

# pair NAME PORT SERVER_COMMAND CLIENT_COMMAND: runs both, the server first; their stdout
# goes to $logs/PORT.server and $logs/PORT.client, their stderr to the same with `.err` (kept
# apart: the C programs write stdout through a full buffer and stderr at once, so a merged log
# could have an stderr line inside a long stdout line). Returns non-zero (and counts a
# failure) unless both exit 0.
pair() {
    name=$1 port=$2
    slog=$logs/$port.server cl=$logs/$port.client
    : >"$cl"
    : >"$cl.err"
    timeout 240 sh -c "$3" >"$slog" 2>"$slog.err" &
    spid=$!
    crc=0
    if wait_listen "$port" "$spid"; then
        timeout 240 sh -c "$4" >"$cl" 2>"$cl.err" || crc=$?
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

# rping_suite SIZE_ARGS PORT: C with C for the reference, then Rust in each role and Rust with
# Rust (ports PORT to PORT+3), each `-C 10 -v -V` with SIZE_ARGS on both sides.
rping_suite() {
    sz=$1 p=$2
    ping_args="-C 10 -v -V $sz"
    if pair "rping -s (C) <- rping -c (C), the reference ($ping_args)" "$p" \
        "rping -s -a $addr -p $p -v $sz" "rping -c -a $addr -p $p $ping_args"; then
        ref=$logs/ref$p
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

# Each Rust role's `-v` lines are the C program's (those of the reference run $ref).
rping_pair() {
    if pair "$1 ($ping_args)" "$2" "$3" "$4"; then
        client_lines "$logs/$2.client" "$logs/$2.cv"
        server_lines "$logs/$2.server" "$logs/$2.sv"
        same "$1: client's ping data" "$ref.client" "$logs/$2.cv"
        same "$1: server's ping data" "$ref.server" "$logs/$2.sv"
    fi
}

# rping's default 64 bytes, then 5000: RDMA READ and WRITE of several packets (MTU 1024).
rping_suite "" 7491
rping_suite "-S 5000" 7501

# cmatose: both ends report `return status 0`.
cm_args="-c 4 -C 50"
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
cmatose_pair "cmatose server (Rust) <- ucmatose client (C)" 7495 \
    "$cmatose -b $addr -p 7495 $cm_args" "ucmatose -s $addr -p 7495 $cm_args"
cmatose_pair "ucmatose server (C) <- cmatose client (Rust)" 7496 \
    "ucmatose -b $addr -p 7496 $cm_args" "$cmatose -s $addr -p 7496 $cm_args"
cmatose_pair "cmatose server (Rust) <- cmatose client (Rust)" 7497 \
    "$cmatose -b $addr -p 7497 $cm_args" "$cmatose -s $addr -p 7497 $cm_args"
# With ucmatose's -t (the client's type of service) and -a (each side's ACK timeout), set
# through CmOption on the Rust side: both ends report `return status 0` and no option was
# refused (neither prints "option failed").
tos_args="-t 0x68 -a 18"
for port in 7521 7522; do
    if [ "$port" = 7521 ]; then
        name="cmatose server (Rust) -a 16 <- ucmatose client (C) $tos_args"
        server="$cmatose -b $addr -p $port -a 16 $cm_args" client="ucmatose -s $addr -p $port $tos_args $cm_args"
    else
        name="ucmatose server (C) -a 16 <- cmatose client (Rust) $tos_args"
        server="ucmatose -b $addr -p $port -a 16 $cm_args" client="$cmatose -s $addr -p $port $tos_args $cm_args"
    fi
    cmatose_pair "$name" "$port" "$server" "$client"
    if grep -q "option failed" "$logs/$port.server.err" "$logs/$port.client.err"; then
        echo "FAIL: $name: an option was refused"
        failures=$((failures + 1))
    fi
done
# Each Rust role prints what ucmatose prints in that role.
same "cmatose server (Rust): its lines" "$logs/7496.server" "$logs/7495.server"
same "cmatose client (Rust): its lines" "$logs/7495.client" "$logs/7496.client"

# Across a wire: the veth pair of tests/two_hosts.rs, servers on rxe_wb (169.254.30.2), clients
# from rxe_wa (169.254.30.1), every packet leaving uvwa and arriving on uvwb. rping's lines are
# compared with the dummy netdev's reference at the default size (the data does not depend on
# the path).
wa=169.254.30.1 wb=169.254.30.2
veth_down() { sh tests/common/veth_down.sh >/dev/null 2>&1 || true; }
trap 'veth_down; rm -rf "$logs"' EXIT
veth_down
if out=$(sh tests/common/veth_up.sh 2>&1); then
    sent=$(cat /sys/class/net/uvwa/statistics/tx_packets)
    ping_args="-C 10 -v -V" ref=$logs/ref7491
    rping_pair "veth: rping server (Rust) <- rping -c (C)" 7511 \
        "$rping -s -a $wb -p 7511 -v" "rping -c -I $wa -a $wb -p 7511 $ping_args"
    rping_pair "veth: rping -s (C) <- rping client (Rust)" 7512 \
        "rping -s -a $wb -p 7512 -v" "$rping -c -I $wa -a $wb -p 7512 $ping_args"
    cmatose_pair "veth: cmatose server (Rust) <- ucmatose client (C)" 7513 \
        "$cmatose -b $wb -p 7513 $cm_args" "ucmatose -b $wa -s $wb -p 7513 $cm_args"
    cmatose_pair "veth: ucmatose server (C) <- cmatose client (Rust)" 7514 \
        "ucmatose -b $wb -p 7514 $cm_args" "$cmatose -b $wa -s $wb -p 7514 $cm_args"
    crossed=$(($(cat /sys/class/net/uvwa/statistics/tx_packets) - sent))
    # At least the clients' messages: 2 x 10 x 2 (rping), 2 x 4 x 50 (cmatose).
    if [ "$crossed" -ge 440 ]; then
        echo "ok: veth: $crossed packets left uvwa"
    else
        echo "FAIL: veth: only $crossed packets left uvwa: the traffic did not cross the wire"
        failures=$((failures + 1))
    fi
else
    echo "FAIL: setting up the veth pair: $out"
    failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] || exit 1
echo "rping_cmatose_interop: all 17 pairings passed, every output compared"
