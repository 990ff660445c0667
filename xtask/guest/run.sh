# Body of guest.sh: runs inside the chroot (the host's root filesystem) after
# the header that `cargo xtask` prepends has set UVERBS_RESULTS, UVERBS_PROJECT,
# UVERBS_TARGET_DIR (all exported to the command) and UVERBS_COMMAND.
# Sets up rdma_rxe on lo (rxe0), and for the RDMA CM rdma_ucm and rxe_cm on a dummy netdev
# with 169.254.77.1 (the CM cannot use loopback addresses), then runs the command;
# stdout/stderr go to ttyS0.
set -u
export UVERBS_RESULTS UVERBS_PROJECT UVERBS_TARGET_DIR UVERBS_GUEST=1

note() { echo "uverbs-guest: $*" > /dev/kmsg 2> /dev/null || true; }
die() {
    printf '%s\n' "$*" > "$UVERBS_RESULTS/error"
    note "ERROR: $*"
    echo "uverbs-guest: ERROR: $*" >&2
    exit 1
}

note "setting up rdma_rxe"
out=$(modprobe crc32_generic 2>&1) || die "modprobe crc32_generic failed: $out"
modprobe crc32-pclmul > /dev/null 2>&1 || true
out=$(modprobe rdma_rxe 2>&1) || die "modprobe rdma_rxe failed: $out"
out=$(ip link set lo up 2>&1) || die "ip link set lo up failed: $out"
out=$(rdma link add rxe0 type rxe netdev lo 2>&1) || die "rdma link add rxe0 type rxe netdev lo failed: $out"
n=0
until [ -c /dev/infiniband/uverbs0 ] && [ -e /sys/class/infiniband_verbs/uverbs0 ]; do
    n=$((n + 1))
    [ $n -lt 500 ] || die "rxe0 was added but /dev/infiniband/uverbs0 or /sys/class/infiniband_verbs/uverbs0 did not appear within 5 s"
    sleep 0.01
done
note "rxe0 ready; setting up rdma_ucm and rxe_cm on uvcm0 (169.254.77.1/24)"
out=$(modprobe rdma_ucm 2>&1) || die "modprobe rdma_ucm failed: $out"
out=$(modprobe dummy 2>&1) || die "modprobe dummy failed: $out"
out=$({ ip link add uvcm0 type dummy && ip addr add 169.254.77.1/24 dev uvcm0 && ip link set uvcm0 up; } 2>&1) \
    || die "setting up the dummy netdev uvcm0 failed: $out"
out=$(rdma link add rxe_cm type rxe netdev uvcm0 2>&1) || die "rdma link add rxe_cm type rxe netdev uvcm0 failed: $out"
n=0
until [ -c /dev/infiniband/rdma_cm ] && [ -e /sys/class/infiniband/rxe_cm ]; do
    n=$((n + 1))
    [ $n -lt 500 ] || die "/dev/infiniband/rdma_cm or rxe_cm did not appear within 5 s"
    sleep 0.01
done
export UVERBS_CM_ADDR=169.254.77.1
note "rxe_cm ready; starting the command"

cd "$UVERBS_PROJECT" || die "cannot cd to $UVERBS_PROJECT"
ulimit -l unlimited || die "ulimit -l unlimited failed"
echo '@@uverbs-guest:command-start@@'
/bin/sh -c "$UVERBS_COMMAND"
status=$?
echo "$status" > "$UVERBS_RESULTS/status"
note "command exited with $status"
