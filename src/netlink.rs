//! The one RDMA netlink query the core needs: the kernel's index of each uverbs device and
//! which driver backs it (`RDMA_NLDEV_CMD_GET` dump, then `RDMA_NLDEV_CMD_GET_CHARDEV` per
//! device), the way rdma-core matches providers by driver id and rdma_cm ids to devices.

use nix::sys::socket::{recv, send, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

const RDMA_NL_NLDEV: u16 = 5;
const CMD_GET: u16 = 1;
const CMD_GET_CHARDEV: u16 = 15;
const ATTR_DEV_INDEX: u16 = 1;
const ATTR_CHARDEV_TYPE: u16 = 69;
const ATTR_CHARDEV_NAME: u16 = 70;
const ATTR_UVERBS_DRIVER_ID: u16 = 73;

const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;

/// What netlink says about one uverbs device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NlDevice {
    /// The kernel's device index (`RDMA_NLDEV_ATTR_DEV_INDEX`).
    pub index: u32,
    /// The kernel's `enum rdma_driver_id`.
    pub driver_id: u32,
}

/// Maps uverbs character device names (`uverbs0`) to the device behind them.
pub(crate) fn uverbs_devices() -> std::io::Result<HashMap<String, NlDevice>> {
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRDMA,
    )?;
    let mut seq = 0;
    let mut indices = Vec::new();
    for msg in exchange(&sock, &mut seq, CMD_GET, NLM_F_DUMP, &[])? {
        if let Some(index) = attrs(&msg)
            .find(|(t, _)| *t == ATTR_DEV_INDEX)
            .and_then(|a| as_u32(a.1))
        {
            indices.push(index);
        }
    }
    let mut ids = HashMap::new();
    for index in indices {
        let mut req = Vec::new();
        put_attr(&mut req, ATTR_DEV_INDEX, &index.to_ne_bytes());
        put_attr(&mut req, ATTR_CHARDEV_TYPE, b"uverbs\0");
        // A device without a uverbs interface answers with an error: skip it.
        let Ok(reply) = exchange(&sock, &mut seq, CMD_GET_CHARDEV, 0, &req) else {
            continue;
        };
        for msg in reply {
            let mut name = None;
            let mut driver = None;
            for (kind, value) in attrs(&msg) {
                match kind {
                    ATTR_CHARDEV_NAME => name = Some(String::from_utf8_lossy(value).trim_end_matches('\0').to_owned()),
                    ATTR_UVERBS_DRIVER_ID => driver = as_u32(value),
                    _ => {}
                }
            }
            if let (Some(name), Some(driver_id)) = (name, driver) {
                ids.insert(name, NlDevice { index, driver_id });
            }
        }
    }
    Ok(ids)
}

/// Sends one request and collects the payloads of its reply messages.
fn exchange(sock: &OwnedFd, seq: &mut u32, cmd: u16, flags: u16, payload: &[u8]) -> std::io::Result<Vec<Vec<u8>>> {
    *seq += 1;
    let len = NLMSG_HDRLEN + payload.len();
    let mut msg = Vec::with_capacity(len);
    msg.extend_from_slice(&(len as u32).to_ne_bytes());
    msg.extend_from_slice(&((RDMA_NL_NLDEV << 10) + cmd).to_ne_bytes());
    msg.extend_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    msg.extend_from_slice(&seq.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(payload);
    send(sock.as_raw_fd(), &msg, MsgFlags::empty())?;

    let mut out = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        let mut rest = &buf[..n];
        while rest.len() >= NLMSG_HDRLEN {
            let mlen = u32::from_ne_bytes(rest[0..4].try_into().unwrap_or_default()) as usize;
            let kind = u16::from_ne_bytes([rest[4], rest[5]]);
            if mlen < NLMSG_HDRLEN || mlen > rest.len() {
                return Err(std::io::Error::other("truncated netlink message"));
            }
            match kind {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => {
                    let code = rest
                        .get(16..20)
                        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .unwrap_or(-1);
                    if code != 0 {
                        return Err(std::io::Error::from_raw_os_error(-code));
                    }
                    return Ok(out);
                }
                _ => out.push(rest[NLMSG_HDRLEN..mlen].to_vec()),
            }
            rest = &rest[align4(mlen).min(rest.len())..];
        }
        if flags & NLM_F_DUMP == 0 {
            return Ok(out);
        }
    }
}

fn put_attr(buf: &mut Vec<u8>, kind: u16, value: &[u8]) {
    buf.extend_from_slice(&((NLA_HDRLEN + value.len()) as u16).to_ne_bytes());
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(value);
    buf.resize(align4(buf.len()), 0);
}

/// Iterates over `(type, value)` attributes of a message payload, stopping at malformed data.
fn attrs(mut payload: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if payload.len() < NLA_HDRLEN {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([payload[0], payload[1]]));
        let kind = u16::from_ne_bytes([payload[2], payload[3]]) & 0x3fff;
        if len < NLA_HDRLEN || len > payload.len() {
            return None;
        }
        let value = &payload[NLA_HDRLEN..len];
        payload = &payload[align4(len).min(payload.len())..];
        Some((kind, value))
    })
}

fn as_u32(value: &[u8]) -> Option<u32> {
    match value.len() {
        4 => Some(u32::from_ne_bytes(value.try_into().ok()?)),
        8 => u32::try_from(u64::from_ne_bytes(value.try_into().ok()?)).ok(),
        _ => None,
    }
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip_and_stop_at_garbage() {
        let mut buf = Vec::new();
        put_attr(&mut buf, ATTR_DEV_INDEX, &7u32.to_ne_bytes());
        put_attr(&mut buf, ATTR_CHARDEV_NAME, b"uverbs3\0");
        put_attr(&mut buf, ATTR_UVERBS_DRIVER_ID, &14u64.to_ne_bytes());
        buf.extend_from_slice(&[0xff, 0xff, 1]);
        let got: Vec<_> = attrs(&buf).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(as_u32(got[0].1), Some(7));
        assert_eq!(got[1].1, b"uverbs3\0");
        assert_eq!(as_u32(got[2].1), Some(14));
    }
}
