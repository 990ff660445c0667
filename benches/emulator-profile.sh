#!/bin/sh
# The emulator's side of the replayed drain (`cargo xtask bench --emulator`, as root): runs
# the Rust and C harnesses' replayed drain in a guest whose QEMU is Debian's own source of the
# installed version built with symbols, counts that QEMU's soft-TLB flushes with uprobes, and
# sets each block of drains beside the flushes that fell inside it
# (benches/emulator_profile.py; docs/benchmarks.md reads the result).
#
#   benches/emulator-profile.sh RUST_BENCH C_BENCH OUT_DIR
#
# The QEMU build (about 5 to 15 minutes on two cores) is kept in target/qemu-sym/ and reused.
# Writes OUT_DIR/guest.txt (the guest's output, each line stamped with the host's
# CLOCK_MONOTONIC), OUT_DIR/flushes.txt (perf script of the uprobes with QEMU's call stacks,
# same clock), OUT_DIR/host.txt (the host's steal time and QEMU's threads' scheduling, every
# 10 ms, same clock), and OUT_DIR/emulator-profile.md and blocks.csv (the analysis).
set -eu

rust=$1 c=$2 out=$3
root=$(cd "$(dirname "$0")/.." && pwd)
sym=$root/target/qemu-sym
qemu=$sym/src/build/qemu-system-x86_64
mkdir -p "$out"

if [ "$(id -u)" != 0 ]; then
    echo "emulator-profile: needs root (apt-get, uprobes on QEMU)" >&2
    exit 1
fi

if [ ! -x "$qemu" ]; then
    version=$(dpkg-query -W -f '${source:Version}' qemu-system-x86) || {
        echo "emulator-profile: needs Debian's qemu-system-x86 (the source of that version is built)" >&2
        exit 1
    }
    # Source lines for Debian's own mirrors, beside the binary ones, if there are none.
    if ! grep -rqsE '^(Types:.*deb-src|deb-src )' /etc/apt/sources.list /etc/apt/sources.list.d/; then
        if [ -f /etc/apt/sources.list.d/debian.sources ]; then
            sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
                >/etc/apt/sources.list.d/uverbs-deb-src.sources
        else
            sed -n 's/^deb /deb-src /p' /etc/apt/sources.list >/etc/apt/sources.list.d/uverbs-deb-src.list
        fi
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dpkg-dev flex bison ninja-build meson \
        pkg-config libglib2.0-dev libpixman-1-dev libattr1-dev libcap-ng-dev libfdt-dev linux-perf \
        python3 >/dev/null
    rm -rf "$sym"
    mkdir -p "$sym/dl"
    echo "emulator-profile: building QEMU $version with symbols in $sym" >&2
    (cd "$sym/dl" && apt-get source -qq --download-only "qemu=$version")
    dpkg-source -x "$sym"/dl/qemu_*.dsc "$sym/src" >/dev/null
    mkdir "$sym/src/build"
    # The installed build's accelerator and 9p, with debug info and frame pointers; no
    # graphics, no network back ends (the guest has no network device).
    (cd "$sym/src/build" && ../configure --target-list=x86_64-softmmu --enable-virtfs \
        --disable-docs --disable-werror --disable-strip \
        --extra-cflags='-g -fno-omit-frame-pointer' --disable-gtk --disable-sdl --disable-vnc \
        --disable-opengl --disable-spice --disable-usb-redir --disable-libusb --disable-curl \
        --disable-rbd --disable-glusterfs --disable-xen --disable-capstone --disable-slirp \
        >"$sym/configure.log" && ninja qemu-system-x86_64 >"$sym/build.log")
fi

# The QEMU xtask boots, under perf: only the uprobes, stamped with CLOCK_MONOTONIC, each with
# QEMU's call stack (the build keeps frame pointers), which names the helper, and so the kind
# of guest instruction, that asked for the flush.
mkdir -p "$sym/bin"
cat >"$sym/bin/qemu-system-x86_64" <<EOF
#!/bin/sh
[ "\${1:-}" = --version ] && exec "$qemu" --version
exec perf record -q -g -k CLOCK_MONOTONIC -e 'probe_qemu:*' -o "$out/qemu.perf" -- \\
    "$qemu" -L "$sym/src/build/pc-bios" -L /usr/share/qemu -L /usr/share/seabios "\$@"
EOF
chmod +x "$sym/bin/qemu-system-x86_64"

# A full flush of a vCPU's soft TLB, and a flush of one page (QEMU's accel/tcg/cputlb.c).
perf probe -q -d 'probe_qemu:*' 2>/dev/null || true
perf probe -q -x "$qemu" --add tlb_flush_by_mmuidx_async_work --add tlb_flush_page_locked

h="--device rxe0 --gid-index 1"
# Three processes of each, taking turns.
cmd="for i in 1 2 3; do UVERBS_REPLAY_TRACE=1 $rust $h --only drain_replay,drain_floor || exit 1;"
cmd="$cmd UVERBS_REPLAY_TRACE=1 $c $h --only drain_replay || exit 1; done"
echo "emulator-profile: guest: $cmd" >&2
cd "$root"
# Meanwhile, every 10 ms: the host's steal time and each QEMU thread's time on and waiting
# for a host CPU.
python3 "$root/benches/emulator_profile.py" sample "$qemu" >"$out/host.txt" &
sampler=$!
{
    PATH="$sym/bin:$PATH" cargo xtask guest -- "$cmd" 2>&1
    echo "xtask-status $?"
} | python3 -u -c 'import sys, time
for line in sys.stdin:
    print("%.6f %s" % (time.monotonic(), line), end="", flush=True)' >"$out/guest.txt"
kill $sampler
perf probe -q -d 'probe_qemu:*' || true
status=$(sed -n 's/^[0-9.]* xtask-status //p' "$out/guest.txt")
if [ "$status" != 0 ]; then
    echo "emulator-profile: the guest run failed (status $status); see $out/guest.txt" >&2
    exit 1
fi
perf script -i "$out/qemu.perf" -F tid,time,event,ip,sym >"$out/flushes.txt"
python3 "$root/benches/emulator_profile.py" report "$out"
