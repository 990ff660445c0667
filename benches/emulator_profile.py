#!/usr/bin/env python3
"""The host's side of the replayed drain (benches/emulator-profile.sh).

    emulator_profile.py sample QEMU_BINARY   > host.txt   (until killed)
    emulator_profile.py report DIR

`sample` writes, every 10 ms, the host's CLOCK_MONOTONIC, its total steal time (jiffies,
/proc/stat), how long a fixed loop of its own took (ns: the speed of whichever host CPU ran
it) and, for each thread of the running QEMU_BINARY, its time on a CPU and waiting for one
(ns, /proc/<pid>/task/<tid>/schedstat):  `T steal LOOP TID:RUN:WAIT ...`.

`report` reads DIR/guest.txt (the guest's output, each line prefixed by CLOCK_MONOTONIC
seconds, with the harnesses' `replay <impl> <workload> <batch> <ns>` lines from
UVERBS_REPLAY_TRACE; a block runs from the line before it, of the same process, to its own
line), DIR/flushes.txt (`perf script -F tid,time,event,ip,sym` of QEMU's soft-TLB flush
uprobes, with call stacks) and DIR/host.txt, and writes DIR/blocks.csv (one row per block)
and DIR/emulator-profile.md (the summary, also printed).
"""

import bisect
import os
import re
import statistics
import sys
import time
from collections import Counter, defaultdict

FULL = "tlb_flush_by_mmuidx_async_work"
PAGE = "tlb_flush_page_locked"
JIFFY = 0.01  # USER_HZ
# Iterations of the sampler's own timed loop (about 0.1 ms on the hosts measured).
CALIBRATION_LOOP = 4000


def find_process(exe):
    """The pid of a process running `exe`, or None."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink("/proc/%s/exe" % pid) == exe:
                return pid
        except OSError:
            continue
    return None


def sample(qemu):
    qemu = os.path.realpath(qemu)
    pid = None
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(CALIBRATION_LOOP):
            pass
        loop = time.perf_counter_ns() - t0
        now = time.monotonic()
        with open("/proc/stat") as f:
            steal = int(f.readline().split()[8])
        threads = []
        try:
            pid = pid or find_process(qemu)
            for tid in os.listdir("/proc/%s/task" % pid) if pid else []:
                with open("/proc/%s/task/%s/schedstat" % (pid, tid)) as f:
                    run, wait, _ = f.read().split()
                threads.append("%s:%s:%s" % (tid, run, wait))
        except OSError:
            pid = None
        print("%.6f %d %d %s" % (now, steal, loop, " ".join(threads)), flush=True)
        time.sleep(0.01)


def read_blocks(path):
    """(impl, workload, batch, ns, start, end) per block whose start is known."""
    blocks = []
    prev = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            stamp, _, text = line.partition(" ")
            fields = text.split()
            if len(fields) == 5 and fields[0] == "replay":
                t = float(stamp)
                if prev is not None:
                    _, imp, work, batch, ns = fields
                    blocks.append((imp, work, int(batch), float(ns), prev, t))
                prev = t
            else:
                # Anything else (a process's results, the shell) ends a process's run of blocks.
                prev = None
    return blocks


def origin(frames):
    """What asked for a flush: the first TCG helper on QEMU's stack (a guest instruction's),
    else the first function that is not the flush machinery itself, else the translated code
    (whose frames perf cannot name)."""
    for f in frames:
        if f.startswith("helper_"):
            return f
    for f in frames:
        if not f.startswith(("tlb_", "probe_", "[unknown]")):
            return f
    # Tail calls and translated code (no frame pointers) leave only the flush functions.
    named = [f for f in frames if f != "[unknown]"]
    return "translated code, via %s" % (named[-1] if named else "?")


def read_flushes(path):
    """Per kind of flush: sorted (time, origin)."""
    flushes = {FULL: [], PAGE: []}
    event = re.compile(r"^\s*\d+\s+([0-9.]+):\s+probe_\w+:(\w+)")
    current = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in list(f) + [""]:
            m = event.match(line)
            if m or not line.strip():
                if current is not None and current[1] in flushes:
                    flushes[current[1]].append((current[0], origin(current[2])))
                current = (float(m.group(1)), m.group(2), []) if m else None
            elif current is not None:
                # "<address> <symbol>+<offset> (<object>)"
                parts = line.split()
                if len(parts) >= 2:
                    current[2].append(parts[1].split("+")[0])
    for v in flushes.values():
        v.sort()
    return flushes


def read_host(path):
    """Sorted (time, steal jiffies, loop ns, {tid: (run ns, wait ns)})."""
    samples = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 3:
                continue
            threads = {}
            for t in fields[3:]:
                tid, run, wait = t.split(":")
                threads[tid] = (int(run), int(wait))
            samples.append((float(fields[0]), int(fields[1]), int(fields[2]), threads))
    return samples


def within(flushes, start, end):
    """The (time, origin) of `flushes` (sorted) in [start, end)."""
    return flushes[bisect.bisect_left(flushes, (start,)) : bisect.bisect_left(flushes, (end,))]


def host_shares(host, times, start, end):
    """Over the samples spanning [start, end]: host steal (CPUs' worth), the busiest QEMU
    thread's share of the time on a CPU and waiting for one, and the median time of the
    sampler's own loop. None where the samples do not span the block."""
    i = bisect.bisect_right(times, start) - 1
    j = bisect.bisect_left(times, end)
    if i < 0 or j >= len(host) or j <= i:
        return None
    (t0, s0, _, th0), (t1, s1, _, th1) = host[i], host[j]
    loop = statistics.median(h[2] for h in host[i : j + 1])
    dt = t1 - t0
    busiest = max(
        ((th1[t][0] - th0[t][0], th1[t][1] - th0[t][1]) for t in th1 if t in th0),
        default=(0, 0),
    )
    return ((s1 - s0) * JIFFY / dt, busiest[0] / 1e9 / dt, busiest[1] / 1e9 / dt, loop / 1e3)


def summarize(blocks, flushes, host):
    times = [h[0] for h in host]
    rows = []
    origins = Counter()
    for imp, work, batch, ns, start, end in blocks:
        full, page = within(flushes[FULL], start, end), within(flushes[PAGE], start, end)
        shares = host_shares(host, times, start, end)
        rows.append((imp, work, batch, ns, end - start, len(full), len(page), shares))
        for kind, part in (("full", full), ("page", page)):
            for _, o in part:
                origins[(kind, o)] += 1
    groups = defaultdict(list)
    for r in rows:
        groups[(r[1], r[2], r[0])].append(r)
    md = [
        "| workload | batch | impl | blocks | ns/completion, fastest half of the blocks | slowest half "
        "| full flushes/s, fastest half | slowest half | host steal (CPUs), fastest half | slowest half "
        "| busiest QEMU thread on a CPU, fastest half | slowest half "
        "| host loop (µs), fastest half | slowest half |",
        "|---|---:|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def spread(part):
        v = [r[3] for r in part]
        return "%.1f (%.0f–%.0f)" % (statistics.median(v), min(v), max(v)) if v else "–"

    def flush_rate(part):
        secs = sum(r[4] for r in part)
        return "%.0f" % (sum(r[5] for r in part) / secs) if secs > 0 else "–"

    def mean_share(part, k):
        v = [r[7][k] for r in part if r[7] is not None]
        return "%.2f" % statistics.mean(v) if v else "–"

    for (work, batch, imp), rs in sorted(groups.items()):
        by_speed = sorted(rs, key=lambda r: r[3])
        half = (len(by_speed) + 1) // 2
        fast, slow = by_speed[:half], by_speed[half:]
        md.append(
            "| %s | %d | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |"
            % (
                work,
                batch,
                imp,
                len(rs),
                spread(fast),
                spread(slow),
                flush_rate(fast),
                flush_rate(slow),
                mean_share(fast, 0),
                mean_share(slow, 0),
                mean_share(fast, 1),
                mean_share(slow, 1),
                mean_share(fast, 3),
                mean_share(slow, 3),
            )
        )
    md.append("")
    everywhere = Counter()
    for kind, name in (("full", FULL), ("page", PAGE)):
        for _, o in flushes[name]:
            everywhere[(kind, o)] += 1
    md.append("| flush | asked for by (QEMU's stack) | in the whole run, boot included | during the blocks |")
    md.append("|---|---|---:|---:|")
    for (kind, o), n in everywhere.most_common(12):
        md.append("| %s | `%s` | %d | %d |" % (kind, o, n, origins[(kind, o)]))
    md.append("")
    md.append(
        "%d blocks over %.1f s of drains; in them %d full flushes and %d single-page flushes of a "
        "vCPU's soft TLB (all vCPUs); %d flushes in the whole run."
        % (
            len(rows),
            sum(r[4] for r in rows),
            sum(r[5] for r in rows),
            sum(r[6] for r in rows),
            len(flushes[FULL]) + len(flushes[PAGE]),
        )
    )
    return rows, "\n".join(md) + "\n"


def report(out):
    blocks = read_blocks(out + "/guest.txt")
    if not blocks:
        sys.exit("emulator_profile: no replay blocks in %s/guest.txt" % out)
    rows, md = summarize(blocks, read_flushes(out + "/flushes.txt"), read_host(out + "/host.txt"))
    with open(out + "/blocks.csv", "w", encoding="utf-8") as f:
        f.write(
            "impl,workload,batch,ns,seconds,full_flushes,page_flushes,host_steal,qemu_on_cpu,qemu_waiting,host_loop_us\n"
        )
        for r in rows:
            shares = ",".join("%.3f" % x for x in r[7]) if r[7] else ",,,"
            f.write("%s,%s,%d,%.3f,%.6f,%d,%d,%s\n" % (r[:7] + (shares,)))
    with open(out + "/emulator-profile.md", "w", encoding="utf-8") as f:
        f.write(md)
    print(md, end="")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "sample":
        sample(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
