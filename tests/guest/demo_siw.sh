#!/bin/sh
# examples/demo (the README's first command's demo) on soft-iWARP: on siw0 it connects its two
# RC QPs through the RDMA CM (iWARP QPs reach RTS no other way), moves 20,000 sends with every
# payload checked, an RDMA write and read compared byte for byte, and shows UD refused. Runs
# under xtask/guest/with_siw.sh (it re-runs itself there when UVERBS_SIW_ADDR is not set), in
# `cargo xtask test` or `cargo xtask guest -- 'sh tests/guest/demo_siw.sh'`, after
# `cargo build -p uverbs --examples`.
set -eu

if [ -z "${UVERBS_SIW_ADDR:-}" ]; then
    exec sh "${UVERBS_PROJECT:-$PWD}/xtask/guest/with_siw.sh" sh "$0" "$@"
fi

demo=${UVERBS_TARGET_DIR:-$PWD/target}/debug/examples/demo
if [ ! -x "$demo" ]; then
    echo "demo_siw: $demo is missing (cargo build -p uverbs --examples)" >&2
    exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
timeout 300 "$demo" siw0 "$UVERBS_SIW_ADDR" >"$out" 2>&1 || rc=$?
cat "$out"
failed=0
for want in "^siw0: vendor" "^iWARP: connecting through the RDMA CM at $UVERBS_SIW_ADDR:" \
    "^RC: 20000 sends of 4096 B, every payload checked" "^RC: RDMA write then read of 4096 B: bytes match" \
    "^UD: .*CREATE_QP"; do
    if ! grep -q "$want" "$out"; then
        echo "demo_siw: no line matching '$want'" >&2
        failed=1
    fi
done
if [ "$rc" -ne 0 ] || [ "$failed" -ne 0 ]; then
    echo "demo_siw: FAIL (demo exit status $rc)"
    exit 1
fi
echo "demo_siw: PASS"
