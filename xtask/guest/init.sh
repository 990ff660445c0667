#!/bin/sh
# PID 1 of the uverbs test guest; lives in the initramfs built by `cargo xtask`.
# Mounts the host's root (virtio-9p, read-only) under a tmpfs overlay, mounts
# the writable results share at its host path, then runs the per-run script
# ($uverbs_results/guest.sh, from the kernel command line) in a chroot with its
# output on ttyS0. Progress and errors go to the kernel log (console = ttyS1).
export PATH=/bin

mount -t devtmpfs devtmpfs /dev
mount -t proc proc /proc
mount -t sysfs sysfs /sys

say() { echo "uverbs-guest: $*" > /dev/kmsg; }
fail() {
    say "ERROR: $*"
    echo "uverbs-guest: ERROR: $*" > /dev/ttyS0
    poweroff -f
}

[ -n "$uverbs_results" ] || fail "no uverbs_results= on the kernel command line"
stty -F /dev/ttyS0 raw -echo || say "stty on ttyS0 failed; output may contain CRs"

say "loading initramfs modules"
for m in $(cat /modules.load); do
    insmod "/lib/modules/$m.ko" || fail "insmod $m failed (see kernel log above)"
done

mkdir -p /lower /rw /newroot
n=0
until mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /lower; do
    n=$((n + 1))
    [ $n -lt 100 ] || fail "mounting the host root (9p tag hostroot) failed"
    sleep 0.05
done
mount -t tmpfs -o mode=0755 tmpfs /rw || fail "tmpfs for the overlay failed"
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "overlay of tmpfs over the host root failed"
mount -t 9p -o trans=virtio,version=9p2000.L,cache=none,msize=512000 results "/newroot$uverbs_results" \
    || fail "mounting the results share (9p tag results) at $uverbs_results failed"
mount -t proc proc /newroot/proc || fail "proc in chroot"
mount -t sysfs sysfs /newroot/sys || fail "sysfs in chroot"
mount -t devtmpfs devtmpfs /newroot/dev || fail "devtmpfs in chroot"
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts || fail "devpts in chroot"
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm || fail "/dev/shm in chroot"
# A fresh /tmp and /run, unless the project lives under one of them (a clone in /tmp): a tmpfs
# there would hide it, so the overlay's view of the host directory stays (writes to it still
# land in guest memory only).
for d in tmp:1777 run:0755; do
    case "$uverbs_results/" in
    /"${d%:*}"/*) say "the project is under /${d%:*}: keeping the host's /${d%:*} (overlay)" ;;
    *) mount -t tmpfs -o mode="${d#*:}" tmpfs "/newroot/${d%:*}" || fail "/${d%:*} in chroot" ;;
    esac
done

# A kernel the harness unpacked from its package (not installed on the host): its modules
# (uverbs_modules= on the command line, a directory of the host) appear where modprobe looks.
if [ -n "${uverbs_modules:-}" ]; then
    rel=$(cat /proc/sys/kernel/osrelease)
    say "mounting $uverbs_modules at /lib/modules/$rel"
    mkdir -p "/newroot/lib/modules/$rel" || fail "mkdir /lib/modules/$rel in chroot"
    mount -o bind "/newroot$uverbs_modules" "/newroot/lib/modules/$rel" \
        || fail "bind-mounting $uverbs_modules at /lib/modules/$rel failed"
fi

# Kernel module autoloading runs this helper, which uses the host's modprobe.
echo /bin/modprobe-chroot > /proc/sys/kernel/modprobe

say "running $uverbs_results/guest.sh in the chroot"
env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb \
    chroot /newroot /bin/sh "$uverbs_results/guest.sh" < /dev/null > /dev/ttyS0 2>&1
say "guest.sh exited with $?; powering off"
sync
poweroff -f
