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
. "$(dirname "$0")/lib/pairs.sh"
need_examples "$rping" "$cmatose"
need_commands rping ucmatose

# rping's default 64 bytes, then 5000: RDMA READ and WRITE of several packets (MTU 1024).
rping_suite "" 7491
rping_suite "-S 5000" 7501

# cmatose: both ends report `return status 0`.
cm_args="-c 4 -C 50"
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
