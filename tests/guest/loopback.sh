#!/bin/sh
# Runs examples/loopback in the guest: the README's example, two QPs on one device moving one
# message.
set -eu
out=$(timeout 60 "$UVERBS_TARGET_DIR/debug/examples/loopback")
echo "$out"
[ "$out" = 'received "hello" with immediate 7' ]
