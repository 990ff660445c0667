#!/bin/sh
# hyper over uverbs::stream: examples/stream_hyper.rs (an unmodified hyper HTTP/1.1 server and
# client on one RdmaStream, through hyper-util's TokioIo) on the address of the guest's rxe_cm
# device ($UVERBS_CM_ADDR); the client checks every byte of every answer.
#
# Runs in the test guest (`cargo xtask test`, or
# `cargo xtask guest -- 'sh tests/guest/stream_hyper.sh'`) after
# `cargo build -p uverbs --examples`.
set -eu

target=${UVERBS_TARGET_DIR:-$PWD/target}
bin=$target/debug/examples/stream_hyper
addr=${UVERBS_CM_ADDR:-}
if [ -z "$addr" ]; then
    echo "FAIL: UVERBS_CM_ADDR is not set (the test guest sets it to rxe_cm's address)"
    exit 1
fi
if [ ! -x "$bin" ]; then
    echo "FAIL: $bin is missing: run 'cargo build -p uverbs --examples' first"
    exit 1
fi
timeout 300 "$bin" "$addr:7790" 24
