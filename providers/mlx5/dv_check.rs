//! Differential test of the segment encoders and the CQE decoder against `mlx5dv.h`: a C
//! program built at test time runs the header's helpers (`mlx5dv_set_ctrl_seg`,
//! `mlx5dv_set_data_seg`, `mlx5dv_get_cqe_*`) and fills its structs on the same seeded
//! random inputs, and prints what it got; every line must equal Rust's.

use super::cqe::{self, Cqe64, CQE_SIZE};
use super::wqe::{self, Ctrl};
use crate::testing::Rng;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

/// Inputs of each kind.
const CASES: usize = 10_000;
const HEADER: &str = "/usr/include/infiniband/mlx5dv.h";

/// Reads one request a line, answers one line of hex bytes or numbers.
const PROGRAM: &str = r#"
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <endian.h>
#include <infiniband/mlx5dv.h>

static void bytes(const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) printf("%02x", b[i]);
    printf("\n");
}

int main(void) {
    char kind;
    while (scanf(" %c", &kind) == 1) {
        unsigned long long a, b, c, d, e, f, g, h;
        if (kind == 'c') {
            struct mlx5_wqe_ctrl_seg s;
            if (scanf("%llu %llu %llu %llu %llu %llu %llu %llu", &a, &b, &c, &d, &e, &f, &g, &h) != 8) return 2;
            memset(&s, 0, sizeof s);
            mlx5dv_set_ctrl_seg(&s, a, b, c, d, e, f, g, h);
            bytes(&s, sizeof s);
        } else if (kind == 'd') {
            struct mlx5_wqe_data_seg s;
            if (scanf("%llu %llu %llu", &a, &b, &c) != 3) return 2;
            mlx5dv_set_data_seg(&s, a, b, c);
            bytes(&s, sizeof s);
        } else if (kind == 'r') {
            struct mlx5_wqe_raddr_seg s;
            if (scanf("%llu %llu", &a, &b) != 2) return 2;
            s.raddr = htobe64(a); s.rkey = htobe32(b); s.reserved = 0;
            bytes(&s, sizeof s);
        } else if (kind == 'a') {
            struct mlx5_wqe_atomic_seg s;
            if (scanf("%llu %llu", &a, &b) != 2) return 2;
            s.swap_add = htobe64(a); s.compare = htobe64(b);
            bytes(&s, sizeof s);
        } else if (kind == 'i') {
            struct mlx5_wqe_inl_data_seg s;
            if (scanf("%llu", &a) != 1) return 2;
            s.byte_count = htobe32(a | MLX5_INLINE_SEG);
            bytes(&s, sizeof s);
        } else if (kind == 'q') {
            union { unsigned char raw[64]; struct mlx5_cqe64 cqe; struct mlx5_err_cqe err; } u;
            for (int i = 0; i < 64; i++) {
                unsigned v;
                if (scanf("%2x", &v) != 1) return 2;
                u.raw[i] = v;
            }
            struct mlx5_cqe64 *q = &u.cqe;
            printf("%u %u %u %u %u %u %u %u %u %u %llu %u %u %u %u %u %u\n",
                mlx5dv_get_cqe_owner(q), mlx5dv_get_cqe_opcode(q), mlx5dv_get_cqe_se(q),
                mlx5dv_get_cqe_format(q), q->ml_path, be16toh(q->slid), be32toh(q->flags_rqpn),
                be32toh(q->srqn_uidx), q->imm_inval_pkey, be32toh(q->byte_cnt),
                (unsigned long long)be64toh(q->timestamp), be32toh(q->sop_drop_qpn),
                be16toh(q->wqe_counter), q->signature, q->op_own, u.err.vendor_err_synd,
                u.err.syndrome);
        } else {
            return 3;
        }
    }
    return 0;
}
"#;

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

/// Builds the C program, feeds it `input` and returns its output lines. Fails (never skips)
/// without gcc or the header.
fn run_c(input: &str) -> Vec<String> {
    assert!(
        Path::new(HEADER).exists(),
        "{HEADER} is missing: install libibverbs-dev (cargo xtask test does)"
    );
    let dir = std::env::temp_dir().join(format!("uverbs-mlx5dv-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("dv.c"), dir.join("dv"));
    std::fs::write(&src, PROGRAM).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc)
        .arg("-O1")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: install gcc (cargo xtask test does): {e}"));
    assert!(
        built.status.success(),
        "compiling against {HEADER} failed (install libibverbs-dev and gcc):\n{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_owned();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "the mlx5dv check program failed: {}", out.status);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect()
}

/// A random value of `bits` bits, biased toward the edges.
fn value(rng: &mut Rng, bits: u32) -> u64 {
    let mask = if bits == 64 { u64::MAX } else { (1 << bits) - 1 };
    match rng.below(8) {
        0 => 0,
        1 => mask,
        _ => rng.next_u64() & mask,
    }
}

#[test]
fn segments_and_cqe_fields_equal_mlx5dv_h() {
    let mut rng = Rng::new(0x6d6c_7835);
    let (mut input, mut want) = (String::new(), Vec::new());
    for _ in 0..CASES {
        let c = Ctrl {
            pi: value(&mut rng, 16) as u16,
            opcode: value(&mut rng, 8) as u8,
            opmod: value(&mut rng, 8) as u8,
            qpn: value(&mut rng, 24) as u32,
            fm_ce_se: value(&mut rng, 8) as u8,
            ds: value(&mut rng, 6) as u8,
            signature: value(&mut rng, 8) as u8,
            imm: value(&mut rng, 32) as u32,
        };
        let _ = writeln!(
            input,
            "c {} {} {} {} {} {} {} {}",
            c.pi, c.opcode, c.opmod, c.qpn, c.fm_ce_se, c.ds, c.signature, c.imm
        );
        want.push(hex(&wqe::ctrl_seg(&c)));

        let (len, lkey, addr) = (value(&mut rng, 32), value(&mut rng, 32), value(&mut rng, 64));
        let _ = writeln!(input, "d {len} {lkey} {addr}");
        want.push(hex(&wqe::data_seg(len as u32, lkey as u32, addr)));

        let (raddr, rkey) = (value(&mut rng, 64), value(&mut rng, 32));
        let _ = writeln!(input, "r {raddr} {rkey}");
        want.push(hex(&wqe::raddr_seg(raddr, rkey as u32)));

        let (swap_add, compare) = (value(&mut rng, 64), value(&mut rng, 64));
        let _ = writeln!(input, "a {swap_add} {compare}");
        want.push(hex(&wqe::atomic_seg(swap_add, compare)));

        let inline_len = value(&mut rng, 31);
        let _ = writeln!(input, "i {inline_len}");
        want.push(hex(&wqe::inline_header(inline_len as u32)));

        let mut raw = [0u8; CQE_SIZE];
        for chunk in raw.chunks_mut(8) {
            chunk.copy_from_slice(&rng.next_u64().to_ne_bytes());
        }
        let _ = writeln!(input, "q {}", hex(&raw));
        let q = Cqe64::parse(&raw);
        want.push(format!(
            "{} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {} {}",
            cqe::owner(q.op_own),
            cqe::cqe_opcode(q.op_own),
            cqe::solicited(q.op_own),
            cqe::format(q.op_own),
            q.ml_path,
            q.slid,
            q.flags_rqpn,
            q.srqn_uidx,
            q.imm_inval_pkey,
            q.byte_cnt,
            q.timestamp,
            q.sop_drop_qpn,
            q.wqe_counter,
            q.signature,
            q.op_own,
            q.vendor_err_synd,
            q.syndrome,
        ));
    }
    let got = run_c(&input);
    assert_eq!(got.len(), want.len(), "the C program answered too few lines");
    let requests: Vec<&str> = input.lines().collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "C (left) and Rust (right) differ on {}", requests[i]);
    }
}
