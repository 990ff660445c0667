//! What the device checks of the doorbells and BlueFlame copies on the legacy bfregs
//! (`UVERBS_MLX5_MODEL_WC=1`; without write combining every bfreg is at the same offset and
//! nothing is copied):
//!
//! - a doorbell (8 bytes) or BlueFlame copy carrying a QP's control segment must be in the
//!   bfreg the kernel gave that QP (`Qp::bfregn`): elsewhere it is
//!   [`Violation::ForeignBfreg`];
//! - a BlueFlame copy must be the WQE it names, byte for byte as the ring holds it: a copy
//!   that is not (bytes of another WQE in it, or torn) is [`Violation::TornCopy`].
//!
//! The UAR stores are not trapped, so the device looks when it knows a store has finished:
//! a QP's doorbell record moves before its UAR store (both providers write the record first),
//! so when the record moves again, the UAR store of the post before is complete. Then the
//! device reads both halves of every bfreg of the context. A half whose first word is that
//! earlier post's control segment got the doorbell: it must be the QP's own bfreg, and where
//! that post was one request that both providers copy (1 < ds, fitting half a bfreg, with
//! `MLX5_POST_SEND_PREFER_BF` not 0), its bytes must be the WQE's, read from the ring when the
//! record moved. A later doorbell on that half writes its first word first (one store, or a
//! copy in order), so a first word still equal (read again after the rest) means no later
//! doorbell had begun: a difference is a tear. A half a later doorbell has since taken says
//! nothing. Dynamic UARs (libmlx5's) are not checked: the QP names its UAR page itself.
//!
//! A client with no post in flight (a test between rounds, its threads joined or waiting)
//! may also say so ([`check_quiescent`], exported as `uverbs_mlx5_model_check_bfregs`): then
//! every store is complete, and every half is checked against the post of its QP the device
//! saw last, without waiting for that QP's next post.

use crate::abi;
use crate::kernel::Model;
use crate::mem::Memory;
pub use crate::objects::{BfWatch, Violation};

/// Whether a lone request is copied (libmlx5 qp.c post_send_db; the Rust provider the same):
/// `MLX5_POST_SEND_PREFER_BF` unset or not 0, and `MLX5_SHUT_UP_BF` unset or 0.
fn copies() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        std::env::var_os("MLX5_POST_SEND_PREFER_BF").map_or(true, |v| v != "0")
            && std::env::var_os("MLX5_SHUT_UP_BF").map_or(true, |v| v == "0")
    })
}

/// Reads `len` bytes of QP `qp`'s send queue from block `index`, wrapping.
fn ring_bytes(qp: &crate::objects::Qp, index: u16, len: usize, mem: &dyn Memory) -> Option<Vec<u8>> {
    let mut out = vec![0u8; len];
    for (k, chunk) in out.chunks_mut(abi::SEND_WQE_BB as usize).enumerate() {
        let block = u64::from(index.wrapping_add(k as u16)) & u64::from(qp.sq_cnt - 1);
        mem.read(qp.sq_base() + block * abi::SEND_WQE_BB, chunk).ok()?;
    }
    Some(out)
}

/// QP `h`'s send doorbell record reads `snd`: checks the doorbell of its previous post if the
/// record moved since, and notes the last WQE of the new one. `bf_reg` is the context's
/// `bf_reg_size` (0: nothing to check).
pub fn observe(model: &mut Model, h: u32, snd: u16, mem: &dyn Memory, bf_reg: u64) {
    let Some(qp) = model.qps.get(h) else { return };
    let (Some(own), true) = (qp.bfregn, bf_reg > 0 && qp.sq_cnt > 0) else {
        return;
    };
    if snd == qp.bf.seen {
        return;
    }
    let (qpn, ctx, from) = (qp.qpn, qp.ctx, qp.bf.seen);
    // The new post's WQEs, from the record last seen: how many, and the last one.
    let mut at = from;
    let mut last = None;
    let mut wqes = 0u32;
    while at != snd && wqes <= qp.sq_cnt {
        let Some(ctrl) = ring_bytes(qp, at, 8, mem) else { break };
        let ds = usize::from(ctrl[7] & 0x3f);
        let nbb = ds.div_ceil(4).max(1) as u16;
        if snd.wrapping_sub(at) < nbb {
            break;
        }
        last = Some((at, ds, ctrl));
        at = at.wrapping_add(nbb);
        wqes += 1;
    }
    let note = match last {
        Some((index, ds, ctrl)) if at == snd => {
            let word = u64::from_ne_bytes(ctrl.try_into().unwrap_or_default());
            let copied = wqes == 1 && own != 0 && ds > 1 && ds * 16 <= (bf_reg / 2) as usize && copies();
            let bytes = copied
                .then(|| ring_bytes(qp, index, (ds * 16).next_multiple_of(64), mem))
                .flatten();
            Some((word, bytes))
        }
        _ => None,
    };
    if own != 0 {
        let posts = model.bf_posts.entry((ctx, own)).or_insert((Vec::new(), true));
        match &note {
            Some((word, _)) if wqes == 1 => posts.0.push(*word),
            _ => posts.1 = false,
        }
    }
    let Some(qp) = model.qps.get_mut(h) else { return };
    let done = std::mem::replace(&mut qp.bf.last, note);
    qp.bf.seen = snd;
    if let Some((word, bytes)) = done {
        check(model, ctx, qpn, own, word, bytes.as_deref(), mem, bf_reg);
    }
}

/// Every bfreg half of every context, with no post in flight: a half whose first word is the
/// doorbell of a QP's last post (as the device saw its record move) must be on that QP's bfreg,
/// and a copy must be its WQE. Each post is checked once (here or at the QP's next post).
pub fn check_quiescent(model: &mut Model, mem: &dyn Memory, bf_reg: u64) {
    if bf_reg == 0 {
        return;
    }
    // Posts the device has not seen yet first (their records moved, their stores are done).
    for h in model.qps.handles() {
        let Some(qp) = model.qps.get(h) else { continue };
        if let Ok(snd) = mem.read_be32(qp.db + abi::SND_DBR) {
            observe(model, h, snd as u16, mem, bf_reg);
        }
    }
    let mut due = Vec::new();
    for h in model.qps.handles() {
        let Some(qp) = model.qps.get_mut(h) else { continue };
        let (Some(own), Some((word, bytes))) = (qp.bfregn, qp.bf.last.take()) else {
            continue;
        };
        due.push((qp.ctx, qp.qpn, own, word, bytes));
    }
    for (ctx, qpn, own, word, bytes) in due {
        check(model, ctx, qpn, own, word, bytes.as_deref(), mem, bf_reg);
    }
    // Consecutive doorbells on a bfreg go to alternate halves (libmlx5 toggles `bf->offset`
    // after each, under the lock where the bfreg is shared): after two or more, seen one by
    // one, its halves hold two different ones of them.
    for ((ctx, n), (words, single)) in std::mem::take(&mut model.bf_posts) {
        if !single || words.len() < 2 {
            continue;
        }
        let Some(&(_, page)) = model
            .contexts
            .get(&ctx)
            .and_then(|c| c.static_uars.iter().find(|&&(i, _)| i == u64::from(n / 2)))
        else {
            continue;
        };
        let reg = page + abi::BF_OFFSET + u64::from(n % 2) * bf_reg;
        let mut first = [[0u8; 8]; 2];
        let ok = (0..2).all(|side| mem.read(reg + side * bf_reg / 2, &mut first[side as usize]).is_ok());
        let [a, b] = first.map(u64::from_ne_bytes);
        if ok && !(a != b && words.contains(&a) && words.contains(&b)) {
            let v = Violation::NotAlternated {
                bfreg: n,
                posts: words.len(),
            };
            eprintln!("mlx5-model: {v}");
            model.violations.push(v);
        }
    }
}

/// Looks for the doorbell `word` of QP `qpn` (bfreg `own`) in every bfreg half of context
/// `ctx`; with `bytes`, the copy it must be.
#[allow(clippy::too_many_arguments)]
fn check(
    model: &mut Model,
    ctx: i32,
    qpn: u32,
    own: u32,
    word: u64,
    bytes: Option<&[u8]>,
    mem: &dyn Memory,
    bf_reg: u64,
) {
    let Some(c) = model.contexts.get(&ctx) else { return };
    let half = bf_reg / 2;
    let mut found = Vec::new();
    for &(page, addr) in &c.static_uars {
        let mut area = vec![0u8; (abi::PAGE_SIZE - abi::BF_OFFSET) as usize];
        if mem.read(addr + abi::BF_OFFSET, &mut area).is_err() {
            continue;
        }
        for (k, reg) in area.chunks(bf_reg as usize).enumerate().take(2) {
            for (side, buf) in reg.chunks(half as usize).enumerate() {
                if buf
                    .get(..8)
                    .map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()))
                    != Some(word)
                {
                    continue;
                }
                let n = page as u32 * 2 + k as u32;
                let at = addr + abi::BF_OFFSET + k as u64 * bf_reg + side as u64 * half;
                found.push((n, at, buf.to_vec()));
            }
        }
    }
    let mut seen = Vec::new();
    for (n, at, buf) in found {
        if n != own {
            seen.push(Violation::ForeignBfreg { qpn, own, found: n });
            continue;
        }
        let Some(wqe) = bytes else { continue };
        let Some(diff) = wqe.iter().zip(&buf).position(|(a, b)| a != b) else {
            model.bf_copies_checked += 1;
            continue;
        };
        // The first word again: still this doorbell's, so no later one had begun.
        let mut again = [0u8; 8];
        if mem.read(at, &mut again).is_ok() && u64::from_ne_bytes(again) == word {
            let wqe_index = u16::from_be_bytes([wqe[1], wqe[2]]);
            seen.push(Violation::TornCopy {
                qpn,
                wqe_index,
                bfreg: n,
                at: diff,
            });
        }
    }
    for v in seen {
        crate::log!("VIOLATION {v}");
        eprintln!("mlx5-model: {v}");
        model.violations.push(v);
    }
}
