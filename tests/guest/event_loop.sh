#!/bin/sh
# Runs examples/event_loop in the guest: completions driven by a mio event loop on the
# completion channel's fd, with no busy polling.
set -eu
out=$(timeout 120 "$UVERBS_TARGET_DIR/debug/examples/event_loop")
echo "$out"
echo "$out" | grep -q "1000 send/receive rounds, 2000 completions"
