//! Checks the public struct layouts in [`crate::abi`], and the enum values of the `uverbs`
//! core that this provider passes to and from libibverbs unconverted ([`core_values`]),
//! against the installed `<infiniband/verbs.h>` by compiling and running a C program that
//! prints each number.
//! Fails where there is no C compiler or no libibverbs-dev headers (`cargo xtask test`
//! installs both).

use std::path::Path;
use std::process::Command;
use uverbs::{
    AccessFlags, MigState, Mtu, QpAttrMask, QpState, QpType, SendFlags, SrqAttrMask, WcFlags, WcOpcode, WcStatus,
    WrOpcode,
};

/// `(verbs.h name, value in the core)` of every enum value the core names that this provider
/// passes between libibverbs and the core unconverted: the core's values are the kernel's,
/// and these must be libibverbs' too.
fn core_values() -> Vec<(String, usize)> {
    let mut v = Vec::new();
    macro_rules! flags {
        ($prefix:literal, $flags:ty) => {
            v.extend(
                <$flags>::all()
                    .iter_names()
                    .map(|(name, f)| (format!("{}{name}", $prefix), f.bits() as usize)),
            );
        };
    }
    flags!("IBV_QP_", QpAttrMask);
    flags!("IBV_SRQ_", SrqAttrMask);
    flags!("IBV_ACCESS_", AccessFlags);
    flags!("IBV_SEND_", SendFlags);
    flags!("IBV_WC_", WcFlags);
    for raw in 0..=u8::MAX {
        let raw32 = u32::from(raw);
        let named = [
            WrOpcode(raw32).name().map(|n| format!("IBV_WR_{n}")),
            WcOpcode(raw32).name().map(|n| format!("IBV_WC_{n}")),
            WcStatus(raw32).name().map(|n| format!("IBV_WC_{n}")),
            MigState(raw32).name().map(|n| format!("IBV_MIG_{n}")),
            QpType::from_raw(raw).map(|t| format!("IBV_QPT_{t:?}")),
            QpState::from_raw(raw).map(|s| format!("IBV_QPS_{s:?}")),
            Mtu::from_raw(raw).map(|m| format!("IBV_MTU_{}", m.bytes())),
        ];
        v.extend(
            named
                .into_iter()
                .flatten()
                .map(|name| (name.to_uppercase(), usize::from(raw))),
        );
    }
    v
}

#[test]
fn matches_verbs_h() {
    let header = Path::new("/usr/include/infiniband/verbs.h");
    assert!(
        header.exists(),
        "{} is not installed: install libibverbs-dev (cargo xtask test does)",
        header.display()
    );
    let mut table = crate::abi::public_layouts();
    table.extend(core_values());
    let mut c =
        String::from("#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for (expr, _) in &table {
        c.push_str(&format!("    printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("    return 0;\n}\n");
    let dir = std::env::temp_dir().join(format!("uverbs-libibverbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` (install gcc): {e}"));
    assert!(
        built.status.success(),
        "compiling the layout check failed:\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let got: Vec<usize> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(got.len(), table.len());
    let wrong: Vec<String> = table
        .iter()
        .zip(&got)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C says {c}, Rust says {rust}"))
        .collect();
    assert!(wrong.is_empty(), "layout mismatches:\n{}", wrong.join("\n"));
}
