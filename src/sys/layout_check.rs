//! The kernel ABI structs checked against the installed kernel headers (`/usr/include/rdma`,
//! Debian's `linux-libc-dev`).
//!
//! Each file defining `#[repr(C)]` kernel structs invokes [`kernel_layouts!`] with the C
//! counterpart of each. That becomes a test, `kernel_layout::matches_kernel_headers`, which
//! compiles a C program printing every size and offset, and fails on any number that differs
//! from Rust's, on a `#[repr(C)]` item of the file without an entry, and on a missing C
//! compiler or header. [`every_file_with_kernel_structs_checks_them`] makes sure no file is
//! left out. The drop-in's own structs (`dropin/libibverbs`) are checked against
//! `<infiniband/verbs.h>` by that crate.

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The package installing the headers (`cargo xtask test` installs it).
const HEADERS_PACKAGE: &str = "linux-libc-dev";

/// `#[repr(C)]` items that are not the kernel's: (file, item, why).
const NOT_KERNEL: &[(&str, &str, &str)] = &[
    (
        "providers/rxe/queue.rs",
        "Line",
        "one cache line of a synthetic ring (tests, fuzzing)",
    ),
    ("providers/rxe/qp.rs", "Slot", "a test's stand-in for a ring slot"),
    ("src/mr.rs", "BufPart", "a safe post's buffer, its SGE first"),
    // libibverbs' `struct ibv_send_wr`, no kernel struct: the drop-in checks these against
    // `<infiniband/verbs.h>` (its `abi.rs` names them as its own `ibv_send_wr` parts).
    ("src/chain.rs", "CSendWr", "the head of libibverbs' struct ibv_send_wr"),
    ("src/chain.rs", "CSendArm", "ibv_send_wr.wr"),
    ("src/chain.rs", "CRdmaArm", "ibv_send_wr.wr.rdma"),
    ("src/chain.rs", "CAtomicArm", "ibv_send_wr.wr.atomic"),
    ("src/chain.rs", "CUdArm", "ibv_send_wr.wr.ud"),
];

/// Folders scanned for `#[repr(C)]` items, and those left out: crates of their own (the
/// drop-in checks its structs against `<infiniband/verbs.h>`; the mlx5 model's are asserted
/// at compile time and not yet against the headers).
const SCANNED: &[&str] = &["src", "providers"];
const SKIPPED: &[&str] = &["dropin/libibverbs", "tests/mlx5/model"];

/// Declares the kernel C counterpart of every `#[repr(C)]` item of the calling file and
/// generates the test comparing their layouts (module docs). Invoke under `#[cfg(test)]`.
///
/// ```text
/// kernel_layouts! {
///     headers: ["rdma/ib_user_verbs.h"],
///     use crate::wr::Sge;                          // items from elsewhere, if any
///     structs: {
///         Plain = "struct c_name" { a, b },        // sizeof, and offsetof of each field
///         Renamed = "struct c_name" { a = "c.path" },
///         Prefix = "C type" until "member" { .. }, // size: offsetof(C type, member)
///         Framed sized("C size") { a @ "C offset" },
///     },
///     unions: { Union = "C type" { arm } },        // unions are not checked for exhaustiveness
///     values: { RUST_CONST => "C expression" },
/// }
/// ```
///
/// A struct pattern naming the listed fields makes leaving one out a compile error.
/// `MEMBER_TYPE(type, member)` in a C type names the type of a member (an anonymous struct
/// or union).
macro_rules! kernel_layouts {
    (
        headers: [$($header:literal),+ $(,)?],
        $(use $import:path;)*
        $(structs: {$(
            $rust:ident $(= $c_type:literal)? $(until $end:literal)? $(sized($size:expr))? {
                $($field:ident $(= $c_path:literal)? $(@ $c_offset:expr)?),+ $(,)?
            }
        ),+ $(,)?},)?
        $(unions: {$(
            $union:ident = $u_type:literal { $($arm:ident $(= $a_path:literal)?),+ $(,)? }
        ),+ $(,)?},)?
        $(values: {$($value:expr => $v_expr:literal),+ $(,)?},)?
    ) => {
        mod kernel_layout {
            #[allow(unused_imports)]
            use super::*;
            $(use $import;)*
            #[allow(unused_imports)] // a file of values only uses neither
            use $crate::sys::layout_check::{optional, Item, Table};
            #[allow(unused_imports)]
            use ::core::mem::{offset_of, size_of};

            #[test]
            fn matches_kernel_headers() {
                let mut table = Table::new(file!(), &[$($header),+]);
                $($(
                    let _every_field_is_listed = |v: &$rust| {
                        let $rust { $($field: _),+ } = v;
                    };
                    let mut item = Item::new(
                        stringify!($rust),
                        optional(&[$($c_type)?]),
                        optional(&[$($end)?]),
                        [$(String::from($size))?].into_iter().next(),
                        size_of::<$rust>(),
                    );
                    $(item.field(
                        stringify!($field),
                        optional(&[$($c_path)?]),
                        [$(String::from($c_offset))?].into_iter().next(),
                        offset_of!($rust, $field),
                    );)+
                    table.push(item);
                )+)?
                $($(
                    let mut item = Item::new(stringify!($union), Some($u_type), None, None, size_of::<$union>());
                    $(item.field(stringify!($arm), optional(&[$($a_path)?]), None, offset_of!($union, $arm));)+
                    table.push(item);
                )+)?
                $($(table.value(stringify!($value), $value, $v_expr);)+)?
                table.check();
            }
        }
    };
}
pub(crate) use kernel_layouts;

/// The one element of `v`, if any: how the macro passes an optional literal.
pub(crate) fn optional(v: &[&'static str]) -> Option<&'static str> {
    v.first().copied()
}

/// One number C and Rust must agree on.
struct Number {
    /// The Rust side, for messages (`WorkCompletion.imm_data`).
    rust_name: String,
    /// A C expression of it (`offsetof(struct ib_uverbs_wc, ex.imm_data)`).
    c_expr: String,
    rust_value: u64,
}

/// One struct or union and its C counterpart.
pub(crate) struct Item {
    name: &'static str,
    c_type: Option<&'static str>,
    numbers: Vec<Number>,
}

impl Item {
    /// `name`'s size is `sized`, a C expression, if given; else the offset of `until` in
    /// `c_type` (a Rust struct mirroring the start of a C one); else `sizeof(c_type)`.
    pub(crate) fn new(
        name: &'static str,
        c_type: Option<&'static str>,
        until: Option<&str>,
        sized: Option<String>,
        rust_size: usize,
    ) -> Self {
        let mut item = Self {
            name,
            c_type,
            numbers: Vec::new(),
        };
        let c_expr = match (sized, until) {
            (Some(expr), _) => expr,
            (None, Some(member)) => format!("offsetof({}, {member})", item.c_type()),
            (None, None) => format!("sizeof({})", item.c_type()),
        };
        item.numbers.push(Number {
            rust_name: format!("size of {name}"),
            c_expr,
            rust_value: rust_size as u64,
        });
        item
    }

    /// `field` is at `c_offset`, a C expression, if given; else at the C member `c_path`
    /// (by default the same name).
    pub(crate) fn field(&mut self, field: &str, c_path: Option<&str>, c_offset: Option<String>, rust_offset: usize) {
        let c_expr = c_offset.unwrap_or_else(|| format!("offsetof({}, {})", self.c_type(), c_path.unwrap_or(field)));
        self.numbers.push(Number {
            rust_name: format!("{}.{field}", self.name),
            c_expr,
            rust_value: rust_offset as u64,
        });
    }

    fn c_type(&self) -> &'static str {
        self.c_type
            .unwrap_or_else(|| panic!("{}: no C type to take sizes and offsets in", self.name))
    }
}

/// Everything one file declares, and the check.
pub(crate) struct Table {
    /// The declaring file, relative to the crate root.
    file: PathBuf,
    headers: &'static [&'static str],
    items: Vec<Item>,
    values: Vec<Number>,
}

impl Table {
    /// `file` is the invoking file's `file!()`; `headers` are relative to `/usr/include`.
    pub(crate) fn new(file: &str, headers: &'static [&'static str]) -> Self {
        Self {
            file: normalize(Path::new(file)),
            headers,
            items: Vec::new(),
            values: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, item: Item) {
        self.items.push(item);
    }

    /// A Rust value (`rust_name` is its source) that must equal the C expression `c_expr`.
    pub(crate) fn value(&mut self, rust_name: &str, rust_value: impl TryInto<u64>, c_expr: &str) {
        self.values.push(Number {
            rust_name: rust_name.into(),
            c_expr: c_expr.into(),
            rust_value: rust_value
                .try_into()
                .unwrap_or_else(|_| panic!("{rust_name} does not fit in a u64")),
        });
    }

    /// Fails on a `#[repr(C)]` item of the file without an entry, then on any number C
    /// disagrees with.
    pub(crate) fn check(self) {
        let source = std::fs::read_to_string(crate_root().join(&self.file))
            .unwrap_or_else(|e| panic!("reading {}: {e}", self.file.display()));
        let unlisted: Vec<String> = repr_c_items(&source)
            .into_iter()
            .filter(|item| !self.items.iter().any(|i| i.name == item) && !is_exempt(&self.file, item))
            .collect();
        assert!(
            unlisted.is_empty(),
            "{}: #[repr(C)] items without a kernel_layouts! entry: {}",
            self.file.display(),
            unlisted.join(", ")
        );
        let numbers: Vec<&Number> = self.items.iter().flat_map(|i| &i.numbers).chain(&self.values).collect();
        let c_values = measure_in_c(&self.file, self.headers, &numbers);
        let wrong: Vec<String> = numbers
            .iter()
            .zip(&c_values)
            .filter(|(n, c)| n.rust_value != **c)
            .map(|(n, c)| format!("  {}: C {} = {c}, Rust {}", n.rust_name, n.c_expr, n.rust_value))
            .collect();
        assert!(
            wrong.is_empty(),
            "{}: kernel ABI layouts differ from {}:\n{}",
            self.file.display(),
            self.headers.join(", "),
            wrong.join("\n")
        );
    }
}

/// Compiles and runs a C program printing each number's C expression; returns the values.
fn measure_in_c(file: &Path, headers: &[&str], numbers: &[&Number]) -> Vec<u64> {
    for h in headers {
        let path = Path::new("/usr/include").join(h);
        assert!(
            path.exists(),
            "{} is not installed: install {HEADERS_PACKAGE} (cargo xtask test does)",
            path.display()
        );
    }
    let mut c = String::from("#include <stddef.h>\n#include <stdio.h>\n");
    for h in headers {
        let _ = writeln!(c, "#include <{h}>");
    }
    c.push_str("#define MEMBER_TYPE(type, member) __typeof__(((type *)0)->member)\nint main(void) {\n");
    for n in numbers {
        let _ = writeln!(c, "    printf(\"%llu\\n\", (unsigned long long)({}));", n.c_expr);
    }
    c.push_str("    return 0;\n}\n");

    let tag: String = file
        .to_string_lossy()
        .chars()
        .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
        .collect();
    let dir = std::env::temp_dir().join(format!("uverbs-kernel-layout-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let printed = build_and_run(&dir, &c);
    let _ = std::fs::remove_dir_all(&dir);
    let printed = printed.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let values: Vec<u64> = printed.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(values.len(), numbers.len());
    values
}

/// Compiles `source` in `dir` with `$CC` (default `cc`), runs it and returns what it printed.
fn build_and_run(dir: &Path, source: &str) -> Result<String, String> {
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    std::fs::write(&src, source).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run the C compiler `{cc}`: install gcc (cargo xtask test does): {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "compiling the layout check failed:\n{}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let run = Command::new(&exe)
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()))?;
    if !run.status.success() {
        return Err(format!("the layout check program failed: {}", run.status));
    }
    Ok(String::from_utf8_lossy(&run.stdout).into_owned())
}

/// The names of the structs and unions marked `#[repr(C...)]` in `source`.
fn repr_c_items(source: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut marked = false;
    for line in source.lines().map(str::trim_start) {
        if line.starts_with("#[repr(C") {
            marked = true;
        } else if marked && !line.starts_with("#[") && !line.starts_with("//") {
            marked = false;
            let mut words = line
                .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
                .filter(|w| !w.is_empty());
            if words.any(|w| w == "struct" || w == "union") {
                items.extend(words.next().map(String::from));
            }
        }
    }
    items
}

fn is_exempt(file: &Path, item: &str) -> bool {
    NOT_KERNEL.iter().any(|(f, i, _)| Path::new(f) == file && *i == item)
}

fn crate_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `path` without `.` and `..` (`file!()` gives `src/../providers/rxe/abi.rs`).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Every file under [`SCANNED`] with a `#[repr(C)]` item that is not in [`NOT_KERNEL`] invokes
/// `kernel_layouts!`, and every [`NOT_KERNEL`] entry still exists.
#[test]
fn every_file_with_kernel_structs_checks_them() {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(crate_root().join(dir)).unwrap().flatten() {
            let path = dir.join(entry.file_name());
            if SKIPPED.iter().any(|skipped| path == Path::new(skipped)) {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                walk(&path, files);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for dir in SCANNED {
        walk(Path::new(dir), &mut files);
    }
    let mut unchecked = Vec::new();
    let mut exemptions_seen = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(crate_root().join(file)).unwrap();
        let items = repr_c_items(&source);
        exemptions_seen.extend(
            NOT_KERNEL
                .iter()
                .filter(|(f, i, _)| Path::new(f) == file && items.iter().any(|item| item == i)),
        );
        let kernel: Vec<&String> = items.iter().filter(|i| !is_exempt(file, i)).collect();
        if !kernel.is_empty() && !source.contains("kernel_layouts! {") {
            unchecked.push(format!("{}: {kernel:?}", file.display()));
        }
    }
    assert!(
        unchecked.is_empty(),
        "#[repr(C)] items in files without kernel_layouts! (add one, or an entry in NOT_KERNEL):\n{}",
        unchecked.join("\n")
    );
    let stale: Vec<_> = NOT_KERNEL.iter().filter(|e| !exemptions_seen.contains(e)).collect();
    assert!(
        stale.is_empty(),
        "NOT_KERNEL entries naming no #[repr(C)] item: {stale:?}"
    );
}

#[test]
fn repr_c_items_are_found_past_attributes_and_comments() {
    let source = [
        "#[repr(C)]",
        "#[derive(Clone)]",
        "/// Doc.",
        "pub(crate) struct A {",
        "}",
        "#[repr(C, align(64))]",
        "union B {}",
        "#[repr(transparent)]",
        "struct C;",
        "/// Not `#[repr(C)]`:",
        "struct D;",
    ]
    .join("\n");
    assert_eq!(repr_c_items(&source), ["A", "B"]);
}
