//! The device's doorbell and BlueFlame checks (`device/bfcheck.rs`) on a pair of QPs with
//! legacy bfregs, as a device with write combining (`bf_reg_size` 512) sees them.

use super::*;
use crate::device::{bfcheck, Violation};

const BF_REG: u64 = 512;
const UARS: u64 = 0x50_0000;

/// A pair whose context's 8 static UAR pages are mapped at `UARS`.
fn pair() -> Pair {
    let p = Pair::new(7);
    let mut m = p.env.model.lock().unwrap();
    for page in 0..8 {
        p.env.mem.add(UARS + page * 4096, 4096);
        m.mapped(CTX, (abi::mmap_cmd::REGULAR_PAGE << 8) | page, UARS + page * 4096);
    }
    drop(m);
    p
}

/// QP `i`'s handle and bfreg.
fn qp(p: &Pair, i: usize) -> (u32, u32) {
    let m = p.env.model.lock().unwrap();
    let (h, q) = m.qps.iter().find(|(_, q)| q.qpn == p.qpn[i]).unwrap();
    (h, q.bfregn.unwrap())
}

/// Where bfreg `n`'s half `side` is.
fn half(n: u32, side: u64) -> u64 {
    UARS + u64::from(n / 2) * 4096 + abi::BF_OFFSET + u64::from(n % 2) * BF_REG + side * BF_REG / 2
}

/// Posts one SEND with one data segment (ds 2: a copy) on QP `i` and lets the device see the
/// doorbell record; returns the WQE's 64 bytes as the ring holds them.
fn post(p: &mut Pair, i: usize) -> Vec<u8> {
    let index = p.posted[i];
    p.post(i, abi::opcode::SEND, &data_seg(8, p.key, DATA), true);
    see(p, i);
    let mut wqe = vec![0u8; 64];
    p.env
        .mem
        .read(QP_BUFS[i] + 8 * 16 + u64::from(index % 16) * 64, &mut wqe)
        .unwrap();
    wqe
}

fn see(p: &Pair, i: usize) {
    let (h, _) = qp(p, i);
    let mut m = p.env.model.lock().unwrap();
    bfcheck::observe(&mut m, h, p.posted[i], &p.env.mem, BF_REG);
}

fn violations(p: &Pair) -> Vec<Violation> {
    p.env.model.lock().unwrap().violations.clone()
}

#[test]
fn the_kernel_gives_the_first_qps_dedicated_bfregs() {
    let p = pair();
    // 16 bfregs, 4 of them low latency: the first two QPs get 12 and 13.
    assert_eq!((qp(&p, 0).1, qp(&p, 1).1), (12, 13));
}

#[test]
fn whole_copies_on_the_own_bfreg_pass() {
    let mut p = pair();
    let own = qp(&p, 0).1;
    for side in [0, 1, 0] {
        let wqe = post(&mut p, 0);
        p.env.mem.write(half(own, side), &wqe).unwrap();
    }
    post(&mut p, 0);
    assert_eq!(violations(&p), []);
}

#[test]
fn a_torn_copy_is_caught() {
    let mut p = pair();
    let own = qp(&p, 0).1;
    let mut wqe = post(&mut p, 0);
    // The first block of this WQE with the data segment of another.
    wqe[16..32].copy_from_slice(&data_seg(99, p.key, DATA + 64));
    p.env.mem.write(half(own, 0), &wqe).unwrap();
    post(&mut p, 0);
    let v = violations(&p);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(matches!(v[0], Violation::TornCopy { at: 19, bfreg: 12, .. }), "{v:?}");
    assert_eq!(v[0].reason(), "torn BlueFlame copy");
}

#[test]
fn a_doorbell_on_another_qps_bfreg_is_caught() {
    let mut p = pair();
    let other = qp(&p, 1).1;
    let wqe = post(&mut p, 0);
    // The 8-byte doorbell of QP 0's WQE, on QP 1's bfreg.
    p.env.mem.write(half(other, 1), &wqe[..8]).unwrap();
    post(&mut p, 0);
    let v = violations(&p);
    assert_eq!(
        v,
        [Violation::ForeignBfreg {
            qpn: p.qpn[0],
            own: 12,
            found: 13
        }]
    );
    assert_eq!(v[0].reason(), "doorbell on another QP's bfreg");
}

#[test]
fn a_half_taken_by_a_later_doorbell_says_nothing() {
    let mut p = pair();
    let own = qp(&p, 0).1;
    let mut wqe = post(&mut p, 0);
    wqe[20] ^= 0xff;
    p.env.mem.write(half(own, 0), &wqe).unwrap();
    // A later doorbell (another WQE's first word) has begun on that half.
    p.env.mem.write(half(own, 0), &[0x5a; 8]).unwrap();
    post(&mut p, 0);
    assert_eq!(violations(&p), []);
}

fn quiescent(p: &Pair) {
    let mut m = p.env.model.lock().unwrap();
    bfcheck::check_quiescent(&mut m, &p.env.mem, BF_REG);
}

#[test]
fn doorbells_alternating_halves_pass_the_quiescent_check() {
    let mut p = pair();
    let own = qp(&p, 0).1;
    for side in [0, 1, 0] {
        let wqe = post(&mut p, 0);
        p.env.mem.write(half(own, side), &wqe).unwrap();
    }
    quiescent(&p);
    assert_eq!(violations(&p), []);
    assert_eq!(p.env.model.lock().unwrap().bf_copies_checked, 3);
}

#[test]
fn two_doorbells_on_one_half_are_caught() {
    let mut p = pair();
    let own = qp(&p, 0).1;
    for _ in 0..2 {
        let wqe = post(&mut p, 0);
        p.env.mem.write(half(own, 0), &wqe).unwrap();
    }
    quiescent(&p);
    let v = violations(&p);
    assert_eq!(v, [Violation::NotAlternated { bfreg: 12, posts: 2 }]);
    assert_eq!(v[0].reason(), "bfreg halves not alternated");
}

#[test]
fn the_quiescent_check_sees_a_post_the_device_has_not() {
    let mut p = pair();
    let other = qp(&p, 1).1;
    // Posted, its record moved, but the device has not looked yet.
    p.post(0, abi::opcode::SEND, &data_seg(8, p.key, DATA), true);
    let mut wqe = vec![0u8; 8];
    p.env.mem.read(QP_BUFS[0] + 8 * 16, &mut wqe).unwrap();
    p.env.mem.write(half(other, 0), &wqe).unwrap();
    quiescent(&p);
    assert!(matches!(
        violations(&p)[..],
        [Violation::ForeignBfreg { found: 13, .. }]
    ));
}
