//! `mmap` of the device file (UAR and clock pages) and the UAR object's ioctl methods.

use super::context::ucontext;
use super::*;

/// `PROT_READ | PROT_WRITE`, `MAP_SHARED`: how libraries map UAR pages.
pub(super) const RW_SHARED: MapAccess = MapAccess {
    write: true,
    exec: false,
    shared: true,
};
/// `PROT_READ`, `MAP_SHARED`: how libmlx5 maps the clock pages.
const RO_SHARED: MapAccess = MapAccess {
    write: false,
    exec: false,
    shared: true,
};

#[test]
fn mmap_rules() {
    let env = Env::new(false);
    let m = env.model.lock().unwrap();
    assert_eq!(m.check_mmap(CTX, 0, 4096, RW_SHARED), Ok(Mapping::Uar));
    assert_eq!(m.check_mmap(CTX, 0, 8192, RW_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 8, 4096, RW_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 2 << 8, 4096, RW_SHARED), Err(EPERM));
    assert_eq!(m.check_mmap(CTX, 1 << 8, 4096, RW_SHARED), Err(libc::ENOSYS));
    drop(m);
    let env = Env::new(true);
    assert_eq!(
        env.model.lock().unwrap().check_mmap(CTX, 0, 4096, RW_SHARED),
        Err(EINVAL)
    );
}

/// The core clock page (command 5): one page, read-only (main.c:2327-2331); the clock info
/// page (command 7): one shared page, index 1, read-only, and on the model (no clock
/// frequency) EOPNOTSUPP after those checks (main.c:2096-2111).
#[test]
fn clock_page_mmap_rules() {
    let env = Env::new(false);
    let m = env.model.lock().unwrap();
    let private = MapAccess {
        shared: false,
        ..RO_SHARED
    };
    let exec = MapAccess {
        exec: true,
        ..RO_SHARED
    };
    assert_eq!(m.check_mmap(CTX, 5 << 8, 4096, RO_SHARED), Ok(Mapping::CoreClock));
    assert_eq!(m.check_mmap(CTX, 5 << 8, 4096, private), Ok(Mapping::CoreClock));
    assert_eq!(m.check_mmap(CTX, 5 << 8, 8192, RO_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 5 << 8, 4096, RW_SHARED), Err(EPERM));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, RO_SHARED), Err(libc::EOPNOTSUPP));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 8192, RO_SHARED), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, private), Err(EINVAL));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 2, 4096, RO_SHARED), Err(libc::EOPNOTSUPP));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, RW_SHARED), Err(EPERM));
    assert_eq!(m.check_mmap(CTX, 7 << 8 | 1, 4096, exec), Err(EPERM));
}

/// GET_CONTEXT reports the core clock page's offset (main.c:1826) and MKEY_UPDATE_TAG
/// (main.c:1848), no clock info page, and `min(outlen, 72)` as its length (main.c:1953),
/// cut mid-field where the buffer ends.
#[test]
fn ucontext_resp_reports_the_core_clock_and_its_length() {
    let env = Env::bare();
    env.get_context(ucontext(|_| {}).as_bytes()).unwrap();
    let resp: [u8; 80] = env.resp();
    let drv = abi::AllocUcontextResp::read_from_bytes(&resp[8..]).unwrap();
    assert_eq!(drv.comp_mask, 1 | 1 << 5);
    assert_eq!((drv.hca_core_clock_offset, drv.clock_info_versions), (0, 0));
    assert_eq!(drv.response_length, 72);
    // 60 bytes of response: the core's 8 and 52 of the driver's, which ends inside
    // hca_core_clock_offset (bytes 48..56).
    let env = Env::bare();
    env.write(cmd::GET_CONTEXT, &RESP.to_ne_bytes(), ucontext(|_| {}).as_bytes(), 15)
        .unwrap();
    let resp: [u8; 80] = env.resp();
    let drv = abi::AllocUcontextResp::read_from_bytes(&resp[8..]).unwrap();
    assert_eq!(drv.response_length, 52);
}

fn uar_ioctl(env: &Env, f: impl FnOnce(&mut abi::IoctlHdr, &mut Vec<abi::IoctlAttr>)) -> Result<(), Errno> {
    let mut hdr = abi::IoctlHdr {
        length: 24 + 16 * 5,
        object_id: abi::uar_obj::OBJECT,
        method_id: abi::uar_obj::METHOD_ALLOC,
        num_attrs: 5,
        driver_id: abi::RDMA_DRIVER_MLX5,
        ..Default::default()
    };
    let out = |id, at: u64, len| abi::IoctlAttr {
        attr_id: id,
        len,
        flags: 1,
        attr_data: 0,
        data: RESP + at,
    };
    let mut attrs = vec![
        abi::IoctlAttr {
            attr_id: abi::uar_obj::ATTR_HANDLE,
            flags: 1,
            ..Default::default()
        },
        abi::IoctlAttr {
            attr_id: abi::uar_obj::ATTR_TYPE,
            len: 8,
            flags: 1,
            data: abi::uar_obj::TYPE_NC,
            attr_data: 0,
        },
        out(abi::uar_obj::ATTR_MMAP_OFFSET, 0, 8),
        out(abi::uar_obj::ATTR_MMAP_LENGTH, 8, 4),
        out(abi::uar_obj::ATTR_PAGE_ID, 12, 4),
    ];
    f(&mut hdr, &mut attrs);
    let mut bytes = hdr.as_bytes().to_vec();
    for a in &attrs {
        bytes.extend_from_slice(a.as_bytes());
    }
    env.mem.write(CMD, &bytes).unwrap();
    env.model
        .lock()
        .unwrap()
        .ioctl(CTX, abi::RDMA_VERBS_IOCTL, CMD, &env.mem, &env.host)
}

#[test]
fn ioctl_rules() {
    let env = Env::new(true);
    assert_eq!(uar_ioctl(&env, |h, _| h.reserved1 = 1), Err(EPROTONOSUPPORT));
    assert_eq!(uar_ioctl(&env, |h, _| h.length += 1), Err(EINVAL));
    assert_eq!(uar_ioctl(&env, |h, _| h.driver_id = 14), Err(EINVAL));
    assert_eq!(uar_ioctl(&env, |h, _| h.object_id = 0), Err(EPROTONOSUPPORT));
    assert_eq!(
        uar_ioctl(&env, |_, a| a[1].data = abi::uar_obj::TYPE_BF),
        Err(EOPNOTSUPP)
    );
    let unknown = abi::IoctlAttr {
        attr_id: 0x1010,
        flags: 1,
        ..Default::default()
    };
    let more = |h: &mut abi::IoctlHdr, a: &mut Vec<abi::IoctlAttr>| {
        a.push(unknown);
        (h.num_attrs, h.length) = (6, 24 + 16 * 6);
    };
    assert_eq!(uar_ioctl(&env, more), Err(EPROTONOSUPPORT));
    assert_eq!(uar_ioctl(&env, |_, _| {}), Ok(()));
    let offset = u64::from_ne_bytes(env.resp::<[u8; 8]>());
    // The first dynamic entry: command 9 in bits 8-15 of the page offset (main.c:2297).
    assert_eq!(offset, 0x900 * 4096);
    assert_eq!(
        env.model
            .lock()
            .unwrap()
            .check_mmap(CTX, offset / 4096, 4096, RW_SHARED),
        Ok(Mapping::Uar)
    );
    // The entry's internal offset (9 << 16) is a legacy command 0 offset: EINVAL here.
    assert_eq!(
        env.model.lock().unwrap().check_mmap(CTX, 9 << 16, 4096, RW_SHARED),
        Err(EINVAL)
    );
    assert_eq!(
        env.model
            .lock()
            .unwrap()
            .check_mmap(CTX, offset / 4096, 8192, RW_SHARED),
        Err(EINVAL)
    );
    assert_eq!(
        env.model.lock().unwrap().ioctl(CTX, 0x1234, CMD, &env.mem, &env.host),
        Err(libc::ENOTTY)
    );
}
