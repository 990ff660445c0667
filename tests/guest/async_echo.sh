#!/bin/sh
# Runs examples/async_echo in the guest: a tokio echo service over the RDMA connection manager
# with safe posting only, 4 clients x 2,000 messages of 1 B to 64 KiB written back by RDMA
# write into each client's advertised region, every byte checked.
set -eu
out=$(timeout 580 "$UVERBS_TARGET_DIR/debug/examples/async_echo")
echo "$out"
echo "$out" | grep -q "4 clients x 2000 messages"
