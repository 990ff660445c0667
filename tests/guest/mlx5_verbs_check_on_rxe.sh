#!/bin/sh
# tests/mlx5/verbs_check.c on the real rdma_rxe driver (rdma-core's C librxe), in one process
# and in two processes: the reference run that keeps the mlx5 model's check program honest
# against a real kernel (docs/mlx5-model.md). Needs cc and libibverbs-dev, as the drop-in test.
set -eu

dev=rxe0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! cc -O2 -Wall -Werror -o "$work/verbs_check" tests/mlx5/verbs_check.c -libverbs >"$work/cc.out" 2>&1; then
    cat "$work/cc.out"
    echo "FAIL tests/mlx5/verbs_check.c does not compile"
    exit 1
fi
# rxe on lo: the IPv4-mapped GID of 127.0.0.1 (index 1 in this guest; looked up, not assumed).
gid=$(ibv_devinfo -v -d $dev | sed -n 's/.*GID\[ *\([0-9]*\)\]:[[:space:]]*::ffff:127\.0\.0\.1.*/\1/p' | head -n 1)
if [ -z "$gid" ]; then
    echo "FAIL $dev has no ::ffff:127.0.0.1 GID"
    exit 1
fi

rc=0
echo "---- one process"
timeout 120 "$work/verbs_check" -d $dev -g "$gid" || rc=1
echo "---- two processes"
port=18610
timeout 120 "$work/verbs_check" -d $dev -g "$gid" -S -p $port &
server=$!
timeout 120 "$work/verbs_check" -d $dev -g "$gid" -p $port 127.0.0.1 || rc=1
wait $server || { echo "FAIL the verbs_check server exited $?"; rc=1; }
exit $rc
