//! Atomics: compare-and-swap and fetch-and-add return the old value and change remote memory;
//! misaligned atomics are rejected before posting; unauthorised ones complete in error.

mod common;

use common::*;
use uverbs::*;

fn remote_u64(mr: &RemoteMr, off: usize) -> u64 {
    let mut v = [0; 8];
    mr.read(off, &mut v).unwrap();
    u64::from_ne_bytes(v)
}

#[test]
fn compare_swap_and_fetch_add_return_old_values() {
    let mut p = Pair::new();
    p.b.mr.write(64, &100u64.to_ne_bytes()).unwrap();
    let target = Remote {
        addr: p.b.mr.addr() + 64,
        rkey: p.b.mr.rkey(),
    };
    let result = [p.a.mr.sge(0, 8).unwrap()];

    let atomic = |p: &mut Pair, wr_id, op| {
        // SAFETY: the result buffer is read only after the completion.
        unsafe { p.a.qp.post_send(&[SendWr::new(wr_id, op, &result)]) }.unwrap();
        let c = poll_n(&mut p.a.cq, 1, 1)[0];
        assert_eq!((c.wr_id, c.status), (wr_id, WcStatus::SUCCESS), "{c:?}");
        (c.opcode, remote_u64(&p.a.mr, 0))
    };
    // Fetch-and-add: old 100, new 142.
    let (op, old) = atomic(
        &mut p,
        1,
        SendOp::FetchAdd {
            remote: target,
            add: 42,
        },
    );
    assert_eq!((op, old, remote_u64(&p.b.mr, 64)), (WcOpcode::FETCH_ADD, 100, 142));
    // Compare-and-swap that misses: old 142, unchanged.
    let (op, old) = atomic(
        &mut p,
        2,
        SendOp::CompareSwap {
            remote: target,
            compare: 7,
            swap: 9,
        },
    );
    assert_eq!((op, old, remote_u64(&p.b.mr, 64)), (WcOpcode::COMP_SWAP, 142, 142));
    // Compare-and-swap that hits: old 142, now 9.
    let (_, old) = atomic(
        &mut p,
        3,
        SendOp::CompareSwap {
            remote: target,
            compare: 142,
            swap: 9,
        },
    );
    assert_eq!((old, remote_u64(&p.b.mr, 64)), (142, 9));
    // 100 adds in one doorbell batch.
    let wrs: Vec<_> = (0..100)
        .map(|i| SendWr::new(10 + i, SendOp::FetchAdd { remote: target, add: 1 }, &result))
        .collect();
    unsafe { p.a.qp.post_send(&wrs) }.unwrap();
    let done = poll_n(&mut p.a.cq, 100, 32);
    assert!(done.iter().all(|c| c.status == WcStatus::SUCCESS));
    assert_eq!(remote_u64(&p.b.mr, 64), 109);
    assert_eq!(remote_u64(&p.a.mr, 0), 108, "the last add saw 108");
}

#[test]
fn misaligned_atomics_are_rejected_before_posting() {
    let mut p = Pair::new();
    let result = [p.a.mr.sge(0, 8).unwrap()];
    let odd = Remote {
        addr: p.b.mr.addr() + 4,
        rkey: p.b.mr.rkey(),
    };
    let ok = Remote {
        addr: p.b.mr.addr(),
        rkey: p.b.mr.rkey(),
    };
    let short = [p.a.mr.sge(0, 4).unwrap()];
    let wrs = [
        SendWr::new(1, SendOp::FetchAdd { remote: ok, add: 1 }, &result),
        SendWr::new(2, SendOp::FetchAdd { remote: odd, add: 1 }, &result),
        SendWr::new(3, SendOp::FetchAdd { remote: ok, add: 1 }, &result),
    ];
    match unsafe { p.a.qp.post_send(&wrs) } {
        Err(Error::WorkRequest {
            index: 1,
            reason: WrReject::BadAtomic,
            ..
        }) => {}
        other => panic!("expected BadAtomic at index 1, got {other:?}"),
    }
    // The first was posted; the rest were not.
    let c = poll_n(&mut p.a.cq, 1, 4);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::SUCCESS));
    assert_idle(&mut p.a.cq);
    assert_eq!(remote_u64(&p.b.mr, 0), 1);
    let wr = SendWr::new(
        4,
        SendOp::CompareSwap {
            remote: ok,
            compare: 0,
            swap: 0,
        },
        &short,
    );
    assert!(matches!(
        unsafe { p.a.qp.post_send(&[wr]) },
        Err(Error::WorkRequest {
            reason: WrReject::BadAtomic,
            ..
        })
    ));
}

#[test]
fn atomics_without_remote_atomic_access_fail_with_rem_access_err() {
    let mut p = Pair::new();
    let no_atomic =
        p.pd.alloc_remote_mr(
            4096,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
        )
        .unwrap();
    let target = Remote {
        addr: no_atomic.addr(),
        rkey: no_atomic.rkey(),
    };
    let result = [p.a.mr.sge(0, 8).unwrap()];
    unsafe {
        p.a.qp
            .post_send(&[SendWr::new(5, SendOp::FetchAdd { remote: target, add: 1 }, &result)])
    }
    .unwrap();
    let c = poll_n(&mut p.a.cq, 1, 1)[0];
    assert_eq!((c.wr_id, c.status), (5, WcStatus::REM_ACCESS_ERR), "{c:?}");
    assert_eq!(remote_u64(&no_atomic, 0), 0, "remote memory unchanged");
}

/// Atomic write: the provider posts it, and rdma_rxe does what its kernel does: Linux 6.1 has
/// no atomic write, so the request completes with `LOC_QP_OP_ERR` and the target keeps its
/// value, as with rdma-core's C provider; 6.12 (from 6.2 on) writes the value and completes
/// SUCCESS (docs/kernel-facts.md). mlx5 has none: the provider refuses it.
#[test]
fn atomic_write_is_posted_and_rxe_does_what_its_kernel_does() {
    let mut p = Pair::new();
    p.b.mr.write(64, &7u64.to_ne_bytes()).unwrap();
    let op = SendOp::AtomicWrite {
        remote: Remote {
            addr: p.b.mr.addr() + 64,
            rkey: p.b.mr.rkey(),
        },
        value: 42u64.to_ne_bytes(),
    };
    // SAFETY: the request names no local memory.
    let posted = unsafe { p.a.qp.post_send(&[SendWr::new(5, op, &[])]) };
    let written = match driver(&p.ctx) {
        // Linux 6.2 added ATOMIC_WRITE to rxe (6.12 writes the value); 6.1 refuses it
        // (docs/kernel-facts.md, "Between kernels").
        Driver::Rxe => {
            posted.unwrap();
            let c = poll_n(&mut p.a.cq, 1, 1)[0];
            let (want, written) = if common::kernel::rxe_does_atomic_write() {
                (WcStatus::SUCCESS, true)
            } else {
                (WcStatus::LOC_QP_OP_ERR, false)
            };
            assert_eq!((c.wr_id, c.status), (5, want), "{} {c:?}", common::kernel::release());
            written
        }
        // Neither mlx5's provider nor siw's (no atomics at all) posts it.
        Driver::Mlx5 | Driver::Siw => {
            match posted.unwrap_err() {
                Error::WorkRequest { reason, .. } => assert_eq!(reason, WrReject::OpcodeNotSupported),
                e => panic!("{e}"),
            }
            false
        }
    };
    let want = if written { 42 } else { 7 };
    assert_eq!(
        remote_u64(&p.b.mr, 64),
        want,
        "the target holds the value only if written"
    );
    // It carries its value: with buffers the core refuses it before the device.
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    let with_buffers = SendWr::new(6, op, &sge);
    match unsafe { p.a.qp.post_send(&[with_buffers]) }.unwrap_err() {
        Error::WorkRequest { reason, .. } => assert_eq!(reason, WrReject::OpcodeNotSupported, "it takes no buffers"),
        e => panic!("{e}"),
    }
}
