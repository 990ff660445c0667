//! Leaks and fork: after every object is dropped no fd, no mapping and no kernel object
//! (`rdma res show`) remains, however many times objects are made and dropped; behaviour of
//! registered memory and inherited objects across `fork()`.

mod common;
mod figures;

use common::*;
use figures::figure;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;
use uverbs::*;

/// The kernel's per-device object counts (`rdma res show`: pd, cq, qp, mr, ctx, srq, ...);
/// empty on the mlx5 model, which has no RDMA netlink (its fds still count in `all_fds`).
fn kernel_objects(dev: &str) -> BTreeMap<String, u64> {
    if !footprint_visible() {
        return BTreeMap::new();
    }
    let out = Command::new("rdma")
        .args(["res", "show"])
        .output()
        .expect("`rdma` (iproute2) in the test guest");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{dev}:")))
        .unwrap_or_else(|| panic!("no line for {dev} in `rdma res show`: {text}"));
    let words: Vec<&str> = line.split_whitespace().skip(2).collect();
    words
        .chunks(2)
        .filter_map(|kv| Some((kv[0].to_string(), kv.get(1)?.parse().ok()?)))
        .collect()
}

/// All open fds of this process.
fn all_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Makes one of every kind of object, moves traffic through them, and returns them.
fn zoo(ctx: &Context) -> Vec<Box<dyn std::any::Any>> {
    let pd = ctx.alloc_pd().unwrap();
    let iwarp = link::is_iwarp(ctx);
    let channel = ctx.create_comp_channel().unwrap();
    let mut cq = ctx
        .create_cq_with(&CqInit {
            channel: Some(&channel),
            ..CqInit::new(64)
        })
        .unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mr = pd.alloc_remote_mr(1 << 16, access).unwrap();
    let mut user_mem = vec![0u8; 8192].into_boxed_slice();
    // SAFETY: `user_mem` is returned with the MR and dropped after it (drop order of the Vec).
    let user_mr = unsafe { pd.reg_mr(user_mem.as_mut_ptr(), user_mem.len(), access) }.unwrap();
    let srq = pd.create_srq(&SrqInit::new(16, 1)).unwrap();
    let mut rc = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
    let on_srq = pd
        .create_qp(&QpInit {
            srq: Some(&srq),
            ..QpInit::new(QpType::Rc, &cq, &cq)
        })
        .unwrap();
    let mut kept: Vec<Box<dyn std::any::Any>> = Vec::new();
    if iwarp {
        // iWARP has RC only and no address handles: each refused before the kernel; the RC
        // QP connects to a second one through the CM (dropped before it: `kept` first).
        for qp_type in [QpType::Uc, QpType::Ud] {
            match pd.create_qp(&QpInit::new(qp_type, &cq, &cq)) {
                Err(Error::Unsupported { verb: "CREATE_QP", .. }) => {}
                other => panic!("{qp_type:?} on iWARP: {:?}", other.map(|q| q.qpn())),
            }
        }
        assert!(matches!(
            pd.create_ah(&AhAttr::default()),
            Err(Error::Unsupported { verb: "CREATE_AH", .. })
        ));
        let mut peer = pd.create_qp(&QpInit::new(QpType::Rc, &cq, &cq)).unwrap();
        let link = link::cm_connect(&mut rc, &mut peer);
        kept.push(Box::new(link));
        kept.push(Box::new(peer));
    } else {
        let path = loopback_path(ctx);
        let uc = pd.create_qp(&QpInit::new(QpType::Uc, &cq, &cq)).unwrap();
        let ud = pd.create_qp(&QpInit::new(QpType::Ud, &cq, &cq)).unwrap();
        let ah = pd.create_ah(&path).unwrap();
        let qpn = rc.qpn();
        rc.to_init(1, access).unwrap();
        rc.to_rtr(path, qpn, 0, Mtu::Mtu1024).unwrap();
        rc.to_rts(0).unwrap();
        kept.push(Box::new(ah));
        kept.push(Box::new(ud));
        kept.push(Box::new(uc));
    }
    let sge = [mr.sge(0, 64).unwrap()];
    let remote = Remote {
        addr: user_mr.addr(),
        rkey: user_mr.rkey(),
    };
    cq.req_notify(false).unwrap();
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { rc.post_send(&[SendWr::new(1, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    assert_eq!(poll_n(&mut cq, 1, 1)[0].status, WcStatus::SUCCESS);
    channel
        .get_event(Some(Duration::from_secs(10)))
        .unwrap()
        .expect("event");
    // Queues dropped first, the memory behind `user_mr` last.
    let rest: [Box<dyn std::any::Any>; 9] = [
        Box::new(on_srq),
        Box::new(rc),
        Box::new(srq),
        Box::new(cq),
        Box::new(channel),
        Box::new(mr),
        Box::new(user_mr),
        Box::new(user_mem),
        Box::new(pd),
    ];
    kept.extend(rest);
    kept
}

#[test]
fn everything_dropped_leaves_no_fd_mapping_or_kernel_object() {
    const ROUNDS: usize = 20;
    let name = open_test_device().device().name.clone();
    let before = (kernel_footprint(), all_fds(), kernel_objects(&name));
    let mut during = None;
    for round in 0..ROUNDS {
        {
            let ctx = open_test_device();
            let objects = zoo(&ctx);
            if round == 0 {
                during = Some((kernel_footprint(), kernel_objects(&name)));
            }
            drop(ctx); // before the objects: they keep the context alive
            drop(objects);
        }
        let after = (kernel_footprint(), all_fds(), kernel_objects(&name));
        assert_eq!(after, before, "after round {round}");
    }
    let (during_fp, during_objs) = during.unwrap();
    let grew: Vec<String> = during_objs
        .iter()
        .filter(|(k, v)| before.2.get(*k) != Some(v))
        .map(|(k, v)| format!("{k} {}→{v}", before.2.get(k).copied().unwrap_or(0)))
        .collect();
    let kinds = ["pd", "cq", "qp", "mr", "ctx", "srq"];
    for kind in kinds.into_iter().filter(|_| footprint_visible()) {
        assert!(
            grew.iter().any(|g| g.starts_with(&format!("{kind} "))),
            "{kind} not seen: {grew:?}"
        );
    }
    figure(format_args!(
        "{ROUNDS} rounds of context + PD, 2 MRs, CQ with channel, SRQ, RC/RC-on-SRQ/UC/UD QPs, AH and traffic: \
         while alive {} uverbs fds, {} mappings, kernel objects {}; after each drop back to {} fds ({} uverbs), {} mappings, kernel objects {:?}",
        during_fp.0,
        during_fp.1,
        grew.join(", "),
        before.1,
        before.0 .0,
        before.0 .1,
        before.2
    ));
}

fn fork() -> libc::pid_t {
    // SAFETY: the child only runs code that makes system calls and `_exit`s (no allocation,
    // no locks another thread could hold), as `fork_child` below.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    pid
}

fn wait(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child status {status:#x}");
    libc::WEXITSTATUS(status)
}

fn exit_child(code: i32) -> ! {
    // SAFETY: ends the child without running destructors or atexit handlers.
    unsafe { libc::_exit(code) }
}

/// Sends `len` bytes from `sge`'s memory to B and checks every byte B got is `expect`.
fn send_and_check(p: &mut Pair, wr_id: u64, src: Sge, expect: u8) {
    let rsge = [p.b.mr.sge(65536, src.length).unwrap()];
    // SAFETY: the receive buffer stays valid and untouched until its completion.
    unsafe { p.b.qp.post_recv(&[RecvWr::new(wr_id, &rsge)]) }.unwrap();
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { p.a.qp.post_send(&[SendWr::new(wr_id, SendOp::Send, &[src])]) }.unwrap();
    let s = poll_n(&mut p.a.cq, 1, 1)[0];
    assert_eq!((s.wr_id, s.status), (wr_id, WcStatus::SUCCESS), "{s:?}");
    let r = poll_n(&mut p.b.cq, 1, 1)[0];
    assert_eq!((r.wr_id, r.status), (wr_id, WcStatus::SUCCESS), "{r:?}");
    let got = &p.b.mr.bytes()[65536..65536 + src.length as usize];
    assert!(
        got.iter().all(|&b| b == expect),
        "message {wr_id}: got {:#x}, want {expect:#x}",
        got[0]
    );
}

/// Whether `len` bytes at `addr` are mapped in this process (`mincore` fails with ENOMEM on
/// an unmapped range; async-signal-safe, so usable in a forked child).
fn mapped(addr: *const u8, len: usize) -> bool {
    let page = 4096;
    let start = (addr as usize) & !(page - 1);
    let mut vec = [0u8; 64];
    let len = (len + addr as usize - start).min(64 * page);
    // SAFETY: `vec` has room for one byte per page of the (at most 64-page) range.
    unsafe { libc::mincore(start as *mut libc::c_void, len, vec.as_mut_ptr()) == 0 }
}

/// After `fork()` the parent keeps its registered memory and objects exactly as before:
///
/// - Memory the library allocated for an MR (`alloc_mr`) is zeroed pages of the child's own
///   in the child (`MADV_WIPEONFORK`): never the parent's bytes, and its range stays taken, so
///   nothing the child maps later lands there. The rings mapped from the device are not in
///   the child at all (`MADV_DONTFORK`, as rdma-core's `ibv_fork_init` does).
/// - Caller memory registered with `reg_mr` is inherited as a private copy; the child's writes
///   to its copy never reach the device, and what the parent writes after the fork is what the
///   device sends (the kernel copies pinned pages for the child at fork time, so no
///   copy-on-write moves the parent's pages away from the device).
#[test]
fn after_fork_registered_memory_stays_the_parents() {
    let mut p = Pair::new();
    let mut user = vec![0u8; 8192].into_boxed_slice();
    // SAFETY: `user` outlives the MR (dropped after it, below) and is only written while no
    // send from it is in flight.
    let user_mr = unsafe { p.pd.reg_mr(user.as_mut_ptr(), user.len(), AccessFlags::LOCAL_WRITE) }.unwrap();
    let user_ptr = user.as_mut_ptr();
    user[..4096].fill(0x11);
    send_and_check(&mut p, 1, user_mr.sge(0, 4096).unwrap(), 0x11);
    p.a.mr.bytes_mut()[..4096].fill(0x55);
    let src = p.a.mr.sge(0, 4096).unwrap();
    send_and_check(&mut p, 2, src, 0x55);
    let owned = p.a.mr.bytes().as_ptr();
    let pid = fork();
    if pid == 0 {
        // The library's MR memory is zeros in the child; the caller's is a private copy.
        // SAFETY: mapped (checked first), the child's own zeroed pages.
        let code = if !mapped(owned, 4096)
            || !unsafe { std::slice::from_raw_parts(owned, 4096) }
                .iter()
                .all(|&b| b == 0)
        {
            3
        } else if !mapped(user_ptr, 4096) {
            4
        } else {
            // SAFETY: the child's own copy of the caller's buffer; no other thread exists here.
            unsafe { std::ptr::write_bytes(user_ptr, 0x99, 4096) };
            0
        };
        exit_child(code);
    }
    assert_eq!(
        wait(pid),
        0,
        "3: alloc_mr memory not zeroed pages in the child; 4: reg_mr memory not inherited"
    );
    send_and_check(&mut p, 3, user_mr.sge(0, 4096).unwrap(), 0x11);
    let src = p.a.mr.sge(0, 4096).unwrap();
    send_and_check(&mut p, 4, src, 0x55);
    // The parent writes after the fork (a copy-on-write fault, were the pages shared).
    for (i, fill) in [0x22u8, 0x33, 0x44].into_iter().enumerate() {
        user[..4096].fill(fill);
        send_and_check(&mut p, 5 + i as u64, user_mr.sge(0, 4096).unwrap(), fill);
    }
    drop(user_mr);
    drop(user);
    figure(format_args!(
        "after fork: alloc_mr memory zeroed in the child; the child's writes to its copy of reg_mr memory did not reach the device, the parent's did"
    ));
}

/// What a forked child must survive with the library's memory: it drops an inherited `Buf`
/// (the region's other buffer still inherited), maps memory of the region's size, reads the
/// other buffer (zeros: neither its new mapping nor the parent's bytes), drops it and every
/// other inherited object, and its new mapping is still there and untouched: a child unmaps
/// nothing it inherited. The parent's buffers keep their bytes and work.
#[test]
fn a_child_that_drops_inherited_buffers_keeps_the_memory_it_maps_after() {
    const LEN: usize = 2 * 4096;
    let mut p = Pair::new();
    let mut bufs =
        p.pd.alloc_mr(LEN, LocalAccess::LOCAL_WRITE)
            .unwrap()
            .into_bufs(LEN / 2)
            .unwrap();
    for b in &mut bufs {
        b.as_mut_slice().fill(0x5a);
    }
    let pid = fork();
    if pid == 0 {
        let second = bufs.pop().unwrap();
        drop(bufs);
        // SAFETY: a fresh private mapping of the region's size.
        let fresh = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEN,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if fresh == libc::MAP_FAILED {
            exit_child(2);
        }
        let fresh = fresh.cast::<u8>();
        // SAFETY: the fresh mapping, LEN bytes.
        unsafe { std::ptr::write_bytes(fresh, 0x3c, LEN) };
        let at = second.as_slice().as_ptr() as usize;
        let apart = at + LEN / 2 <= fresh as usize || fresh as usize + LEN <= at;
        let zeros = second.as_slice().iter().all(|&b| b == 0);
        // The region's last holder, then everything else the child inherited.
        drop(second);
        drop(p);
        let intact = mapped(fresh, LEN)
            // SAFETY: checked mapped just before; the child's own mapping.
            && unsafe { std::slice::from_raw_parts(fresh, LEN) }.iter().all(|&b| b == 0x3c);
        exit_child(i32::from(!apart) << 2 | i32::from(!zeros) << 3 | i32::from(!intact) << 4);
    }
    assert_eq!(
        wait(pid),
        0,
        "2: mmap failed; bit 2: the child's mapping landed on the region; bit 3: the child read bytes other than zeros; bit 4: the child's mapping was unmapped or changed"
    );
    for b in &bufs {
        assert!(b.as_slice().iter().all(|&x| x == 0x5a), "the parent's bytes");
    }
    // The parent's region still works: one buffer written to the peer.
    let buf = bufs.pop().unwrap();
    p.a.qp
        .send_buf(SendOp::RdmaWrite(p.b.mr.remote(0).unwrap()), buf)
        .unwrap();
    let mut wc = [WorkCompletion::default(); 1];
    let start = std::time::Instant::now();
    let buf = loop {
        if let Some(c) = p.a.cq.reap(&mut wc).iter().next() {
            assert_eq!(c.status, WcStatus::SUCCESS, "{c:?}");
            break p.a.qp.reclaim(c).expect("the buffer back");
        }
        assert!(start.elapsed() < TIMEOUT, "no completion");
    };
    assert!(p.b.mr.to_vec(0, LEN / 2).unwrap().iter().all(|&x| x == 0x5a));
    bufs.push(buf);
    figure(format_args!(
        "forked child: dropped an inherited Buf, mapped {LEN} bytes (not on the region), read zeros from the other Buf, dropped everything: its mapping intact; the parent's bytes unchanged"
    ));
}

/// In a forked child every verb on an inherited handle is `Error::Forked` before it reaches
/// the kernel or the rings, polling finds nothing, and dropping the handles destroys nothing:
/// the parent's objects keep working.
#[test]
fn in_a_forked_child_inherited_handles_are_error_forked_and_drops_destroy_nothing() {
    let mut p = Pair::new();
    p.a.mr.bytes_mut()[..64].fill(0x11);
    let src = p.a.mr.sge(0, 64).unwrap();
    send_and_check(&mut p, 1, src, 0x11);
    // A completion waiting in A's CQ: the child must not see it.
    let sge = [p.a.mr.sge(0, 8).unwrap()];
    let remote = Remote {
        addr: p.b.mr.addr() + 4096,
        rkey: p.b.mr.rkey(),
    };
    // SAFETY: the buffers named stay valid and unchanged until the completion.
    unsafe { p.a.qp.post_send(&[SendWr::new(50, SendOp::RdmaWrite(remote), &sge)]) }.unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let pid = fork();
    if pid == 0 {
        let forked = |r: Result<()>| matches!(r, Err(Error::Forked { .. }));
        let rsge = [p.a.mr.sge(64, 64).unwrap()];
        let mut wc = [WorkCompletion::default(); 4];
        let checks = [
            forked(p.a.qp.query().map(drop)),
            forked(p.ctx.alloc_pd().map(drop)),
            forked(p.ctx.query_device().map(drop)),
            forked(p.ctx.create_cq(16).map(drop)),
            // SAFETY: refused before reaching the ring.
            forked(unsafe { p.a.qp.post_send(&[SendWr::new(77, SendOp::Send, &sge)]) }),
            // SAFETY: as above.
            forked(unsafe { p.a.qp.post_recv(&[RecvWr::new(78, &rsge)]) }),
            p.a.cq.poll(&mut wc) == 0,
            // The checked poll and the check read no async event of the parent's.
            forked(p.a.cq.try_poll(&mut wc).map(drop)),
            forked(p.a.cq.check()),
            // The send ring is not mapped in the child: nothing is read.
            p.a.qp.send_room() == 0,
        ];
        let failed = checks.iter().position(|ok| !ok).map_or(0, |i| 10 + i as i32);
        // Every inherited handle dropped: with the parent's objects untouched.
        drop(p);
        exit_child(failed);
    }
    assert_eq!(
        wait(pid),
        0,
        "the child's check 10 + i failed (query, alloc_pd, query_device, create_cq, post_send, post_recv, poll, try_poll, check, send_room)"
    );
    assert!(p.a.qp.query().is_ok(), "the parent's QP survived the child's drops");
    assert_eq!(
        poll_n(&mut p.a.cq, 1, 1)[0].wr_id,
        50,
        "the completion stayed the parent's"
    );
    p.a.mr.bytes_mut()[..64].fill(0x22);
    let src = p.a.mr.sge(0, 64).unwrap();
    send_and_check(&mut p, 2, src, 0x22);
    assert_idle(&mut p.a.cq);
    figure(format_args!(
        "forked child: query, alloc_pd, query_device, create_cq, post_send, post_recv, try_poll, check all Error::Forked, poll empty, its drops destroyed nothing; the parent unaffected"
    ));
}
