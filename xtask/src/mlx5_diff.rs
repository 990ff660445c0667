//! The mlx5 differential against libmlx5: one seeded script of work requests (on an RC QP,
//! then on a UD QP through address handles) run by `tests/mlx5/wqe_diff.c` (libmlx5) and by
//! the example `mlx5_wqe_diff` (`tests/mlx5/wqe_diff.rs`, the Rust mlx5 provider), each on
//! the model with its trace on (`tests/mlx5/model/src/trace.rs` and `stepper.rs`).
//! Compared: the traced WQE bytes, doorbell records and UAR doorbell words (exactly), the
//! completions (the `ibv_wc` fields libmlx5 defines), and the driver data of each command
//! (equal but for the differences listed in [`ALLOWED`], [`ABSENT_OR_ZERO`] and
//! [`ONLY_RUST`]). docs/mlx5-model.md says what is masked and why.

use crate::{paths, proc};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Source of the C side, compiled at test time (never part of the library).
const WQE_DIFF_C: &str = "tests/mlx5/wqe_diff.c";
/// The Rust side: an example of the root crate built with `--features mlx5`.
const WQE_DIFF_EXAMPLE: &str = "mlx5_wqe_diff";

/// What one side's run left: its output and its trace.
pub struct Run {
    pub output: String,
    pub trace: String,
}

/// Both sides' runs of the same script.
pub struct Runs {
    pub c: Run,
    pub rust: Run,
    /// On a RoCE port (the script of `script(_, _, true)`).
    pub roce: bool,
}

/// The two settings both providers run the script in: a device without write combining
/// (`bf_reg_size` 0) with `MLX5_SHUT_UP_BF=1` (uncached UAR pages, no BlueFlame), and one
/// with write combining (`UVERBS_MLX5_MODEL_WC=1`: 512-byte bfregs), where both copy a lone
/// WQE to the UAR (BlueFlame).
pub const SETTINGS: [(&str, &str, &str); 2] = [
    ("no write combining, MLX5_SHUT_UP_BF=1", "MLX5_SHUT_UP_BF", "1"),
    ("write combining, BlueFlame", "UVERBS_MLX5_MODEL_WC", "1"),
];

/// Builds both programs, writes the script into `dir` and runs each on the model (`model`
/// points a command at it) with the trace on, in setting `setting` of [`SETTINGS`]; `roce`:
/// the script for a RoCE port (see [`script`]).
pub fn run_both(
    dir: &Path,
    model: &dyn Fn(&mut Command),
    limit: Duration,
    setting: usize,
    roce: bool,
) -> Result<Runs, String> {
    let (_, var, value) = SETTINGS[setting];
    let out_dir = paths::target_dir().join("mlx5-check");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let c_exe = out_dir.join("wqe_diff");
    let mut gcc = Command::new("gcc");
    gcc.args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&c_exe)
        .arg(paths::root().join(WQE_DIFF_C))
        .args(["-libverbs", "-ldl"]);
    proc::filter(&mut gcc, b"", &[0]).map_err(|e| format!("{WQE_DIFF_C} does not compile: {e}"))?;
    let mut cargo = crate::toolchain::cargo();
    cargo.args(["build", "--features", "mlx5", "--example", WQE_DIFF_EXAMPLE]);
    proc::check(&mut cargo).map_err(|e| format!("the example {WQE_DIFF_EXAMPLE} does not build: {e}"))?;
    let rust_exe = paths::target_dir().join("debug/examples").join(WQE_DIFF_EXAMPLE);
    let script_path = dir.join("script");
    std::fs::write(&script_path, script(SEED, STEPS, roce)).map_err(|e| e.to_string())?;
    let run = |name: &str, exe: &Path| -> Result<Run, String> {
        let trace = dir.join(format!("{name}-{setting}.trace"));
        let out = dir.join(format!("{name}-{setting}.out"));
        let file = std::fs::File::create(&out).map_err(|e| e.to_string())?;
        let mut c = Command::new("timeout");
        c.args(["-k", "10", &limit.as_secs().to_string()])
            .arg(exe)
            .arg("mlx5_0")
            .arg(&script_path)
            .env("UVERBS_MLX5_MODEL_TRACE", &trace)
            .env(var, value)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(Stdio::piped());
        model(&mut c);
        let res = c.output().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
        let output = std::fs::read_to_string(&out).unwrap_or_default();
        if !res.status.success() || !output.ends_with("wqe_diff: done\n") {
            return Err(format!(
                "the {name} side failed ({}): {}",
                res.status,
                String::from_utf8_lossy(&res.stderr).trim()
            ));
        }
        let trace = std::fs::read_to_string(&trace).map_err(|e| format!("no {name} trace: {e}"))?;
        Ok(Run { output, trace })
    };
    Ok(Runs {
        c: run("libmlx5", &c_exe)?,
        rust: run("rust", &rust_exe)?,
        roce,
    })
}

/// Acceptance 3 and 4 on `runs` of setting `setting`: one line saying what was compared.
pub fn check_rings(runs: &Runs, setting: usize) -> Result<String, String> {
    let (sq, rq, uar) = compare_traces(&runs.c.trace, &runs.rust.trace)?;
    // The trace's own findings: a doorbell that is not the last WQE, a ring it could not read.
    let flagged = ["differs from the WQE", "names no traced QP", "unreadable"];
    if let Some(l) = runs.c.trace.lines().find(|l| flagged.iter().any(|f| l.contains(f))) {
        return Err(format!("both providers: {l}"));
    }
    // BlueFlame copies: UAR lines longer than one 8-byte doorbell.
    let bf = runs
        .c
        .trace
        .lines()
        .filter(|l| l.starts_with("uar ") && l.split(' ').count() > 3)
        .count();
    if (bf > 0) != (setting == 1) {
        return Err(format!(
            "{bf} BlueFlame copies in the setting `{}`",
            SETTINGS[setting].0
        ));
    }
    let wcs = compare_outputs(&runs.c.output, &runs.rust.output)?;
    // A send WQE whose index (bytes 1-2 of its control segment) is below 0x100 after the
    // first 256 blocks: the 16-bit counter wrapped.
    let wrapped = runs
        .c
        .trace
        .lines()
        .filter(|l| l.starts_with("sq "))
        .skip(300)
        .any(|l| l.starts_with("sq 0000"));
    if sq == 0 || rq == 0 || uar == 0 || wcs == 0 || !wrapped {
        return Err(format!(
            "too little compared: {sq} send WQEs, {rq} receive WQEs, {uar} doorbells, {wcs} \
             completions; the send counter wrapped: {wrapped}"
        ));
    }
    Ok(format!(
        "{}: {sq} send WQEs, {rq} receive WQEs, {uar} UAR doorbells ({bf} BlueFlame copies), {wcs} \
         completions: identical",
        SETTINGS[setting].0
    ))
}

/// Seed of the script (any value gives a valid script; this one is the test's).
pub const SEED: u64 = 0x5eed_0016;
/// Script steps: each posts a send list and often a receive list, then traces and polls.
/// Enough for the send counter (`dbrec[SND]`, 16 bits) to wrap.
pub const STEPS: u32 = 5000;
/// Steps on the UD QP after those (its own send counter wraps too), and its AHs.
pub const UD_STEPS: u32 = 1500;
const UD_AHS: u64 = 12;
/// The QP's requested capabilities and the CQ size the script asks for.
const MAX_SEND_WR: u32 = 64;
const MAX_RECV_WR: u32 = 32;
const MAX_SGE: u32 = 4;
const MAX_INLINE: u32 = 120;
const CQE: u32 = 63;

/// splitmix64, as simple to follow as a generator gets.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// ibv_wr_opcode values and ibv_send_flags bits the script uses.
mod op {
    pub const SEND: u64 = 2;
    pub const READ: u64 = 4;
    pub const CAS: u64 = 5;
    pub const FAA: u64 = 6;
    pub const FENCE: u64 = 1;
    pub const SIGNALED: u64 = 2;
    pub const SOLICITED: u64 = 4;
    pub const INLINE: u64 = 8;
}

/// QPs (type: 0 RC, 1 UC, 2 UD; max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
/// max_inline_data) the script creates and destroys before its steps, so that the driver
/// requests compare the queue sizes both providers ask for: one request, receive queues
/// under one basic block (1 to 3 receives of one SGE), no receive queue, the largest WQE
/// (20 SGEs or 316 inline bytes on RC), UD WQEs with no SGE, inline sizes between.
const SIZINGS: [(u8, [u32; 5]); 14] = [
    (0, [1, 1, 1, 1, 0]),
    (0, [1, 3, 1, 1, 0]),
    (0, [2, 5, 2, 3, 0]),
    (0, [1, 1, 1, 1, 60]),
    (0, [100, 500, 1, 3, 64]),
    (0, [4, 0, 1, 1, 0]),
    (0, [16, 16, 20, 1, 316]),
    (0, [7, 9, 3, 2, 28]),
    (1, [1, 1, 1, 1, 0]),
    (1, [3, 2, 1, 1, 100]),
    (2, [1, 1, 1, 1, 0]),
    (2, [8, 8, 1, 1, 0]),
    (2, [2, 2, 0, 1, 0]),
    (2, [5, 3, 2, 2, 300]),
];

/// The script (format in tests/mlx5/wqe_diff.c): every opcode, lists of 1..32, inline
/// sizes 0..=MAX_INLINE over 0..4 SGEs, zero-length SGEs, every flag combination; the last
/// request of each list signaled so the queue drains at each step. With `roce`, for a RoCE
/// port: the same script, but every address handle has a GRH towards a link-local DGID
/// (from the source GID 0, a RoCE v1 GID, the kernel takes the MAC out of the DGID, so both
/// runs' address vectors are the same whatever their process's addresses).
pub fn script(seed: u64, steps: u32, roce: bool) -> String {
    let mut r = Rng(seed);
    let mut s = format!("qp {MAX_SEND_WR} {MAX_RECV_WR} {MAX_SGE} {MAX_SGE} {MAX_INLINE} {CQE}\n");
    // QPs created and destroyed at once, for their CREATE_QP's queue sizes.
    for (qp_type, cap) in SIZINGS {
        let [send, recv, send_sge, recv_sge, inline] = cap;
        let _ = writeln!(s, "z {qp_type} {send} {recv} {send_sge} {recv_sge} {inline}");
    }
    let mut wr_id = 0u64;
    for step in 0..steps {
        let n = if r.chance(30) { 1 } else { 1 + r.below(32) };
        for i in 0..n {
            wr_id += 1;
            let opcode = r.below(7);
            let mut flags = r.below(8) & (op::FENCE | op::SIGNALED | op::SOLICITED);
            if i + 1 == n {
                flags |= op::SIGNALED;
            }
            let atomic = opcode == op::CAS || opcode == op::FAA;
            if !atomic && opcode != op::READ && r.chance(45) {
                flags |= op::INLINE;
            }
            let raddr = if atomic { r.next() & !7 } else { r.next() };
            let _ = write!(
                s,
                "S {wr_id:#x} {opcode} {flags} {:#x} {raddr:#x} {:#x} {:#x} {:#x}",
                r.next() as u32,
                r.next() as u32,
                r.next(),
                r.next()
            );
            if atomic {
                let len = if r.chance(50) { 8 } else { 16 };
                let _ = write!(s, " 1 {:#x} {len} {:#x}", r.next() & !7, r.next() as u32);
            } else if flags & op::INLINE != 0 {
                let nsge = r.below(u64::from(MAX_SGE) + 1);
                let mut left = if r.chance(15) {
                    u64::from(MAX_INLINE)
                } else {
                    r.below(u64::from(MAX_INLINE) + 1)
                };
                let _ = write!(s, " {nsge}");
                for k in 0..nsge {
                    let len = if k + 1 == nsge || r.chance(20) {
                        left
                    } else {
                        r.below(left + 1)
                    };
                    left -= len;
                    let _ = write!(s, " {} {len} {:#x}", r.below(4096 - len), r.next() as u32);
                }
            } else {
                let nsge = r.below(u64::from(MAX_SGE) + 1);
                let _ = write!(s, " {nsge}");
                for _ in 0..nsge {
                    let len = if r.chance(20) { 0 } else { r.below(1 << 20) };
                    let _ = write!(s, " {:#x} {len} {:#x}", r.next(), r.next() as u32);
                }
            }
            s.push('\n');
        }
        s.push_str("P\n");
        if r.chance(50) {
            for _ in 0..1 + r.below(16) {
                wr_id += 1;
                let nsge = r.below(u64::from(MAX_SGE) + 1);
                let _ = write!(s, "R {wr_id:#x} {nsge}");
                for _ in 0..nsge {
                    let len = if r.chance(20) { 0 } else { r.below(1 << 20) };
                    let _ = write!(s, " {:#x} {len} {:#x}", r.next(), r.next() as u32);
                }
                s.push('\n');
            }
            s.push_str("Q\n");
        }
        let _ = writeln!(s, "T {step}");
    }
    ud_script(&mut r, &mut s, &mut wr_id, roce);
    // One more trace: the consumer index record after the last polls.
    s.push_str("T end\n");
    s
}

/// The UD part of the script: a UD QP, address handles with random attributes (with and
/// without a GRH, SLs, rates and path bits beyond what the fields hold), then steps of SEND
/// and SEND_IMM lists to random QPNs and Q_Keys through them, inline or not, and receives.
fn ud_script(r: &mut Rng, s: &mut String, wr_id: &mut u64, roce: bool) {
    let _ = writeln!(
        s,
        "ud {MAX_SEND_WR} {MAX_RECV_WR} {MAX_SGE} {MAX_SGE} {MAX_INLINE} {CQE}"
    );
    for _ in 0..UD_AHS {
        let (dlid, sl, path_bits, rate) = (r.next() as u16, r.below(256), r.below(256), r.below(30));
        let global = r.below(2);
        let (hop_limit, tclass, flow_label, dgid_hi) = (r.below(256), r.below(256), r.next() as u32, r.next());
        let dgid_lo = r.next();
        let (global, dgid_hi) = match roce {
            true => (1, 0xfe80_0000_0000_0000),
            false => (global, dgid_hi),
        };
        let _ = writeln!(
            s,
            "A {dlid:#x} {sl} {path_bits} {rate} {global} {hop_limit} {tclass} {flow_label:#x} {dgid_hi:#x} {dgid_lo:#x}"
        );
    }
    for step in 0..UD_STEPS {
        let n = if r.chance(30) { 1 } else { 1 + r.below(32) };
        for i in 0..n {
            *wr_id += 1;
            let opcode = op::SEND + r.below(2);
            let mut flags = r.below(8) & (op::FENCE | op::SIGNALED | op::SOLICITED);
            if i + 1 == n {
                flags |= op::SIGNALED;
            }
            let inline = r.chance(45);
            if inline {
                flags |= op::INLINE;
            }
            let _ = write!(
                s,
                "S {wr_id:#x} {opcode} {flags} {:#x} {:#x} {:#x} {} 0",
                r.next() as u32,
                r.next() & 0xff_ffff,
                r.next() as u32,
                r.below(UD_AHS)
            );
            let nsge = r.below(u64::from(MAX_SGE) + 1);
            let _ = write!(s, " {nsge}");
            let mut left = r.below(u64::from(MAX_INLINE) + 1);
            for k in 0..nsge {
                if inline {
                    let len = if k + 1 == nsge { left } else { r.below(left + 1) };
                    left -= len;
                    let _ = write!(s, " {} {len} {:#x}", r.below(4096 - len), r.next() as u32);
                } else {
                    let len = if r.chance(20) { 0 } else { r.below(4096) };
                    let _ = write!(s, " {:#x} {len} {:#x}", r.next(), r.next() as u32);
                }
            }
            s.push('\n');
        }
        s.push_str("P\n");
        if r.chance(50) {
            for _ in 0..1 + r.below(16) {
                *wr_id += 1;
                let nsge = r.below(u64::from(MAX_SGE) + 1);
                let _ = write!(s, "R {wr_id:#x} {nsge}");
                for _ in 0..nsge {
                    let len = if r.chance(20) { 0 } else { 40 + r.below(4096) };
                    let _ = write!(s, " {:#x} {len} {:#x}", r.next(), r.next() as u32);
                }
                s.push('\n');
            }
            s.push_str("Q\n");
        }
        let _ = writeln!(s, "T ud {step}");
    }
}

/// The defined part of a completion line (`wc k=v ...`), as libmlx5 defines `ibv_wc`
/// (`cq.c` mlx5_parse_cqe, handle_error_cqe): every completion defines wr_id, status and
/// qp_num; an error adds vendor_err and nothing else; a successful one adds opcode and
/// wc_flags, byte_len for READ and atomics on the requester, and on the responder byte_len,
/// src_qp, slid, sl, dlid_path_bits, pkey_index and the immediate (with WITH_IMM or
/// WITH_INV).
pub fn defined_wc(line: &str) -> Option<String> {
    let f: BTreeMap<&str, &str> = line
        .strip_prefix("wc ")?
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .collect();
    let mut keys = vec!["id", "status", "qp"];
    if f.get("status") != Some(&"0") {
        keys.push("vendor_err");
    } else {
        keys.extend(["opcode", "flags"]);
        let opcode: u32 = f.get("opcode")?.parse().ok()?;
        let flags = u32::from_str_radix(f.get("flags")?, 16).ok()?;
        if opcode >= 128 {
            keys.extend(["byte_len", "src_qp", "slid", "sl", "dlid_path_bits", "pkey"]);
            if flags & (2 | 8) != 0 {
                keys.push("imm");
            }
        } else if (2..=4).contains(&opcode) {
            keys.push("byte_len");
        }
    }
    let mut out = String::from("wc");
    for k in keys {
        let _ = write!(out, " {k}={}", f.get(k)?);
    }
    Some(out)
}

/// Compares the two programs' outputs: identical lines, `wc` lines on their defined fields.
pub fn compare_outputs(c: &str, rust: &str) -> Result<usize, String> {
    let norm = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| match l.starts_with("wc ") {
                true => defined_wc(l).unwrap_or_else(|| format!("unparsable: {l}")),
                false => l.to_string(),
            })
            .collect()
    };
    let (a, b) = (norm(c), norm(rust));
    first_difference(&a, &b, "output")?;
    Ok(a.iter().filter(|l| l.starts_with("wc ")).count())
}

/// The first line where two sequences differ, with the step it is in.
fn first_difference(a: &[String], b: &[String], what: &str) -> Result<(), String> {
    let mut step = "(before the first step)".to_string();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i), b.get(i));
        if let Some(l) = x.filter(|l| l.starts_with("step ")) {
            step = l.clone();
        }
        if x != y {
            return Err(format!(
                "{what} line {}, at {step}:\n  libmlx5: {}\n  Rust:    {}",
                i + 1,
                x.map_or("(end)", |s| s.as_str()),
                y.map_or("(end)", |s| s.as_str())
            ));
        }
    }
    Ok(())
}

/// Compares the traces' ring, doorbell and UAR lines (every line but `cmd`), every byte of
/// them on both port types; returns how many send WQEs, receive WQEs and UAR doorbells were
/// compared.
pub fn compare_traces(c: &str, rust: &str) -> Result<(usize, usize, usize), String> {
    let rings = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with("cmd "))
            .map(str::to_string)
            .collect()
    };
    let (a, b) = (rings(c), rings(rust));
    first_difference(&a, &b, "trace")?;
    let count = |p: &str| a.iter().filter(|l| l.starts_with(p)).count();
    Ok((count("sq "), count("rq "), count("uar ")))
}

/// A driver-data field where libmlx5 and this provider may differ, and the kernel rule that
/// lets both through. Fields holding user addresses differ between any two runs and are
/// listed too.
pub struct Allowed {
    pub command: &'static str,
    /// Byte range of the field in the driver data.
    pub bytes: std::ops::Range<usize>,
    pub field: &'static str,
    pub why: &'static str,
}

/// Every difference the comparison accepts. Anything else in the driver data of GET_CONTEXT,
/// ALLOC_PD, CREATE_CQ, CREATE_QP, MODIFY_QP and the destroys fails it.
pub const ALLOWED: &[Allowed] = &[
    Allowed {
        command: "GET_CONTEXT",
        bytes: 24..32,
        field: "lib_caps",
        why: "libmlx5 asks for 4K_UAR|DYN_UAR (3), this provider for 4K_UAR (1) and the legacy \
              UARs: 6.1 main.c:1902 mlx5_ib_alloc_ucontext takes both (`lib_uar_dyn = \
              req.lib_caps & MLX5_LIB_CAP_DYN_UAR`; legacy bfregs otherwise)",
    },
    Allowed {
        command: "CREATE_CQ",
        bytes: 0..16,
        field: "buf_addr, db_addr",
        why: "user addresses: the kernel pins whatever pages they name (ib_umem_get, \
              mlx5_ib_db_map_user)",
    },
    Allowed {
        command: "CREATE_CQ",
        bytes: 22..26,
        field: "flags, uar_page_index",
        why: "with dynamic UARs libmlx5 names its UAR (MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX); \
              6.1 cq.c:789-795 create_cq_user requires that with lib_uar_dyn and otherwise \
              uses the context's first system page (`bfregi.sys_pages[0]`), so both stay 0 \
              with legacy UARs",
    },
    Allowed {
        command: "CREATE_QP",
        bytes: 0..16,
        field: "buf_addr, db_addr",
        why: "user addresses (ib_umem_get, mlx5_ib_db_map_user)",
    },
    Allowed {
        command: "CREATE_QP",
        bytes: 28..32,
        field: "flags",
        why: "libmlx5 sets MLX5_QP_FLAG_SCATTER_CQE (small payloads delivered inside the CQE) \
              and, with dynamic UARs, MLX5_QP_FLAG_UAR_PAGE_INDEX; this provider sets neither: \
              both are optional (6.1 qp.c:2870, :2895 process_create_flags; with neither UAR \
              flag qp.c:939-945 _create_user_qp has alloc_bfreg pick a legacy bfreg)",
    },
    Allowed {
        command: "CREATE_QP",
        bytes: 36..40,
        field: "bfreg_index",
        why: "with UAR_PAGE_INDEX libmlx5 names its dynamic UAR page here; without the UAR \
              flags 6.1 qp.c:926-940 _create_user_qp never reads the field and picks the \
              bfreg",
    },
];

/// Commands whose driver data libmlx5 leaves out where this provider sends it all zero (and
/// offers a driver response), with the kernel rule that makes the two the same request.
pub const ABSENT_OR_ZERO: &[(&str, &str)] = &[(
    "MODIFY_QP",
    "libmlx5 sends no driver data for a plain modify; this provider sends a zeroed struct \
     mlx5_ib_modify_qp and offers the 16-byte response. 6.1 qp.c:4625 mlx5_ib_modify_qp starts \
     from `struct mlx5_ib_modify_qp ucmd = {}` when inlen is 0, a zeroed one passes every \
     check (comp_mask 0, burst_info.reserved 0, ece_options 0 asks for no ECE), and the \
     response is copied only when `resp.response_length` is set, in the ECE flows",
)];

/// Commands only this provider issues, with the kernel rule that makes them harmless. Their
/// driver data must be empty and their driver response room at least what the kernel could
/// write.
pub const ONLY_RUST: &[(&str, usize, &str)] = &[(
    "CREATE_AH",
    16,
    "on InfiniBand libmlx5 builds the address vector in user space and asks the kernel for \
     nothing (verbs.c mlx5_create_ah: CREATE_AH on Ethernet ports only); the core always \
     creates the kernel AH, which 6.1 allows on any port (core/uverbs_cmd.c:2408 \
     ib_uverbs_create_ah; hw/mlx5/ah.c:93 mlx5_ib_create_ah reads no driver data and writes \
     its 16-byte response only for RoCE AHs); the provider builds the same vector itself",
)];

/// One traced command: name, driver response length offered, driver data.
#[derive(Debug, Clone, PartialEq)]
pub struct Cmd {
    pub name: String,
    pub outlen: usize,
    pub data: Vec<u8>,
}

fn commands(trace: &str) -> Vec<Cmd> {
    trace
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("cmd ")?.split_whitespace();
            let name = w.next()?.to_string();
            let outlen = w.next()?.strip_prefix("outlen=")?.parse().ok()?;
            let hex = w.next().unwrap_or("");
            let data = (0..hex.len() / 2)
                .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
                .collect();
            Some(Cmd { name, outlen, data })
        })
        .collect()
}

/// The commands compared, in the order both sides issue them.
const COMPARED: [&str; 8] = [
    "GET_CONTEXT",
    "ALLOC_PD",
    "CREATE_CQ",
    "CREATE_QP",
    "MODIFY_QP",
    "DESTROY_QP",
    "DESTROY_CQ",
    "DEALLOC_PD",
];

/// Compares the driver data of each command in [`COMPARED`] (the last GET_CONTEXT: libmlx5
/// retries it; every other one in order), masking only [`ALLOWED`] and [`ABSENT_OR_ZERO`];
/// returns one line per command saying what differed within the allowance. On a RoCE port
/// (`roce`) libmlx5 issues CREATE_AH too (for the destination MAC): it is compared as those
/// are, and not one of [`ONLY_RUST`].
pub fn compare_commands(c: &str, rust: &str, roce: bool) -> Result<Vec<String>, String> {
    let (a, b) = (commands(c), commands(rust));
    let mut report = Vec::new();
    let roce_ah = roce.then_some("CREATE_AH");
    for name in COMPARED.into_iter().chain(roce_ah) {
        let pick = |cmds: &[Cmd]| -> Vec<Cmd> {
            let all: Vec<Cmd> = cmds.iter().filter(|c| c.name == name).cloned().collect();
            match name {
                "GET_CONTEXT" => all.last().cloned().into_iter().collect(),
                _ => all,
            }
        };
        let (x, y) = (pick(&a), pick(&b));
        if x.len() != y.len() || x.is_empty() {
            return Err(format!(
                "{name}: libmlx5 issued it {} time(s), the Rust provider {}",
                x.len(),
                y.len()
            ));
        }
        for (k, (p, q)) in x.iter().zip(&y).enumerate() {
            let mut masked = Vec::new();
            let absent_ok = ABSENT_OR_ZERO.iter().find(|(c, _)| *c == name);
            let (p, q) = match absent_ok {
                Some((_, why)) if p.data.is_empty() && q.data.iter().all(|&b| b == 0) => {
                    masked.push(format!("absent from libmlx5, zeros from Rust ({why})"));
                    (q, q)
                }
                _ => (p, q),
            };
            if p.data.len() != q.data.len() {
                return Err(format!(
                    "{name} #{k}: driver data of {} bytes (libmlx5) and {} (Rust)",
                    p.data.len(),
                    q.data.len()
                ));
            }
            if (p.outlen == 0) != (q.outlen == 0) && masked.is_empty() {
                return Err(format!(
                    "{name} #{k}: driver response of {} bytes (libmlx5) and {} (Rust)",
                    p.outlen, q.outlen
                ));
            }
            for (i, (u, v)) in p.data.iter().zip(&q.data).enumerate() {
                if u == v {
                    continue;
                }
                match ALLOWED.iter().find(|al| al.command == name && al.bytes.contains(&i)) {
                    Some(al) => {
                        let why = format!("{} ({})", al.field, al.why);
                        if !masked.contains(&why) {
                            masked.push(why);
                        }
                    }
                    None => {
                        return Err(format!(
                            "{name} #{k}: driver data byte {i} is {u:#04x} from libmlx5 and {v:#04x} \
                             from Rust, outside every allowed difference\n  libmlx5: {}\n  Rust:    {}",
                            hex(&p.data),
                            hex(&q.data)
                        ))
                    }
                }
            }
            if k == 0 {
                report.push(format!(
                    "{name}: {} bytes, {}",
                    p.data.len(),
                    match masked.is_empty() {
                        true => "identical".to_string(),
                        false => format!("differs only in {}", masked.join("; ")),
                    }
                ));
            }
        }
    }
    for (name, outlen, why) in ONLY_RUST {
        if roce_ah == Some(*name) {
            continue;
        }
        let (x, y) = (
            a.iter().filter(|c| c.name == *name),
            b.iter().filter(|c| c.name == *name),
        );
        if x.count() != 0 {
            return Err(format!(
                "{name}: libmlx5 issued it, which the allowance says it does not"
            ));
        }
        let y: Vec<&Cmd> = y.collect();
        if let Some(c) = y.iter().find(|c| !c.data.is_empty() || c.outlen < *outlen) {
            return Err(format!(
                "{name}: {} bytes of driver data and room for {} (want none and {outlen})",
                c.data.len(),
                c.outlen
            ));
        }
        if !y.is_empty() {
            report.push(format!(
                "{name}: {} time(s), from the Rust provider only ({why})",
                y.len()
            ));
        }
    }
    Ok(report)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_is_seeded_and_covers_every_opcode_and_flag() {
        let s = script(SEED, 200, false);
        assert_eq!(s, script(SEED, 200, false));
        assert_ne!(s, script(SEED + 1, 200, false));
        // The RoCE script: the same but for the address handles, each with a GRH towards a
        // link-local DGID.
        let roce = script(SEED, 200, true);
        let (ib_lines, roce_lines): (Vec<&str>, Vec<&str>) = (s.lines().collect(), roce.lines().collect());
        assert_eq!(ib_lines.len(), roce_lines.len());
        for (a, b) in ib_lines.iter().zip(&roce_lines) {
            match a.starts_with("A ") {
                false => assert_eq!(a, b),
                true => {
                    let w: Vec<&str> = b.split(' ').collect();
                    assert_eq!((w[5], w[9]), ("1", "0xfe80000000000000"), "{b}");
                }
            }
        }
        let sends: Vec<Vec<&str>> = s
            .lines()
            .filter(|l| l.starts_with("S "))
            .map(|l| l.split(' ').collect())
            .collect();
        for opcode in 0..7 {
            assert!(sends.iter().any(|w| w[2] == opcode.to_string()), "opcode {opcode}");
        }
        for flags in 0..16u64 {
            assert!(sends.iter().any(|w| w[3] == flags.to_string()), "flags {flags}");
        }
        // Zero-length SGEs, inline data of 0 and of MAX_INLINE bytes.
        assert!(s.contains(" 0 0x"));
        let inline_total = |w: &Vec<&str>| -> u64 {
            let n: usize = w[9].parse().unwrap();
            (0..n).map(|k| w[11 + 3 * k].parse::<u64>().unwrap()).sum()
        };
        let inline: Vec<u64> = sends
            .iter()
            .filter(|w| w[3].parse::<u64>().unwrap() & op::INLINE != 0)
            .map(inline_total)
            .collect();
        assert!(inline.contains(&0) && inline.contains(&u64::from(MAX_INLINE)));
        assert!(inline.iter().all(|&n| n <= u64::from(MAX_INLINE)));
        // Then the UD QP, its AHs (with and without a GRH), sends through each.
        let ud = s.split_once("\nud ").expect("a UD part").1;
        let ahs: Vec<&str> = ud.lines().filter(|l| l.starts_with("A ")).collect();
        assert_eq!(ahs.len() as u64, UD_AHS);
        for global in ["0", "1"] {
            assert!(
                ahs.iter().any(|l| l.split(' ').nth(5) == Some(global)),
                "is_global {global}"
            );
        }
        let ud_sends: Vec<Vec<&str>> = ud
            .lines()
            .filter(|l| l.starts_with("S "))
            .map(|l| l.split(' ').collect())
            .collect();
        assert!(ud_sends.iter().all(|w| w[2] == "2" || w[2] == "3"));
        for ah in 0..UD_AHS {
            assert!(ud_sends.iter().any(|w| w[7] == ah.to_string()), "AH {ah}");
        }
    }

    #[test]
    fn traces_compare_every_byte_of_ud_sends_rlid_included() {
        let wqe = |rlid: &str| {
            format!(
                "sq 0000000aqqqqqq060000000a00000000 6dab6f4d0000000080e17cf10c00{rlid} \
                 00000000bfa88d3633c6a98b0008edd1 fe8000000000000000000000000000aa"
            )
        };
        let bf =
            |rlid: &str| format!("uar bf+0x100 0000000aqqqqqq060000000a00000000 6dab6f4d0000000080e17cf10c00{rlid}");
        let ud = |rlid: &str| format!("step 0\nstep ud 0\n{}\n{}\n", wqe(rlid), bf(rlid));
        assert_eq!(compare_traces(&ud("0000"), &ud("0000")), Ok((1, 0, 1)));
        let err = compare_traces(&ud("0000"), &ud("edf2")).unwrap_err();
        assert!(err.contains("line 3, at step ud 0"), "{err}");
        let cmds = format!("cmd CREATE_AH x\n{}", ud("0000"));
        assert!(
            compare_traces(&cmds, &ud("0000")).is_ok(),
            "cmd lines are compared elsewhere"
        );
    }

    #[test]
    fn completions_compare_on_the_fields_libmlx5_defines() {
        let ok = "wc id=5 status=0 opcode=128 vendor_err=0 byte_len=7 imm=00000009 qp=self src_qp=3 \
                  flags=2 pkey=1 slid=2 sl=3 dlid_path_bits=4";
        assert_eq!(
            defined_wc(ok).unwrap(),
            "wc id=5 status=0 qp=self opcode=128 flags=2 byte_len=7 src_qp=3 slid=2 sl=3 dlid_path_bits=4 pkey=1 imm=00000009"
        );
        let err = "wc id=5 status=5 opcode=77 vendor_err=12 byte_len=7 imm=1 qp=self src_qp=3 flags=0 \
                   pkey=1 slid=2 sl=3 dlid_path_bits=4";
        assert_eq!(defined_wc(err).unwrap(), "wc id=5 status=5 qp=self vendor_err=12");
        let send = err.replace("status=5", "status=0").replace("opcode=77", "opcode=0");
        assert_eq!(defined_wc(&send).unwrap(), "wc id=5 status=0 qp=self opcode=0 flags=0");
        assert!(compare_outputs(ok, &ok.replace("byte_len=7", "byte_len=8")).is_err());
        assert!(compare_outputs(&send, &send.replace("byte_len=7", "byte_len=8")).is_ok());
    }

    #[test]
    fn driver_data_differs_only_where_allowed() {
        let qp = |flags: &str, rq: &str| format!("cmd CREATE_QP outlen=40 {}{rq}{flags}", "00".repeat(20));
        let trace = |q: String| {
            let mut t = String::new();
            for name in COMPARED {
                if name == "CREATE_QP" {
                    t.push_str(&q);
                } else {
                    let _ = write!(t, "cmd {name} outlen=0 ");
                }
                t.push('\n');
            }
            t
        };
        let a = trace(qp("02000000", "0000000000000000"));
        let b = trace(qp("00000000", "0000000000000000"));
        let report = compare_commands(&a, &b, false).unwrap();
        assert!(
            report
                .iter()
                .any(|l| l.starts_with("CREATE_QP: 32 bytes, differs only in flags (")),
            "{report:?}"
        );
        let c = trace(qp("00000000", "0100000000000000"));
        let e = compare_commands(&a, &c, false).unwrap_err();
        assert!(e.contains("byte 20"), "{e}");
        // CREATE_AH from the Rust provider only, with no driver data and room for the answer.
        let ah = |outlen: usize| format!("cmd CREATE_AH outlen={outlen} \n");
        let report = compare_commands(&a, &(b.clone() + &ah(16)), false).unwrap();
        assert!(
            report.iter().any(|l| l.starts_with("CREATE_AH: 1 time(s)")),
            "{report:?}"
        );
        assert!(compare_commands(&a, &(b.clone() + &ah(8)), false).is_err());
        assert!(compare_commands(&(a.clone() + &ah(16)), &(b.clone() + &ah(16)), false).is_err());
        // On RoCE both issue it, and it is compared as the others are.
        let report = compare_commands(&(a.clone() + &ah(16)), &(b.clone() + &ah(16)), true).unwrap();
        assert!(
            report.iter().any(|l| l == "CREATE_AH: 0 bytes, identical"),
            "{report:?}"
        );
        assert!(compare_commands(&a, &(b + &ah(16)), true).is_err());
    }
}
