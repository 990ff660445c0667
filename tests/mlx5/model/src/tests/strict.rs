//! The strict device: a packet is delivered only when a real port and QP would take it, and
//! every packet dropped is counted with its reason. Each test sends what a device drops,
//! through the verbs where a client can send it, else by changing one header of a packet the
//! device built, and checks the reason counted. Also the RoCE port: its GID table, the
//! destination MAC MODIFY_QP and CREATE_AH resolve, and traffic through each GID.

use super::*;
use crate::device::{Device, Work};
use crate::port::{DropReason, GidType, Port};
use crate::wire::Response;
use std::time::Instant;

const ETH: LinkLayer = LinkLayer::Ethernet;
const IB: LinkLayer = LinkLayer::InfiniBand;

/// Takes the next request the device would put on the wire.
fn next_request(p: &Pair) -> Work {
    let mut m = p.env.model.lock().unwrap();
    let mut active = false;
    Device::next_work(&mut m, &p.env.mem, Instant::now(), &mut active).expect("a request to send")
}

/// Hands `work` to the responder (after `change`) and returns its answer and the reasons
/// counted.
fn deliver(p: &Pair, mut work: Work, change: impl FnOnce(&mut Work)) -> (Response, Vec<(DropReason, u64)>) {
    change(&mut work);
    let mut m = p.env.model.lock().unwrap();
    let answer = Device::respond(&mut m, &work.request, &p.env.mem);
    let counted = DropReason::ALL
        .iter()
        .map(|r| (*r, m.drops.count(*r)))
        .filter(|(_, n)| *n > 0)
        .collect();
    (answer, counted)
}

fn drops(p: &Pair) -> Vec<(DropReason, u64)> {
    let m = p.env.model.lock().unwrap();
    DropReason::ALL
        .iter()
        .map(|r| (*r, m.drops.count(*r)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Runs the device until its retries are spent (the model's ACK timeout of `timeout` 1 is
/// 8 µs; `drive` returns while a QP waits for it).
fn settle(p: &Pair) {
    for _ in 0..20 {
        p.env.drive();
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

fn send_one(p: &mut Pair) {
    p.env.mem.write(DATA, b"strict").unwrap();
    p.recv(1, DATA + 0x1000, 64);
    p.post(0, abi::opcode::SEND, &data_seg(6, p.key, DATA), true);
}

#[test]
fn the_roce_port_has_v1_and_v2_gids_of_its_mac_and_addresses() {
    let port = Port::new(0x0102, ETH);
    assert_eq!(port.mac, [0x02, 0x00, 0xc9, 0x00, 0x01, 0x02]);
    let types: Vec<_> = port.gids.iter().map(|g| g.ty).collect();
    assert_eq!(types, [GidType::RoceV1, GidType::RoceV2].repeat(3));
    // fe80:: and the modified EUI-64 of the MAC (the U/L bit flipped, ff:fe inserted).
    assert_eq!(
        crate::port::sysfs_gid(&port.gids[0].gid),
        "fe80:0000:0000:0000:0000:c9ff:fe00:0102"
    );
    assert_eq!(port.gids[1].gid, port.gids[0].gid);
    assert_eq!(
        crate::port::sysfs_gid(&port.gids[3].gid),
        "0000:0000:0000:0000:0000:ffff:0a4d:0102"
    );
    assert_eq!(
        crate::port::sysfs_gid(&port.gids[5].gid),
        "fd00:0077:0000:0000:0000:0000:0000:0102"
    );
    let files = port.sysfs_files();
    assert!(files.contains(&("gid_attrs/types/1".into(), "RoCE v2".into())));
    assert!(files.contains(&("gid_attrs/types/2".into(), "IB/RoCE v1".into())));
    assert!(files.contains(&("gid_attrs/ndevs/5".into(), crate::port::NETDEV.into())));
    assert_eq!(port.gid(6).unwrap_err(), libc::ENODATA);
    assert_eq!(port.gid(255).unwrap_err(), libc::ENODATA);
    // The InfiniBand port: one GID, fe80:: and the port GUID, no netdev.
    let ib = Port::new(0x0102, IB);
    assert_eq!(ib.gids.len(), 1);
    assert_eq!(ib.gid(1).unwrap_err(), EINVAL);
    assert!(!ib.sysfs_files().iter().any(|(f, _)| f.contains("ndevs")));
}

#[test]
fn roce_paths_resolve_the_destination_mac_as_the_core_does() {
    let mut port = Port::new(7, ETH);
    let other = Port::new(9, ETH);
    // A link-local DGID from a v1 GID: the MAC out of the GID, the hop limit left alone.
    assert_eq!(port.resolve_dmac(0, &other.gids[0].gid), Ok((other.mac, None)));
    // From a v2 GID, and to IP addresses: the neighbour table, the route's hop limit.
    assert_eq!(port.resolve_dmac(1, &other.gids[1].gid), Err(libc::ETIMEDOUT));
    assert_eq!(port.resolve_dmac(3, &other.gids[3].gid), Err(libc::ETIMEDOUT));
    port.neighbours.insert(other.gids[3].gid, other.mac);
    assert_eq!(port.resolve_dmac(3, &other.gids[3].gid), Ok((other.mac, Some(64))));
    // Families must agree; an address off the netdev's subnets has no route.
    assert_eq!(port.resolve_dmac(3, &other.gids[5].gid), Err(EINVAL));
    assert_eq!(
        port.resolve_dmac(3, &crate::port::v4_mapped([192, 0, 2, 1])),
        Err(libc::ENETUNREACH)
    );
    // Multicast maps to its multicast MAC.
    assert_eq!(
        port.resolve_dmac(3, &crate::port::v4_mapped([224, 1, 2, 3])).unwrap().0,
        [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]
    );
    // An index naming no GID: ENODATA (empty) or EINVAL (beyond the table).
    assert_eq!(port.resolve_dmac(6, &other.gids[3].gid), Err(libc::ENODATA));
    // RoCE v2's UDP source port from the flow label, or from the QP numbers without one.
    assert_eq!(Port::udp_sport(0x1_2345, 1, 2), 0xc000 | (0x2345 ^ 0x4));
    assert!(Port::udp_sport(0, 0x700, 0x701) >= 0xc000);
}

#[test]
fn rc_over_each_roce_gid_delivers_with_the_resolved_path() {
    for sgid_index in 0..6u8 {
        let mut p = Pair::new_on(ETH, sgid_index, 7);
        {
            let m = p.env.model.lock().unwrap();
            let qp = m.qps.iter().next().unwrap().1;
            assert_eq!(qp.attrs.dmac, m.port.mac, "sgid {sgid_index}");
            let v2 = m.port.gids[usize::from(sgid_index)].ty == GidType::RoceV2;
            // The IP stack's hop limit replaces the caller's 1, except for a link-local
            // destination from a v1 GID (no IP resolution).
            let want_hops = if sgid_index == 0 { 1 } else { 64 };
            assert_eq!(qp.attrs.dest.hop_limit, want_hops, "sgid {sgid_index}");
            assert_eq!(qp.attrs.udp_sport >= 0xc000, v2, "sgid {sgid_index}");
        }
        send_one(&mut p);
        let work = next_request(&p);
        let eth = work.request.hdr.eth.unwrap();
        assert_eq!(eth.v2, sgid_index % 2 == 1);
        assert_eq!(work.dlid, 7, "routed to the port whose MAC it is");
        let (answer, counted) = deliver(&p, work, |_| {});
        assert_eq!((answer, counted), (Response::Ack, vec![]), "sgid {sgid_index}");
    }
}

#[test]
fn roce_modify_qp_needs_a_grh_and_a_resolvable_destination() {
    let (env, _, handles, qpn) = Pair::qps_on(abi::qpt::RC, ETH);
    env.modify(handles[0], |m| {
        m.attr_mask = qp_attr::STATE | qp_attr::PKEY_INDEX | qp_attr::PORT | qp_attr::ACCESS_FLAGS;
        (m.qp_state, m.port_num) = (qps::INIT, 1);
    })
    .unwrap();
    let rtr = |f: &dyn Fn(&mut abi::ModifyQp)| {
        env.modify(handles[0], |m| {
            m.attr_mask = qp_attr::STATE
                | qp_attr::AV
                | qp_attr::PATH_MTU
                | qp_attr::DEST_QPN
                | qp_attr::RQ_PSN
                | qp_attr::MAX_DEST_RD_ATOMIC
                | qp_attr::MIN_RNR_TIMER;
            (m.qp_state, m.path_mtu, m.dest_qp_num, m.dest.port_num) = (qps::RTR, 3, qpn[1], 1);
            f(m);
        })
    };
    let stranger = Port::new(99, ETH);
    assert_eq!(rtr(&|_| {}), Err(EINVAL), "no GRH on RoCE");
    assert_eq!(
        rtr(&|m| (m.dest.is_global, m.dest.sgid_index) = (1, 6)),
        Err(libc::ENODATA)
    );
    assert_eq!(
        rtr(&|m| (m.dest.is_global, m.dest.sgid_index, m.dest.dgid) = (1, 3, stranger.gids[3].gid)),
        Err(libc::ETIMEDOUT),
        "no neighbour entry"
    );
    let own = env.model.lock().unwrap().port.gids[3].gid;
    assert_eq!(
        rtr(&|m| (m.dest.is_global, m.dest.sgid_index, m.dest.dgid) = (1, 3, own)),
        Ok(())
    );
}

#[test]
fn roce_create_ah_answers_the_destination_mac() {
    let env = Env::new_on(false, ETH);
    let pd = env.alloc_pd();
    let own = env.model.lock().unwrap().port.clone();
    // The driver's response follows the core's 4 bytes: `out_words` 5 leave it 16 bytes.
    let ah = |is_global: u8, sgid_index: u8, dgid: [u8; 16], out_words: u16| {
        let req = abi::CreateAh {
            response: RESP,
            user_handle: 1,
            pd_handle: pd,
            reserved: 0,
            attr: abi::AhAttr {
                dgid,
                sgid_index,
                hop_limit: 64,
                is_global,
                port_num: 1,
                ..Default::default()
            },
        };
        env.mem.write(RESP + 4, &[0xee; 16]).unwrap();
        env.write(cmd::CREATE_AH, req.as_bytes(), &[], out_words)
    };
    assert_eq!(ah(0, 0, [0; 16], 5), Err(EINVAL), "RoCE AHs need a GRH");
    assert_eq!(
        ah(1, 3, own.gids[3].gid, 3),
        Err(EINVAL),
        "a response shorter than dmac"
    );
    assert_eq!(ah(1, 6, own.gids[3].gid, 5), Err(libc::ENODATA), "an empty GID entry");
    assert_eq!(ah(1, 3, own.gids[3].gid, 5), Ok(()));
    let mut resp = [0u8; 16];
    env.mem.read(RESP + 4, &mut resp).unwrap();
    assert_eq!(resp[..4], 10u32.to_ne_bytes());
    assert_eq!(resp[4..10], own.mac);
    assert_eq!(resp[10..], [0xee; 6], "only response_length bytes are written");
}

#[test]
fn a_wrong_dgid_is_dropped_and_the_requester_runs_out_of_retries() {
    // A stale neighbour entry sends 10.77.9.9's packets to this port: its MAC is right,
    // the DGID is no GID of the port.
    let stranger = Port::new(0x0909, ETH).gids[3].gid;
    let (mut env, key, h, qpn) = Pair::qps_on(abi::qpt::RC, ETH);
    {
        let mut m = env.model.lock().unwrap();
        let mac = m.port.mac;
        m.port.neighbours.insert(stranger, mac);
    }
    env.connect(h[1], qpn[0], 7);
    env.dgid = Some(stranger);
    env.connect(h[0], qpn[1], 7);
    let mut p = Pair::with(env, key, qpn);
    send_one(&mut p);
    settle(&p);
    assert_eq!(
        p.cqes(),
        vec![(abi::cqe_op::REQ_ERR, abi::syndrome::TRANSPORT_RETRY_EXC, 0)]
    );
    // The first try and one retry (retry_cnt 1).
    assert_eq!(drops(&p), vec![(DropReason::Dgid, 2)]);
}

#[test]
fn each_header_a_port_or_qp_checks_drops_with_its_reason() {
    type Change = fn(&mut Work);
    let cases: [(LinkLayer, &str, Change, DropReason); 10] = [
        (
            ETH,
            "dmac",
            |w| w.request.hdr.eth.as_mut().unwrap().dmac[5] ^= 1,
            DropReason::Dmac,
        ),
        (
            ETH,
            "dgid",
            |w| w.request.hdr.grh.as_mut().unwrap().dgid[15] ^= 1,
            DropReason::Dgid,
        ),
        (
            ETH,
            "v1 to a v2 GID",
            |w| w.request.hdr.eth.as_mut().unwrap().v2 = false,
            DropReason::GidType,
        ),
        (ETH, "no GRH", |w| w.request.hdr.grh = None, DropReason::GidType),
        (
            ETH,
            "hop limit",
            |w| w.request.hdr.grh.as_mut().unwrap().hop_limit = 0,
            DropReason::HopLimit,
        ),
        (ETH, "pkey", |w| w.request.hdr.pkey = 0x8001, DropReason::Pkey),
        (
            ETH,
            "sgid",
            |w| w.request.hdr.grh.as_mut().unwrap().sgid[0] ^= 1,
            DropReason::Source,
        ),
        (IB, "dlid", |w| w.request.hdr.dlid = 8, DropReason::Dlid),
        (IB, "pkey", |w| w.request.hdr.pkey = 0x7ffe, DropReason::Pkey),
        (IB, "src qpn", |w| w.request.src_qpn ^= 1, DropReason::SrcQpn),
    ];
    for (link, what, change, reason) in cases {
        let mut p = Pair::new_on(link, 3, 7);
        send_one(&mut p);
        let work = next_request(&p);
        let (answer, counted) = deliver(&p, work, change);
        assert_eq!((answer, counted), (Response::Dropped, vec![(reason, 1)]), "{what}");
    }
}

#[test]
fn a_wrong_psn_is_dropped_and_a_repeated_one_is_answered_again() {
    for link in [IB, ETH] {
        let mut p = Pair::new_on(link, 3, 7);
        send_one(&mut p);
        let work = next_request(&p);
        let psn = work.request.hdr.psn;
        let repeat = work.request.clone();
        let (answer, _) = deliver(&p, work, |_| {});
        assert_eq!(answer, Response::Ack);
        // The same PSN again: a duplicate, acknowledged and not run again.
        let mut m = p.env.model.lock().unwrap();
        assert_eq!(Device::respond(&mut m, &repeat, &p.env.mem), Response::Ack);
        // A PSN ahead of the expected one: dropped.
        let mut ahead = repeat.clone();
        ahead.hdr.psn = psn + 5;
        assert_eq!(Device::respond(&mut m, &ahead, &p.env.mem), Response::Dropped);
        assert_eq!(m.drops.count(DropReason::Psn), 1, "{link:?}");
        drop(m);
        // One receive taken, one completion: the duplicate ran nothing.
        assert_eq!(p.cqes().len(), 1, "{link:?}");
    }
}

#[test]
fn mismatched_start_psns_end_in_retry_exceeded() {
    for link in [IB, ETH] {
        let (env, key, h, qpn) = Pair::qps_on(abi::qpt::RC, link);
        // The sender starts ahead of what the receiver expects (a PSN behind it would be a
        // duplicate: acknowledged, not delivered).
        env.connect_psn(h[0], qpn[1], 7, (0x42, 0));
        env.connect_psn(h[1], qpn[0], 7, (0, 0));
        let mut p = Pair::with(env, key, qpn);
        send_one(&mut p);
        settle(&p);
        assert_eq!(
            p.cqes(),
            vec![(abi::cqe_op::REQ_ERR, abi::syndrome::TRANSPORT_RETRY_EXC, 0)],
            "{link:?}"
        );
        // The first try and one retry (retry_cnt 1).
        assert_eq!(drops(&p), vec![(DropReason::Psn, 2)], "{link:?}");
    }
}

#[test]
fn a_receiver_not_in_rtr_drops_and_ud_counts_qkey_and_qpn() {
    let mut p = Pair::new(7);
    p.env
        .modify(1, |m| (m.attr_mask, m.qp_state) = (qp_attr::STATE, qps::ERR))
        .unwrap();
    p.post(0, abi::opcode::SEND, &data_seg(6, p.key, DATA), true);
    settle(&p);
    assert_eq!(drops(&p), vec![(DropReason::QpState, 2)]);
    for link in [IB, ETH] {
        let mut p = Pair::ud_on(link, 0x1111_1111);
        p.recv(1, DATA + 0x1000, 100);
        let port = Port::new(7, link);
        let segs = |qkey: u32, qpn: u32, key: u32| {
            let mut av = [0u8; 48];
            av[0..4].copy_from_slice(&qkey.to_be_bytes());
            av[8..12].copy_from_slice(&(0x8000_0000 | qpn).to_be_bytes());
            av[14..16].copy_from_slice(&7u16.to_be_bytes());
            if link == ETH {
                av[20..26].copy_from_slice(&port.mac);
                av[27] = 64;
                av[28..32].copy_from_slice(&(3u32 << 20).to_be_bytes());
                av[32..48].copy_from_slice(&port.gids[3].gid);
            }
            let mut segs = av.to_vec();
            segs.extend_from_slice(&data_seg(8, key, DATA));
            segs
        };
        let (key, dqpn) = (p.key, p.qpn[1]);
        p.post(0, abi::opcode::SEND, &segs(0x2222, dqpn, key), true);
        p.post(0, abi::opcode::SEND, &segs(0x1111_1111, dqpn + 9, key), true);
        p.post(0, abi::opcode::SEND, &segs(0x1111_1111, dqpn, key), true);
        p.env.drive();
        assert_eq!(
            drops(&p),
            vec![(DropReason::Qkey, 1), (DropReason::DestQpn, 1)],
            "{link:?}"
        );
        // The third arrives: on Ethernet with the IPv4 header in the last 20 bytes of the
        // GRH room, the CQE flagging a GRH of type IPv4 (2).
        let resp = p
            .raw_cqes()
            .into_iter()
            .find(|c| c[63] >> 4 == abi::cqe_op::RESP_SEND)
            .expect("the datagram with the right Q_Key and QPN");
        let mut grh = [0u8; 40];
        p.env.mem.read(DATA + 0x1000, &mut grh).unwrap();
        if link == ETH {
            assert_eq!(resp[24], (1 << 4) | 2);
            assert_eq!(grh[20], 0x45);
            assert_eq!(grh[28], 64, "TTL");
            assert_eq!(grh[29], 17, "UDP");
            assert_eq!(grh[32..36], [10, 77, 0, 7]);
            assert_eq!(grh[36..40], [10, 77, 0, 7]);
        } else {
            assert_eq!(resp[24], 0, "no GRH, SL 0");
        }
    }
}
