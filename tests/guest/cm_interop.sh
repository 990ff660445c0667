#!/bin/sh
# RDMA CM interop: examples/cm_hello.rs (Rust, uverbs::cm, no librdmacm) with rdma-core's
# librdmacm examples rdma_server and rdma_client (rdmacm-utils): C server + Rust client, Rust
# server + C client, and Rust + Rust, on the address of the guest's rxe_cm device
# ($UVERBS_CM_ADDR, a dummy netdev: the CM cannot use loopback addresses).
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/cm_interop.sh'`) after
# `cargo build -p uverbs --examples`. Exits non-zero if any pairing fails.
set -eu

target=${UVERBS_TARGET_DIR:-$PWD/target}
rust=$target/debug/examples/cm_hello
addr=${UVERBS_CM_ADDR:-}

if [ -z "$addr" ]; then
    echo "FAIL: UVERBS_CM_ADDR is not set (the test guest sets it to rxe_cm's address)"
    exit 1
fi
# A pairing takes seconds: fail fast.
pair_seconds=60 listen_seconds=30
. "$(dirname "$0")/lib/pairs.sh"
need_examples "$rust"
need_commands rdma_server rdma_client

pair "rdma_server (C) <- cm_hello client (Rust)" 7481 \
    "rdma_server -s $addr -p 7481" "$rust client $addr:7481" || true
pair "cm_hello server (Rust) <- rdma_client (C)" 7482 \
    "$rust server $addr:7482" "rdma_client -s $addr -p 7482" || true
pair "cm_hello server (Rust) <- cm_hello client (Rust)" 7483 \
    "$rust server $addr:7483" "$rust client $addr:7483" || true

# rdma_client reports failures only in its output, not always in its exit status.
if grep -q "rdma_client: end -\|rdma_server: end -" "$logs"/* 2>/dev/null; then
    echo "FAIL: a C program reported an error"
    failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] || exit 1
echo "cm_interop: all 3 pairings passed"
