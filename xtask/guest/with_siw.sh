# Runs a command (a siw test binary, from `cargo xtask test`) with a soft-iWARP device:
# adds the dummy netdev uvsiw0 (169.254.78.1/24) and `siw0` on it, runs the command with
# UVERBS_TEST_DEVICE=siw0 and UVERBS_SIW_ADDR set (and UVERBS_CM_ADDR to the same address, so
# that tests written for the rxe suite connect over siw), then removes both again, so that the items
# after it see the rxe devices only. siw.ko was loaded by xtask/guest/siw.sh.
set -u
if [ -z "${UVERBS_SIW_LOADED:-}" ]; then
    echo "with_siw.sh: siw.ko is not loaded in this guest (xtask printed why at boot)" >&2
    exit 1
fi
out=$({ ip link add uvsiw0 type dummy && ip addr add 169.254.78.1/24 dev uvsiw0 && ip link set uvsiw0 up; } 2>&1) || {
    echo "with_siw.sh: setting up the dummy netdev uvsiw0 failed: $out" >&2
    exit 1
}
out=$(rdma link add siw0 type siw netdev uvsiw0 2>&1) || {
    echo "with_siw.sh: rdma link add siw0 type siw netdev uvsiw0 failed: $out" >&2
    ip link del uvsiw0
    exit 1
}
n=0
until [ -e /sys/class/infiniband/siw0 ]; do
    n=$((n + 1))
    if [ $n -ge 500 ]; then
        echo "with_siw.sh: siw0 did not appear within 5 s" >&2
        exit 1
    fi
    sleep 0.01
done
echo "with_siw.sh: siw0 on uvsiw0 (169.254.78.1): $(rdma link show siw0/1 2>&1)"
UVERBS_TEST_DEVICE=siw0 UVERBS_SIW_ADDR=169.254.78.1 UVERBS_CM_ADDR=169.254.78.1 "$@"
rc=$?
rdma link delete siw0 || rc=1
ip link del uvsiw0 || rc=1
exit $rc
