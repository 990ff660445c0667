//! The mlx5 device model: `cargo xtask mlx5` runs a program on it, and [`test_step`] is the
//! host step of `cargo xtask test` that runs Debian's unmodified C libmlx5 (through
//! libibverbs) on it, then the Rust provider's examples and integration tests: no guest, no
//! root, no ConnectX anywhere.
//!
//! The model is the crate `tests/mlx5/model` (package `uverbs-mlx5-model`), an
//! `LD_PRELOAD` interposer. A program runs on it with `UVERBS_MLX5_MODEL_DIR=<dir>` and
//! `LD_PRELOAD=<abs path of target/debug/libuverbs_mlx5_model.so>`; every process started with
//! the same dir sees the same device `mlx5_0` (port 1 ACTIVE) and can reach the others. Each
//! run here gets a fresh dir `target/mlx5-model/<pid>-<n>`, removed after a passing item and
//! kept after a failing one (until an xtask run finds its process gone).

use crate::error::{bail, Context, Result};
use crate::proc::{self, sh_quote};
use crate::{env_number, paths};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Limit in seconds for each item of the step.
pub const ENV_TIMEOUT: &str = "UVERBS_MLX5_TIMEOUT";
const ITEM_TIMEOUT: u32 = 300;
/// The model's directory variable (the contract with the model crate).
const ENV_DIR: &str = "UVERBS_MLX5_MODEL_DIR";
/// The model's link layer: `eth` for a RoCE port (docs/mlx5-model.md).
const ENV_LINK: &str = "UVERBS_MLX5_MODEL_LINK";
const MODEL_PACKAGE: &str = "uverbs-mlx5-model";
const MODEL_MANIFEST: &str = "tests/mlx5/model/Cargo.toml";
const MODEL_LIB: &str = "libuverbs_mlx5_model.so";
const DEVICE: &str = "mlx5_0";
/// Source of the C check program, compiled at test time (never part of the library).
const VERBS_CHECK_C: &str = "tests/mlx5/verbs_check.c";
/// Iterations of every pingpong pair (C, Rust, and C against Rust; on both ports).
const ITERS: &str = "10000";

/// `cargo xtask mlx5 [--roce] [--] <command...>`: builds the model and runs the shell
/// command on it (`/bin/sh -c`, cwd = project root) in a fresh model dir, on a RoCE port with
/// `--roce` (else as `UVERBS_MLX5_MODEL_LINK` says, InfiniBand by default); returns its exit
/// status.
pub fn run(args: &[String]) -> Result<ExitCode> {
    let (roce, args) = match args.split_first() {
        Some((first, rest)) if first == "--roce" => (true, rest.strip_prefix(&["--".to_string()][..]).unwrap_or(rest)),
        _ => (false, args),
    };
    // `cargo xtask mlx5 --step`: only the mlx5 step of `cargo xtask test`, on the host;
    // `--step --roce`: only its RoCE items.
    if args.first().is_some_and(|a| a == "--step") {
        let results = match &args[1..] {
            [] => test_step(),
            [r] if r == "--roce" => test_step_on(true),
            _ => bail!("usage: cargo xtask mlx5 --step [--roce]"),
        };
        let failed = results.iter().filter(|c| c.result.is_err()).count();
        for c in &results {
            say!("{} {}", if c.result.is_ok() { "PASS" } else { "FAIL" }, c.name);
        }
        say!("mlx5 model: {} passed, {failed} failed", results.len() - failed);
        return Ok(if failed == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let command = shell_command(args)?;
    let lib = build_model()?;
    let dir = fresh_dir()?;
    note!("xtask: mlx5 model dir {}", dir.display());
    let mut c = Command::new("/bin/sh");
    c.args(["-c", &command]);
    on_model(&mut c, &lib, &dir);
    if roce {
        c.env(ENV_LINK, "eth");
    }
    let st = proc::status(&mut c)?;
    if st.success() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(ExitCode::from(st.code().unwrap_or(128).clamp(0, 255) as u8))
}

/// The command line `cargo xtask mlx5` runs: its arguments joined by spaces, as `guest` does.
fn shell_command(args: &[String]) -> Result<String> {
    if args.is_empty() {
        bail!(
            "`cargo xtask mlx5` needs a command to run on the mlx5 model\n{}",
            crate::USAGE
        );
    }
    Ok(args.join(" "))
}

/// Builds the model crate; returns the interposer's absolute path. Fails, saying so, where
/// the crate is not in this tree.
pub fn build_model() -> Result<PathBuf> {
    build_model_in(false)
}

/// [`build_model`], optimized with `release` (the benchmarks: the device runs faster under
/// valgrind, and its work is outside what they measure).
pub fn build_model_in(release: bool) -> Result<PathBuf> {
    require_model_crate(&paths::root())?;
    let mut c = crate::toolchain::cargo();
    c.args(["build", "-p", MODEL_PACKAGE]);
    if release {
        c.arg("--release");
    }
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c)?;
    let profile = if release { "release" } else { "debug" };
    let lib = paths::target_dir().join(profile).join(MODEL_LIB);
    if !lib.is_file() {
        bail!("`cargo build -p {MODEL_PACKAGE}` made no {}", lib.display());
    }
    Ok(lib)
}

fn require_model_crate(root: &Path) -> Result<()> {
    if !root.join(MODEL_MANIFEST).is_file() {
        bail!(
            "the mlx5 model crate is not in this tree: {MODEL_MANIFEST} is missing \
             (package {MODEL_PACKAGE})"
        );
    }
    Ok(())
}

/// Points `c` at the model: the dir, the interposer, the project root as cwd.
pub fn on_model(c: &mut Command, lib: &Path, dir: &Path) {
    c.env(ENV_DIR, dir).env("LD_PRELOAD", lib).current_dir(paths::root());
}

fn model_root() -> PathBuf {
    paths::target_dir().join("mlx5-model")
}

/// A new, empty model dir of this process; first removes those of processes that are gone.
pub fn fresh_dir() -> Result<PathBuf> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let root = model_root();
    if let Ok(d) = std::fs::read_dir(&root) {
        for e in d.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().unwrap_or_default();
            if pid != std::process::id().to_string() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// One item of the step and how it ended (`Err` says why it failed).
pub struct Checked {
    pub name: String,
    pub result: std::result::Result<(), String>,
}

/// The host step of `cargo xtask test` (when [`enabled`]): builds the model, then runs
/// `ibv_devices`, `ibv_devinfo -v`, ibv_rc_pingpong pairs (`-s 1`, `-s 60`, `-s 4096`, `-e`),
/// an ibv_uc_pingpong pair, ibv_ud_pingpong pairs (without and with a GRH), an
/// ibv_srq_pingpong pair and verbs_check (one process, and two
/// processes) on it; then the
/// Rust demo and the Rust rc_pingpong against ibv_rc_pingpong both ways (the Rust core and
/// mlx5 provider, `--features mlx5`), the differential, then the integration tests of
/// [`SUITE`] on that provider; then the same on the model's RoCE port ([`roce_items`]); each
/// bounded by [`ENV_TIMEOUT`]. A model that is missing or does not build is one failed item
/// (never a skip).
pub fn test_step() -> Vec<Checked> {
    test_step_on(false)
}

/// The step; with `roce_only`, only its items on the RoCE port.
fn test_step_on(roce_only: bool) -> Vec<Checked> {
    let lib = match crate::packages::ensure().and_then(|()| build_model()) {
        Ok(lib) => lib,
        Err(e) => {
            return vec![Checked {
                name: "set-up: host packages, model build".into(),
                result: Err(e.to_string()),
            }]
        }
    };
    let limit = match env_number(ENV_TIMEOUT, ITEM_TIMEOUT) {
        Ok(s) => Duration::from_secs(s.into()),
        Err(e) => {
            return vec![Checked {
                name: "settings".into(),
                result: Err(e.to_string()),
            }]
        }
    };
    let step = Step {
        lib,
        limit,
        link: Some("ib"),
    };
    let mut out = Vec::new();
    // `UVERBS_MLX5_ONLY=<text>`: only the items whose name holds it (and the port query the
    // others read the link layer from), for running one item by hand.
    let only = std::env::var("UVERBS_MLX5_ONLY").ok();
    let mut check = |name: String, f: &mut dyn FnMut(&Path) -> std::result::Result<(), String>| {
        if only
            .as_deref()
            .is_some_and(|o| !name.contains(o) && !name.starts_with("ibv_devinfo"))
        {
            return;
        }
        note!("==== mlx5 model: {name}");
        let result = step.item(f);
        if let Err(why) = &result {
            note!("xtask: mlx5 model: FAIL {name}: {why}");
        }
        out.push(Checked { name, result });
    };
    if roce_only {
        let roce = Step {
            lib: step.lib.clone(),
            limit: step.limit,
            link: Some("eth"),
        };
        roce_items(&roce, &build_rust_examples(), &mut check);
        return out;
    }

    check("ibv_devices lists mlx5_0".into(), &mut |dir| {
        let text = step.output(dir, "ibv_devices", &["ibv_devices"])?;
        lists_device(&text)
            .then_some(())
            .ok_or(format!("no {DEVICE} in:\n{text}"))
    });
    let mut link = Link::Unknown;
    check("ibv_devinfo -v shows mlx5_0, port 1 ACTIVE".into(), &mut |dir| {
        let text = step.output(dir, "ibv_devinfo", &["ibv_devinfo", "-v", "-d", DEVICE])?;
        let info = devinfo(&text);
        link = info.link;
        match (info.hca, info.port1_active) {
            (true, true) => Ok(()),
            (false, _) => Err(format!("no `hca_id: {DEVICE}` in:\n{text}")),
            (true, false) => Err(format!("port 1 is not PORT_ACTIVE:\n{text}")),
        }
    });
    // RoCE needs a GID (index 0 on the model); InfiniBand uses LIDs.
    let gid: &[&str] = if link == Link::Ethernet { &["-g", "0"] } else { &[] };
    let mut pingpongs: Vec<(&str, &[&str])> = vec![
        ("ibv_rc_pingpong", &["-s", "1"]),
        ("ibv_rc_pingpong", &["-s", "60"]),
        ("ibv_rc_pingpong", &["-s", "4096"]),
        ("ibv_rc_pingpong", &["-e"]),
        ("ibv_uc_pingpong", &[]),
        // UD through address handles (libmlx5 builds the address vector itself on
        // InfiniBand); 40 bytes of GRH room ahead of every receive.
        ("ibv_ud_pingpong", &[]),
    ];
    if link != Link::Ethernet {
        // With a GRH on InfiniBand: the AV asks for one, the receiver finds it in those 40
        // bytes (RoCE always has one: the item above).
        pingpongs.push(("ibv_ud_pingpong", &["-g", "0"]));
    }
    for (program, extra) in pingpongs {
        let mut args: Vec<&str> = vec![program, "-d", DEVICE, "-n", ITERS];
        args.extend(gid);
        args.extend(extra);
        check(format!("{} pair", args.join(" ")), &mut |dir| {
            let port = free_port()?;
            let server: Vec<String> = args
                .iter()
                .map(|s| s.to_string())
                .chain(["-p".into(), port.to_string()])
                .collect();
            let mut client = server.clone();
            client.push("127.0.0.1".into());
            let (s, c) = step.pair(dir, port, &server, &client)?;
            let done = format!("{ITERS} iters");
            for (side, text) in [("server", &s), ("client", &c)] {
                if !text.contains(&done) {
                    return Err(format!("the {side} exited 0 without reporting {done}"));
                }
            }
            Ok(())
        });
    }
    check(format!("ibv_srq_pingpong -d {DEVICE} -n {ITERS} pair"), &mut |dir| {
        srq_pingpong(&step, dir, gid)
    });
    verbs_check_items(&step, "", &mut check);
    // The Rust core with the Rust mlx5 provider on the model.
    let rust = build_rust_examples();
    check(
        "Rust demo (Rust mlx5 provider): RC send/recv, RDMA write and read, UD".into(),
        &mut |dir| {
            let (demo, _) = rust.clone()?;
            let text = step.output(dir, "demo", &[demo.as_str()])?;
            let lines = ["every payload checked", "bytes match", "UD: 10 datagrams"];
            match lines.iter().all(|l| text.contains(l)) {
                true => Ok(()),
                false => Err(format!(
                    "the demo exited 0 without its RC and UD lines:\n{}",
                    tail(&text, 20)
                )),
            }
        },
    );
    for rust_serves in [true, false] {
        let name = match rust_serves {
            true => format!("rc_pingpong (Rust) server, ibv_rc_pingpong client, -n {ITERS}"),
            false => format!("ibv_rc_pingpong server, rc_pingpong (Rust) client, -n {ITERS}"),
        };
        check(name, &mut |dir| {
            let (_, rust_pp) = rust.clone()?;
            let port = free_port()?.to_string();
            let args = |program: &str| -> Vec<String> {
                [program, "-d", DEVICE, "-n", ITERS, "-p", &port]
                    .map(String::from)
                    .to_vec()
            };
            let (mut server, mut client) = match rust_serves {
                true => (args(&rust_pp), args("ibv_rc_pingpong")),
                false => (args("ibv_rc_pingpong"), args(&rust_pp)),
            };
            if link == Link::Ethernet {
                server.extend(["-g".into(), "0".into()]);
                client.extend(["-g".into(), "0".into()]);
            }
            client.push("127.0.0.1".into());
            let port = port.parse().map_err(|_| "port".to_string())?;
            let (s, c) = step.pair(dir, port, &server, &client)?;
            let done = format!("{ITERS} iters");
            for (side, text) in [("server", &s), ("client", &c)] {
                if !text.contains(&done) {
                    return Err(format!("the {side} exited 0 without reporting {done}"));
                }
            }
            Ok(())
        });
    }
    // The differential against libmlx5: WQE bytes, doorbells, completions and driver data
    // (mlx5_diff.rs).
    differential(&step, "", &mut check);
    integration_suite(&step, None, &mut check);
    let roce = Step {
        lib: step.lib.clone(),
        limit: step.limit,
        link: Some("eth"),
    };
    roce_items(&roce, &rust, &mut check);
    out
}

/// What the RoCE run of [`SUITE`] sets differently: the long random runs are shorter there
/// (`soak` 20,000 work requests instead of 100,000, `safe_fuzz` 500 rounds instead of 2,500), as
/// posting and polling past their setup are the same on both ports and the InfiniBand run
/// has the long form. Everything else runs on both with the same settings.
const ROCE_SHORTER: &[(&str, &str)] = &[
    ("soak", "UVERBS_SOAK_WRS=20000"),
    ("safe_fuzz", "UVERBS_SAFE_FUZZ_ROUNDS=500"),
];

/// The step's items on the model's RoCE port (`UVERBS_MLX5_MODEL_LINK=eth`): `ibv_devinfo`
/// shows an Ethernet port with RoCE v1 and v2 GIDs; Debian's pingpongs with `-g 1` (the
/// RoCE v2 GID of the link-local address: the kernel resolves the MAC through the model's
/// neighbour table) and `-c` (every payload checked); the Rust rc_pingpong against
/// ibv_rc_pingpong both ways and against itself at 1, 60 and 4096 bytes, and so the Rust
/// uc_pingpong, ud_pingpong and srq_pingpong against theirs (every pair [`ITERS`] iterations);
/// ibv_rc_pingpong with completion
/// events (`-e`); the differential (both settings); verbs_check in one
/// process and in two; the demo; then [`SUITE`] (with [`ROCE_SHORTER`]). Each pingpong item
/// also fails if the model dropped a packet (`<dir>/drops-*`).
fn roce_items(
    step: &Step,
    rust: &std::result::Result<(String, String), String>,
    check: &mut dyn for<'a> FnMut(String, &'a mut ItemFn<'a>),
) {
    check(
        "RoCE: ibv_devinfo -v shows an Ethernet port with RoCE v1 and v2 GIDs".into(),
        &mut |dir| {
            let text = step.output(dir, "ibv_devinfo", &["ibv_devinfo", "-v", "-d", DEVICE])?;
            let info = devinfo(&text);
            let wanted = ["GID[  0]:", ", RoCE v1", "GID[  1]:", ", RoCE v2", "::ffff:10.77."];
            match (info.port1_active, info.link) {
                (true, Link::Ethernet) if wanted.iter().all(|w| text.contains(w)) => Ok(()),
                _ => Err(format!(
                    "not an active Ethernet port with RoCE GIDs:\n{}",
                    tail(&text, 12)
                )),
            }
        },
    );
    // (server, client, extra arguments, iterations)
    type Pair<'a> = (String, String, &'a [&'a str], &'a str);
    let pairs: Vec<Pair> = {
        let c = |p: &str| p.to_string();
        let sizes = [&["-s", "1"][..], &["-s", "60"], &["-s", "4096"]];
        let mut v: Vec<Pair> = Vec::new();
        for size in sizes {
            v.push((c("ibv_rc_pingpong"), c("ibv_rc_pingpong"), size, ITERS));
        }
        v.push((c("ibv_rc_pingpong"), c("ibv_rc_pingpong"), &["-e"], ITERS));
        v.push((c("ibv_uc_pingpong"), c("ibv_uc_pingpong"), &[], ITERS));
        v.push((c("ibv_ud_pingpong"), c("ibv_ud_pingpong"), &[], ITERS));
        v.push((c("ibv_srq_pingpong"), c("ibv_srq_pingpong"), &[], ITERS));
        if let Ok((_, rust_rc)) = rust {
            for pp in RUST_PINGPONGS {
                let ours = rust_rc.replace("rc_pingpong", pp);
                let theirs = format!("ibv_{pp}");
                for size in sizes {
                    v.push((ours.clone(), theirs.clone(), size, ITERS));
                    v.push((theirs.clone(), ours.clone(), size, ITERS));
                    v.push((ours.clone(), ours.clone(), size, ITERS));
                }
            }
        }
        v
    };
    let short = |p: &str| match p.rsplit('/').next() {
        Some(name) if p.contains('/') => format!("{name} (Rust)"),
        _ => p.to_string(),
    };
    if let Err(e) = rust {
        check("RoCE: the Rust pingpongs".into(), &mut |_| Err(e.clone()));
    }
    for (server, client, extra, iters) in pairs {
        let name = format!(
            "RoCE: {} server, {} client, -g 1 -c -n {iters} {}",
            short(&server),
            short(&client),
            extra.join(" ")
        );
        check(name, &mut |dir| {
            let port = free_port()?;
            let args = |program: &str| -> Vec<String> {
                [
                    program,
                    "-d",
                    DEVICE,
                    "-g",
                    "1",
                    "-c",
                    "-n",
                    iters,
                    "-p",
                    &port.to_string(),
                ]
                .iter()
                .chain(extra)
                .map(|s| s.to_string())
                .collect()
            };
            let mut client_args = args(&client);
            client_args.push("127.0.0.1".into());
            let (s, c) = step.pair(dir, port, &args(&server), &client_args)?;
            let done = format!("{iters} iters");
            for (side, text) in [("server", &s), ("client", &c)] {
                if !text.contains(&done) {
                    return Err(format!("the {side} exited 0 without reporting {done}"));
                }
            }
            no_drops(dir)
        });
    }
    differential(step, "RoCE: ", check);
    verbs_check_items(step, "RoCE: ", check);
    check(
        "RoCE: Rust demo (RC over a RoCE v2 GID, UD through a RoCE address handle)".into(),
        &mut |dir| {
            let (demo, _) = rust.clone()?;
            let text = step.output(dir, "demo", &[demo.as_str()])?;
            let lines = [
                "link layer ETHERNET",
                "every payload checked",
                "bytes match",
                "UD: 10 datagrams",
            ];
            match lines.iter().all(|l| text.contains(l)) {
                true => no_drops(dir),
                false => Err(format!("the demo exited 0 without its lines:\n{}", tail(&text, 20))),
            }
        },
    );
    integration_suite(step, Some(ROCE_SHORTER), check);
}

/// The differential's two items on `step`'s port (names prefixed by `on`): one seeded script
/// through libmlx5 and through the Rust provider in each of [`crate::mlx5_diff::SETTINGS`];
/// same WQE bytes, doorbells and completions, then the driver requests but for the listed
/// differences. On the RoCE port the script's paths carry a GRH (mlx5_diff.rs).
fn differential(step: &Step, on: &str, check: &mut dyn for<'a> FnMut(String, &'a mut ItemFn<'a>)) {
    let roce = step.link == Some("eth");
    let model = |c: &mut Command, dir: &Path| {
        on_model(c, &step.lib, dir);
        if let Some(link) = step.link {
            c.env(ENV_LINK, link);
        }
    };
    let mut runs = Vec::new();
    check(
        format!("{on}differential: same WQE bytes, doorbells and completions as libmlx5 (Rust mlx5 provider)"),
        &mut |dir| {
            for setting in 0..crate::mlx5_diff::SETTINGS.len() {
                let r = crate::mlx5_diff::run_both(dir, &|c| model(c, dir), step.limit, setting, roce)?;
                note!("xtask: {}", crate::mlx5_diff::check_rings(&r, setting)?);
                runs.push(r);
            }
            Ok(())
        },
    );
    check(
        format!("{on}differential: driver requests equal libmlx5's but for the listed differences"),
        &mut |_| {
            if runs.is_empty() {
                return Err("no runs: the item before failed".into());
            }
            for r in &runs {
                for line in crate::mlx5_diff::compare_commands(&r.c.trace, &r.rust.trace, r.roce)? {
                    note!("xtask:   {line}");
                }
            }
            Ok(())
        },
    );
}

/// Fails when the model dropped a packet in `dir`'s run for a reason that says a header was
/// wrong (it writes `drops-<LID>`, one `reason count` line per reason, when it drops one).
/// Packets for a QP that is gone or no longer receiving (`dest_qpn`, `qp_state`) are left
/// out: a pingpong may end with requests in flight to a peer that already exited
/// (`ibv_srq_pingpong` posts a whole round to its 16 QPs), which a device drops too.
fn no_drops(dir: &Path) -> std::result::Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| e.to_string())?;
    let mut found = String::new();
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with("drops-") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            for line in text.lines() {
                if !line.starts_with("dest_qpn ") && !line.starts_with("qp_state ") {
                    found.push_str(line);
                    found.push('\n');
                }
            }
        }
    }
    match found.is_empty() {
        true => Ok(()),
        false => Err(format!("the model dropped packets:\n{found}")),
    }
}

/// The integration tests (`tests/<name>.rs`) run on the model, each with the words its command
/// line starts with (`VAR=value` settings) and ends with (test arguments). The same
/// sources as on rxe in the guest; where mlx5 truly differs the tests ask `common::driver`
/// (docs/mlx5-model.md lists each difference). Not here: `async_events` (rxe devices made
/// through RDMA netlink), `two_hosts` (rxe on a veth pair), `provider_contract` (its stub
/// provider speaks rxe's driver ABI).
const SUITE: &[(&str, &[&str], &[&str])] = &[
    ("discovery", &[], &[]),
    ("rc", &[], &[]),
    ("uc", &[], &[]),
    ("atomics", &[], &[]),
    ("cq", &[], &[]),
    ("bad_input", &[], &[]),
    ("faults", &[], &[]),
    ("threads", &[], &[]),
    ("leaks", &[], &[]),
    ("no_alloc", &[], &[]),
    ("qp_attr", &[], &[]),
    ("srq", &[], &[]),
    // The safe posts (`Qp::send_buf`, `recv_buf`, `reclaim`, the refusal of RESET).
    ("owned", &[], &[]),
    // A region dropped while a responder might hold it (deregistered at once on mlx5).
    ("responder_mr", &[], &[]),
    // dma-buf regions: the model maps a memfd as the exporter's buffer.
    ("dmabuf", &[], &[]),
    // The safe receives on an SRQ (`Srq::recv_buf`, `reclaim`).
    ("srq_owned", &[], &[]),
    // SRQs as only mlx5 has them (the kernel driver refuses resize): built with the feature.
    ("mlx5_srq", &[], &[]),
    // BlueFlame on shared bfregs: the model with write combining checks every copy.
    ("mlx5_bf", &["UVERBS_MLX5_MODEL_WC=1"], &[]),
    ("ud", &[], &[]),
    // 100,000 sends one at a time, each awaited: it passes, in 512 s on the model (run by
    // hand), past the item limit.
    ("aio", &[], &["--skip", "a_hundred_thousand_completions_awaited"]),
    // The short form: 100,000 work requests (500,000 on rxe in CI).
    ("soak", &["UVERBS_SOAK_WRS=100000"], &[]),
    // Random sequences of safe calls: a fixed 2,500 rounds, stopped at 120 s on a busy host
    // (`UVERBS_SAFE_FUZZ_ROUNDS`, or `UVERBS_SAFE_FUZZ_SECONDS` to explore).
    ("safe_fuzz", &[], &[]),
];

/// What one item of the step runs, given its model dir.
type ItemFn<'a> = dyn FnMut(&Path) -> std::result::Result<(), String> + 'a;

/// Builds the integration tests with `--features mlx5` and runs each of [`SUITE`] (on the
/// RoCE port, `roce`: with the settings it replaces) on the model (the Rust core with the Rust mlx5 provider), one item per test
/// binary, `--test-threads=1`; then, for the whole suite, `tests/discovery.rs` built
/// without the mlx5 feature.
fn integration_suite(
    step: &Step,
    roce: Option<&[(&str, &str)]>,
    check: &mut dyn for<'a> FnMut(String, &'a mut ItemFn<'a>),
) {
    let on = match step.link {
        Some("eth") => "RoCE: ",
        _ => "",
    };
    let mut c = crate::toolchain::cargo();
    c.args([
        "test",
        "-p",
        "uverbs",
        "--features",
        "mlx5",
        "--tests",
        "--no-run",
        "--message-format=json",
    ]);
    let built = crate::json::cargo_executables(&mut c)
        .map_err(|e| format!("the tests do not build with the mlx5 provider: {e}"));
    for (name, env, args) in SUITE {
        // On the RoCE port a test's setting may be replaced by a shorter one.
        let shorter = roce.and_then(|r| r.iter().find(|(n, _)| n == name)).map(|(_, v)| [*v]);
        let env: &[&str] = match &shorter {
            Some(v) => v,
            None => env,
        };
        check(format!("{on}tests/{name}.rs (Rust mlx5 provider)"), &mut |dir| {
            let bins = built.as_ref().map_err(Clone::clone)?;
            let exe = bins
                .iter()
                .find(|e| e.is("test") && e.name == *name)
                .ok_or(format!("cargo built no test `{name}`"))?;
            let argv: Vec<&str> = ["env"]
                .into_iter()
                .chain(env.iter().copied())
                .chain([exe.path.as_str(), "--test-threads=1"])
                .chain(args.iter().copied())
                .collect();
            let text = step.output(dir, name, &argv)?;
            passed(&text)
        });
    }
    if roce.is_some() {
        return;
    }
    // The model's device is one that a build without the mlx5 provider has no provider for:
    // `uverbs::open` must say so with `Error::NoProvider`.
    check(
        "tests/discovery.rs without the mlx5 feature (no provider)".into(),
        &mut |dir| {
            let mut c = crate::toolchain::cargo();
            let args = [
                "--no-default-features",
                "--test",
                "discovery",
                "--no-run",
                "--message-format=json",
            ];
            c.args(["test", "-p", "uverbs"]).args(args);
            let bins = crate::json::cargo_executables(&mut c).map_err(|e| e.to_string())?;
            let exe = bins
                .iter()
                .find(|e| e.is("test") && e.name == "discovery")
                .ok_or("cargo built no test `discovery`")?;
            let text = step.output(dir, "discovery", &[exe.path.as_str(), "--test-threads=1"])?;
            passed(&text)
        },
    );
}

/// Whether a test binary's output says every test passed.
fn passed(text: &str) -> std::result::Result<(), String> {
    match text.contains("test result: ok.") {
        true => Ok(()),
        false => Err(format!("no `test result: ok.` line:\n{}", tail(text, 20))),
    }
}

/// Debian's ibv_srq_pingpong pair (16 RC QPs receiving from one SRQ): both must report
/// [`ITERS`] iterations.
fn srq_pingpong(step: &Step, dir: &Path, gid: &[&str]) -> std::result::Result<(), String> {
    let port = free_port()?.to_string();
    let server: Vec<String> = ["ibv_srq_pingpong", "-d", DEVICE, "-n", ITERS, "-p", &port]
        .iter()
        .chain(gid)
        .map(|s| s.to_string())
        .collect();
    let client: Vec<String> = server.iter().cloned().chain(["127.0.0.1".into()]).collect();
    let (s, c) = step.pair(dir, port.parse().map_err(|_| "port".to_string())?, &server, &client)?;
    let done = format!("{ITERS} iters");
    let silent = [("server", &s), ("client", &c)]
        .into_iter()
        .find(|(_, t)| !t.contains(&done));
    match silent {
        Some((side, _)) => Err(format!("the {side} exited 0 without reporting {done}")),
        None => Ok(()),
    }
}

/// The Rust ports of the pingpongs (`examples/pingpong`), as the C tools are named without
/// their `ibv_` prefix.
const RUST_PINGPONGS: [&str; 4] = ["rc_pingpong", "uc_pingpong", "ud_pingpong", "srq_pingpong"];

/// Builds the demo and the pingpong examples ([`RUST_PINGPONGS`]) with the mlx5 provider;
/// the demo's path and the rc_pingpong's (the others lie next to it).
fn build_rust_examples() -> std::result::Result<(String, String), String> {
    let mut c = crate::toolchain::cargo();
    c.args(["build", "--features", "mlx5", "--example", "demo"]);
    for pp in RUST_PINGPONGS {
        c.args(["--example", pp]);
    }
    note!("xtask: {}", proc::describe(&c));
    proc::check(&mut c).map_err(|e| format!("the Rust examples do not build with the mlx5 provider: {e}"))?;
    let dir = paths::target_dir().join("debug").join("examples");
    let path = |name: &str| dir.join(name).to_string_lossy().into_owned();
    Ok((path("demo"), path("rc_pingpong")))
}

/// What one step run shares: the interposer, the per-item limit, and the model's link
/// layer (`UVERBS_MLX5_MODEL_LINK`: `ib` or `eth`; `None` leaves it to the environment).
struct Step {
    lib: PathBuf,
    limit: Duration,
    link: Option<&'static str>,
}

impl Step {
    /// Runs one item in a fresh model dir; removes the dir if it passed, names it if not.
    fn item(&self, f: &mut dyn FnMut(&Path) -> std::result::Result<(), String>) -> std::result::Result<(), String> {
        let dir = fresh_dir().map_err(|e| e.to_string())?;
        let result = f(&dir);
        match &result {
            Ok(()) => {
                let _ = std::fs::remove_dir_all(&dir);
            }
            Err(_) => note!("xtask: mlx5 model: outputs kept in {}", dir.display()),
        }
        result
    }

    /// `argv` on the model under `timeout`, stdout and stderr into `<dir>/<name>.out`.
    fn spawn(&self, dir: &Path, name: &str, argv: &[String]) -> std::result::Result<Child, String> {
        let path = dir.join(format!("{name}.out"));
        let out = std::fs::File::create(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut c = Command::new("timeout");
        c.args(["-k", "10", &self.limit.as_secs().to_string()])
            .args(argv)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        on_model(&mut c, &self.lib, dir);
        if let Some(link) = self.link {
            c.env(ENV_LINK, link);
        }
        c.spawn()
            .map_err(|e| format!("cannot start `{}`: {e}", proc::describe(&c)))
    }

    /// Runs `argv` to the end; its output if it exited 0.
    fn output(&self, dir: &Path, name: &str, argv: &[&str]) -> std::result::Result<String, String> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let mut child = self.spawn(dir, name, &argv)?;
        let st = child.wait().map_err(|e| e.to_string())?;
        let text = read_out(dir, name);
        if !st.success() {
            return Err(format!(
                "`{}` {}: {}\n{}",
                describe_argv(&argv),
                exit_text(st.code()),
                last_line(&text),
                tail(&text, 20)
            ));
        }
        Ok(text)
    }

    /// A server and a client: the client starts once the server listens on `port`; both must
    /// exit 0. Returns (server output, client output).
    fn pair(
        &self,
        dir: &Path,
        port: u16,
        server: &[String],
        client: &[String],
    ) -> std::result::Result<(String, String), String> {
        let mut s = self.spawn(dir, "server", server)?;
        let start = Instant::now();
        while !listening(port) {
            if let Ok(Some(st)) = s.try_wait() {
                let text = read_out(dir, "server");
                return Err(format!(
                    "the server ended ({}) before listening on port {port}: {}\n{}",
                    exit_text(st.code()),
                    last_line(&text),
                    tail(&text, 20)
                ));
            }
            if start.elapsed() > self.limit.min(Duration::from_secs(60)) {
                stop(&mut s);
                return Err(format!(
                    "the server did not listen on port {port} within {:?}",
                    start.elapsed()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let crc = self.spawn(dir, "client", client)?.wait().map_err(|e| e.to_string())?;
        // A server whose client failed may wait for it forever: give it 10 s, then stop it.
        let deadline = Instant::now()
            + if crc.success() {
                self.limit
            } else {
                Duration::from_secs(10)
            };
        let src = loop {
            match s.try_wait() {
                Ok(Some(st)) => break Some(st),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    stop(&mut s);
                    break None;
                }
            }
        };
        let (so, co) = (read_out(dir, "server"), read_out(dir, "client"));
        match (src.map(|s| s.code()), crc.code()) {
            (Some(Some(0)), Some(0)) => Ok((so, co)),
            (sc, cc) => Err(format!(
                "server {}, client {}: {}\n---- server\n{}\n---- client\n{}",
                sc.map_or("stopped after its client failed".into(), exit_text),
                exit_text(cc),
                last_line(if cc == Some(0) { &so } else { &co }),
                tail(&so, 15),
                tail(&co, 15)
            )),
        }
    }
}

/// Stops a `timeout` child and the program under it (`timeout` passes SIGTERM on).
fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .args(["-s", "TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
}

fn read_out(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default()
}

fn describe_argv(argv: &[String]) -> String {
    argv.iter().map(|a| sh_quote(a)).collect::<Vec<_>>().join(" ")
}

/// An exit code in words; 124 is `timeout`'s.
fn exit_text(code: Option<i32>) -> String {
    match code {
        Some(0) => "exit 0".into(),
        Some(124) | Some(137) => "timed out".into(),
        Some(c) => format!("exit status {c}"),
        None => "killed by a signal".into(),
    }
}

/// The last non-blank line of an output, for one-line reports.
fn last_line(text: &str) -> &str {
    text.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no output)")
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A TCP port free on 127.0.0.1 right now.
fn free_port() -> std::result::Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free TCP port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

/// Whether some socket listens on TCP `port` (IPv4 or IPv6), from /proc/net.
fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .any(|f| std::fs::read_to_string(f).is_ok_and(|t| listens_on(&t, port)))
}

/// Whether a /proc/net/tcp{,6} table has a LISTEN (state 0A) socket on local `port`.
fn listens_on(table: &str, port: u16) -> bool {
    table.lines().skip(1).any(|l| {
        let mut f = l.split_whitespace();
        let local = f.nth(1).unwrap_or_default();
        let state = f.nth(1).unwrap_or_default();
        state == "0A" && local.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
    })
}

/// Whether `ibv_devices` output lists the model's device.
fn lists_device(text: &str) -> bool {
    text.lines().any(|l| l.split_whitespace().next() == Some(DEVICE))
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Link {
    Unknown,
    InfiniBand,
    Ethernet,
}

/// What the step needs from `ibv_devinfo -v -d mlx5_0`.
#[derive(Debug, PartialEq)]
struct DevInfo {
    hca: bool,
    port1_active: bool,
    link: Link,
}

fn devinfo(text: &str) -> DevInfo {
    let mut info = DevInfo {
        hca: false,
        port1_active: false,
        link: Link::Unknown,
    };
    let mut port = 0;
    for l in text.lines() {
        let mut kv = l.trim().splitn(2, ':');
        let (key, value) = (kv.next().unwrap_or_default(), kv.next().unwrap_or_default().trim());
        match key {
            "hca_id" => info.hca |= value == DEVICE,
            "port" => port = value.parse().unwrap_or(0),
            "state" if port == 1 => info.port1_active = value.starts_with("PORT_ACTIVE"),
            "link_layer" if port == 1 => {
                info.link = match value {
                    "InfiniBand" => Link::InfiniBand,
                    "Ethernet" => Link::Ethernet,
                    _ => Link::Unknown,
                }
            }
            _ => {}
        }
    }
    info
}

/// The verbs_check items on `step`'s port, named after `on` (`""` or `"RoCE: "`): one process
/// with two contexts, then a server and a client process.
fn verbs_check_items(step: &Step, on: &str, check: &mut dyn for<'a> FnMut(String, &'a mut ItemFn<'a>)) {
    let exe = compile_verbs_check();
    check(format!("{on}verbs_check (one process, two contexts)"), &mut |dir| {
        let exe = exe.clone()?;
        let text = step.output(dir, "verbs_check", &[exe.as_str(), "-d", DEVICE])?;
        verbs_check_passed(&text)
    });
    check(format!("{on}verbs_check (two processes)"), &mut |dir| {
        let exe = exe.clone()?;
        let port = free_port()?;
        let p = port.to_string();
        let server = [exe.as_str(), "-d", DEVICE, "-S", "-p", &p].map(String::from);
        let client = [exe.as_str(), "-d", DEVICE, "-p", &p, "127.0.0.1"].map(String::from);
        let (_, c) = step.pair(dir, port, &server, &client)?;
        verbs_check_passed(&c)
    });
}

/// Compiles verbs_check with gcc against libibverbs; its path, or why it does not build.
fn compile_verbs_check() -> std::result::Result<String, String> {
    let out_dir = paths::target_dir().join("mlx5-check");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let exe = out_dir.join("verbs_check");
    let mut c = Command::new("gcc");
    c.args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(paths::root().join(VERBS_CHECK_C))
        .arg("-libverbs");
    note!("xtask: {}", proc::describe(&c));
    proc::filter(&mut c, b"", &[0]).map_err(|e| format!("{VERBS_CHECK_C} does not compile: {e}"))?;
    Ok(exe.to_string_lossy().into_owned())
}

/// Passes when verbs_check's last line counts at least one pass and no failure.
fn verbs_check_passed(text: &str) -> std::result::Result<(), String> {
    let counts = text.lines().rev().find_map(|l| {
        let rest = l.strip_prefix("verbs_check: ")?;
        let (p, f) = rest.split_once(" passed, ")?;
        Some((p.parse::<u32>().ok()?, f.strip_suffix(" failed")?.parse::<u32>().ok()?))
    });
    let fails: Vec<&str> = text.lines().filter(|l| l.starts_with("FAIL ")).collect();
    match counts {
        Some((p, 0)) if p > 0 && fails.is_empty() => Ok(()),
        Some((p, f)) => Err(format!(
            "verbs_check: {p} passed, {f} failed{}\n{}",
            fails.first().map_or(String::new(), |l| format!("; first {l}")),
            fails.join("\n")
        )),
        None => Err(format!(
            "no `verbs_check: N passed, M failed` line:\n{}",
            tail(text, 20)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_the_arguments_joined() {
        assert!(shell_command(&[]).is_err());
        let args = ["ibv_devinfo", "-v", "&&", "echo ok"].map(String::from);
        assert_eq!(shell_command(&args).unwrap(), "ibv_devinfo -v && echo ok");
    }

    #[test]
    fn parses_ibv_devices_and_ibv_devinfo() {
        let devices = "    device          \t   node GUID\n    ------          \t----------------\n    mlx5_0          \t0002c90300fed670\n";
        assert!(lists_device(devices));
        assert!(!lists_device("    device\n    mlx5_01 x\n"));
        let info = "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n\t\t\tlink_layer:\t\tEthernet\n\t\tport:\t2\n\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tlink_layer:\t\tInfiniBand\n";
        assert_eq!(
            devinfo(info),
            DevInfo {
                hca: true,
                port1_active: true,
                link: Link::Ethernet
            }
        );
        let down = "hca_id:\trxe0\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tlink_layer:\t\tInfiniBand\n";
        assert_eq!(
            devinfo(down),
            DevInfo {
                hca: false,
                port1_active: false,
                link: Link::InfiniBand
            }
        );
    }

    #[test]
    fn finds_listening_sockets_in_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 00000000:4853 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1\n   1: 0100007F:A3F2 0100007F:4853 01 00000000:00000000 00:00000000 00000000     0        0 2\n";
        assert!(listens_on(table, 0x4853));
        assert!(!listens_on(table, 0xa3f2), "an established socket does not listen");
        let v6 = "  sl  local_address                         remote_address                        st\n   0: 00000000000000000000000000000000:4853 00000000000000000000000000000000:0000 0A 0\n";
        assert!(listens_on(v6, 0x4853));
        assert!(!listens_on(v6, 0x4854));
    }

    #[test]
    fn verbs_check_needs_its_count_line_with_no_failure() {
        assert!(verbs_check_passed("PASS a\nPASS b\nverbs_check: 2 passed, 0 failed\n").is_ok());
        let e = verbs_check_passed("PASS a\nFAIL b: why\nverbs_check: 1 passed, 1 failed\n").unwrap_err();
        assert_eq!(
            e.lines().next(),
            Some("verbs_check: 1 passed, 1 failed; first FAIL b: why")
        );
        assert!(verbs_check_passed("FAIL setup: no device\nverbs_check: 0 passed, 1 failed\n").is_err());
        assert!(
            verbs_check_passed("verbs_check: 0 passed, 0 failed\n").is_err(),
            "nothing ran"
        );
        assert!(verbs_check_passed("PASS a\n").is_err(), "cut short");
    }

    #[test]
    fn drops_of_wrong_headers_fail_an_item_and_those_of_gone_qps_do_not() {
        let dir = std::env::temp_dir().join(format!("xtask-drops-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(no_drops(&dir).is_ok());
        std::fs::write(dir.join("drops-7"), "dest_qpn 1\nqp_state 2\n").unwrap();
        assert!(no_drops(&dir).is_ok());
        std::fs::write(dir.join("drops-9"), "dgid 3\n").unwrap();
        let err = no_drops(&dir).unwrap_err();
        assert!(err.contains("dgid 3") && !err.contains("dest_qpn"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn one_line_reports() {
        assert_eq!(last_line("a\nlast words\n\n  \n"), "last words");
        assert_eq!(last_line(""), "(no output)");
        assert_eq!(tail("1\n2\n3\n", 2), "2\n3");
    }

    #[test]
    fn exit_codes_in_words() {
        assert_eq!(exit_text(Some(124)), "timed out");
        assert_eq!(exit_text(Some(3)), "exit status 3");
        assert_eq!(exit_text(None), "killed by a signal");
    }

    #[test]
    fn a_missing_model_crate_is_an_error_not_a_skip() {
        let e = require_model_crate(Path::new("/nonexistent")).unwrap_err().to_string();
        assert!(e.contains(MODEL_MANIFEST), "{e}");
    }
}
