#!/bin/sh
# RDMA CM interop over soft-iWARP: the Rust examples (uverbs::cm and the siw provider, no
# librdmacm) against rdma-core's unmodified C tools (librdmacm and rdma-core's C siw provider),
# every role, on siw0 (xtask/guest/with_siw.sh adds it on a dummy netdev; this script re-runs
# itself under it when UVERBS_SIW_ADDR is not set).
#
# rping (examples/rping.rs): C with C for the reference, then Rust server <- C client, C server
# <- Rust client, Rust with Rust, each `-C 10 -v -V`, at the default 64 bytes and at 5000 (RDMA
# READ and WRITE of several segments); each side's `-v` lines must be exactly the C programs'.
# cmatose (examples/cmatose.rs) with ucmatose, `-c 4 -C 50`, each role: both ends report
# `return status 0`. cm_hello (examples/cm_hello.rs) with librdmacm's rdma_server/rdma_client,
# each role.
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/siw_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

if [ -z "${UVERBS_SIW_ADDR:-}" ]; then
    exec sh "${UVERBS_PROJECT:-$PWD}/xtask/guest/with_siw.sh" sh "$0" "$@"
fi

target=${UVERBS_TARGET_DIR:-$PWD/target}
rping=$target/debug/examples/rping
cmatose=$target/debug/examples/cmatose
hello=$target/debug/examples/cm_hello
addr=$UVERBS_SIW_ADDR

. "$(dirname "$0")/lib/pairs.sh"
need_examples "$rping" "$cmatose" "$hello"
need_commands rping ucmatose rdma_server rdma_client

rping_suite "" 7631
rping_suite "-S 5000" 7641

cm_args="-c 4 -C 50"
cmatose_pair "cmatose server (Rust) <- ucmatose client (C)" 7651 \
    "$cmatose -b $addr -p 7651 $cm_args" "ucmatose -s $addr -p 7651 $cm_args"
cmatose_pair "ucmatose server (C) <- cmatose client (Rust)" 7652 \
    "ucmatose -b $addr -p 7652 $cm_args" "$cmatose -s $addr -p 7652 $cm_args"
cmatose_pair "cmatose server (Rust) <- cmatose client (Rust)" 7653 \
    "$cmatose -b $addr -p 7653 $cm_args" "$cmatose -s $addr -p 7653 $cm_args"

pair "rdma_server (C) <- cm_hello client (Rust)" 7661 \
    "rdma_server -s $addr -p 7661" "$hello client $addr:7661" || true
pair "cm_hello server (Rust) <- rdma_client (C)" 7662 \
    "$hello server $addr:7662" "rdma_client -s $addr -p 7662" || true
pair "cm_hello server (Rust) <- cm_hello client (Rust)" 7663 \
    "$hello server $addr:7663" "$hello client $addr:7663" || true
# rdma_client and rdma_server report failures only in their output, not always in their status.
if grep -q "rdma_client: end -\|rdma_server: end -" "$logs"/766* 2>/dev/null; then
    echo "FAIL: a C program reported an error"
    failures=$((failures + 1))
fi

[ "$failures" -eq 0 ] || exit 1
echo "siw_interop: all 14 pairings passed over siw, every rping output compared"
