//! Framed `write()` commands: `ib_uverbs_cmd_hdr | core request | driver request`, with the
//! response (core then driver bytes) written by the kernel through a user pointer.

use super::abi::{
    cmd, CmdHdr, CreateCompChannel, CreateCompChannelResp, ExCmdHdr, PostSend, CMD_FLAG_EXTENDED, SEND_WR_SIZE,
};
use crate::error::{Error, Result, Verb, WrReject};
use nix::errno::Errno;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Largest command this crate frames, header and driver data included.
const MAX_CMD: usize = 256;
/// Largest response (core + driver) this crate accepts.
const MAX_RESP: usize = 512;

/// The core request of a framed command.
///
/// # Safety
/// [`Request::RESPONSE`] is true exactly when the layout begins with the ABI's `response`
/// user pointer (`__aligned_u64 response`): [`execute`] writes that pointer over the
/// request's first 8 bytes.
pub unsafe trait Request: IntoBytes + Immutable {
    /// Whether the command answers: its request begins with the `response` pointer, and the
    /// kernel writes the core response, then the driver's, there. A command without one gets
    /// no response at all: Linux's `ib_uverbs_write` gives its driver no response buffer
    /// either (`has_resp` unset: `driver_udata.outlen` 0).
    const RESPONSE: bool;
}

/// Sends one non-extended command and returns the response bytes it asked for.
///
/// `req` is the core request. A command that answers ([`Request::RESPONSE`]) gets its
/// `response` pointer filled in, and `Resp` and `driver_out` receive the core and driver
/// parts of the answer; one that does not is sent exactly as built, with no response words,
/// `Resp` zero-sized and `driver_out` left as given. `driver_in` follows the core request.
///
/// # Safety
/// Any user pointer in `req` or `driver_in` other than the `response` field (which this
/// function owns) must name memory the kernel may access as the command defines.
pub unsafe fn execute<Req, Resp>(
    fd: BorrowedFd<'_>,
    verb: Verb,
    command: u32,
    req: &Req,
    driver_in: &[u8],
    driver_out: &mut [u8],
) -> Result<Resp>
where
    Req: Request,
    Resp: FromBytes + IntoBytes,
{
    let core_resp_len = size_of::<Resp>();
    if Req::RESPONSE != (core_resp_len > 0) {
        return Err(Error::invalid(
            verb,
            "the core response does not match the command's layout",
        ));
    }
    let resp_len = if Req::RESPONSE {
        core_resp_len + driver_out.len()
    } else {
        0
    };
    let cmd_len = size_of::<CmdHdr>() + size_of::<Req>() + driver_in.len();
    if cmd_len > MAX_CMD || resp_len > MAX_RESP || cmd_len % 4 != 0 || resp_len % 4 != 0 {
        return Err(Error::invalid(
            verb,
            "command or response does not fit the ABI's framing",
        ));
    }
    // 8-byte aligned so the kernel's response lands on aligned fields. Only the bytes a
    // command uses are written (zeroed for the response, which the kernel may leave short):
    // a connection makes several of these commands, and the buffers are the largest size.
    let mut resp = std::mem::MaybeUninit::<[u64; MAX_RESP / 8]>::uninit();
    // SAFETY: `resp_len` is at most `MAX_RESP` (checked above): the first `resp_len` bytes
    // are in the buffer, and zeroed before the slice is made.
    let resp_bytes = unsafe {
        let p = resp.as_mut_ptr().cast::<u8>();
        std::ptr::write_bytes(p, 0, resp_len);
        std::slice::from_raw_parts_mut(p, resp_len)
    };

    let mut buf = std::mem::MaybeUninit::<[u8; MAX_CMD]>::uninit();
    let hdr = CmdHdr {
        command,
        in_words: (cmd_len / 4) as u16,
        out_words: (resp_len / 4) as u16,
    };
    let base = buf.as_mut_ptr().cast::<u8>();
    let mut at = 0;
    for part in [hdr.as_bytes(), req.as_bytes(), driver_in] {
        // SAFETY: the parts' lengths add up to `cmd_len`, at most `MAX_CMD` (checked
        // above), and they are other memory.
        unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), base.add(at), part.len()) };
        at += part.len();
    }
    // SAFETY: the first `cmd_len` bytes were just written.
    let buf = unsafe { std::slice::from_raw_parts_mut(base, cmd_len) };
    if Req::RESPONSE {
        // The request's first field, right after the 8-byte header.
        let ptr = resp_bytes.as_mut_ptr() as u64;
        buf[8..16].copy_from_slice(&ptr.to_ne_bytes());
    }
    // SAFETY: the response pointer (if any) names `resp_bytes`, live and exactly the
    // `out_words` the header declares; other pointers are the caller's contract.
    unsafe { write_raw(fd, buf) }.map_err(|e| Error::kernel(verb, e))?;

    if !Req::RESPONSE {
        return Resp::read_from_bytes(&[]).map_err(|_| Error::malformed(verb, "short response"));
    }
    let (core, drv) = resp_bytes.split_at(core_resp_len);
    driver_out.copy_from_slice(drv);
    Resp::read_from_bytes(core).map_err(|_| Error::malformed(verb, "short response"))
}

/// A core request whose only user address is the ABI's `response` field, which [`execute`]
/// fills in itself.
///
/// # Safety
/// Implementors hold no other user address the kernel would access.
pub unsafe trait PlainRequest: Request {}

/// [`execute`] for a plain core request, with driver bytes that come from a provider. Every
/// provider trait that runs kernel commands is `unsafe` to implement, and its implementation
/// vouches for the user addresses in its driver bytes (`crate::provider::ProviderContext`):
/// the core passes no driver bytes of its own.
pub fn execute_plain<Req: PlainRequest, Resp: FromBytes + IntoBytes>(
    fd: BorrowedFd<'_>,
    verb: Verb,
    command: u32,
    req: &Req,
    driver_in: &[u8],
    driver_out: &mut [u8],
) -> Result<Resp> {
    // SAFETY: `Req` holds no user address but `response` (`PlainRequest`); the driver bytes
    // come from a provider, which vouches for the addresses in them.
    unsafe { execute(fd, verb, command, req, driver_in, driver_out) }
}

/// Sends one extended command (`ib_uverbs_cmd_hdr` with [`CMD_FLAG_EXTENDED`], then
/// `ib_uverbs_ex_cmd_hdr`, then `req`; sizes in 8-byte words) without driver data, and returns
/// the core response. The kernel writes at most `size_of::<Resp>()` bytes of its response
/// (and zeroes what it has no field for).
pub fn execute_ex<Req, Resp>(fd: BorrowedFd<'_>, verb: Verb, command: u32, req: &Req) -> Result<Resp>
where
    Req: ExRequest,
    Resp: FromBytes + IntoBytes,
{
    let resp_len = size_of::<Resp>();
    let cmd_len = size_of::<CmdHdr>() + size_of::<ExCmdHdr>() + size_of::<Req>();
    if cmd_len > MAX_CMD || resp_len > MAX_RESP || size_of::<Req>() % 8 != 0 || resp_len % 8 != 0 {
        return Err(Error::invalid(
            verb,
            "command or response does not fit the ABI's framing",
        ));
    }
    let mut resp = [0u64; MAX_RESP / 8];
    let resp_bytes = &mut resp.as_mut_bytes()[..resp_len];
    let hdr = CmdHdr {
        command: CMD_FLAG_EXTENDED | command,
        in_words: (size_of::<Req>() / 8) as u16,
        out_words: (resp_len / 8) as u16,
    };
    let ex = ExCmdHdr {
        response: resp_bytes.as_mut_ptr() as u64,
        ..ExCmdHdr::default()
    };
    let mut buf = [0u8; MAX_CMD];
    let mut at = 0;
    for part in [hdr.as_bytes(), ex.as_bytes(), req.as_bytes()] {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    // SAFETY: the only user address is the response pointer, which names `resp_bytes`, live
    // and exactly the `out_words` the header declares (`ExRequest`: the request holds none).
    unsafe { write_raw(fd, &buf[..cmd_len]) }.map_err(|e| Error::kernel(verb, e))?;
    Resp::read_from_bytes(resp_bytes).map_err(|_| Error::malformed(verb, "short response"))
}

/// The core request of an extended command: its response pointer is in the extended header,
/// so the request itself holds no user address.
///
/// # Safety
/// Implementors hold no user address the kernel would access.
pub unsafe trait ExRequest: IntoBytes + Immutable {}

// SAFETY: a comp_mask and a reserved word.
unsafe impl ExRequest for super::abi::ExQueryDevice {}

/// Runs CREATE_COMP_CHANNEL and takes ownership of the new channel's fd.
pub fn create_comp_channel(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    let verb = "CREATE_COMP_CHANNEL";
    let req = CreateCompChannel::default();
    let resp: CreateCompChannelResp = execute_plain(fd, verb, cmd::CREATE_COMP_CHANNEL, &req, &[], &mut [])?;
    let raw = RawFd::try_from(resp.fd).map_err(|_| Error::malformed(verb, format!("fd {}", resp.fd)))?;
    // SAFETY: the command succeeded, so the kernel created this fd for this process and
    // nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Writes a fully framed command.
///
/// # Safety
/// Every user pointer inside `cmd` (the response pointer, driver data pointers) must name
/// memory that is valid for the kernel to read or write for the sizes the command declares.
#[inline]
pub unsafe fn write_raw(fd: BorrowedFd<'_>, cmd: &[u8]) -> Result<(), Errno> {
    let n = nix::unistd::write(fd, cmd)?;
    if n != cmd.len() {
        return Err(Errno::EIO);
    }
    Ok(())
}

/// The empty `POST_SEND` command (no work requests) that providers whose kernel driver reads
/// the send queue itself use as the doorbell: the driver processes the queue inside the call.
/// Built once per QP; ringing it writes only the response pointer.
#[repr(C)]
#[derive(Clone, Copy, IntoBytes, Immutable)]
struct SendDoorbellCmd {
    hdr: CmdHdr,
    body: PostSend,
}

/// A QP's send doorbell: the empty `POST_SEND` on its handle.
pub struct SendDoorbell {
    cmd: SendDoorbellCmd,
    /// `ib_uverbs_post_send_resp`, written by the kernel.
    resp: u32,
}

impl SendDoorbell {
    /// The doorbell of the QP with kernel handle `qp_handle`.
    pub fn new(qp_handle: u32) -> Self {
        Self {
            cmd: SendDoorbellCmd {
                hdr: CmdHdr {
                    command: cmd::POST_SEND,
                    in_words: (size_of::<SendDoorbellCmd>() / 4) as u16,
                    out_words: 1,
                },
                body: PostSend {
                    response: 0,
                    qp_handle,
                    wr_count: 0,
                    sge_count: 0,
                    wqe_size: SEND_WR_SIZE,
                },
            },
            resp: 0,
        }
    }

    /// Rings, on the device file `fd`.
    #[inline]
    pub fn ring(&mut self, fd: BorrowedFd<'_>) -> Result<()> {
        self.cmd.body.response = std::ptr::addr_of_mut!(self.resp) as u64;
        // SAFETY: the only user pointer in the command is `response`, which names `self.resp`:
        // live, 4 bytes, the `out_words` the header declares.
        unsafe { write_raw(fd, self.cmd.as_bytes()) }.map_err(|e| Error::kernel("POST_SEND", e))
    }

    /// Ends a post that wrote requests into the send queue and stopped at `rejected` (the
    /// index of the request refused and why), if one was: rings if `posted` (any were
    /// written), then reports the refusal whatever the doorbell said (a post below RTS: the
    /// kernel refuses the doorbell, and the caller must still learn which requests are not in
    /// the queue, as libibverbs' `bad_wr` tells); else the doorbell's result.
    #[inline(always)]
    pub fn finish_post(&mut self, fd: BorrowedFd<'_>, posted: bool, rejected: Option<(usize, WrReject)>) -> Result<()> {
        let rung = if posted { self.ring(fd) } else { Ok(()) };
        match rejected {
            None => rung,
            Some((index, reason)) => Err(Error::WorkRequest {
                verb: "post_send",
                index,
                reason,
            }),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd};

    /// Checks one request type (`sys::abi::each_request` calls it for each).
    pub(crate) trait RequestCheck {
        fn check<T: Request + FromBytes>(&mut self, c_name: &str);
    }

    /// The installed `rdma/ib_user_verbs.h`, and the structs checked so far.
    struct Framing {
        header: String,
        checked: Vec<String>,
    }

    impl Framing {
        /// The first member of `struct c_name` in the header.
        fn first_member(&self, c_name: &str) -> &str {
            let open = format!("struct {c_name} {{");
            let at = self
                .header
                .find(&open)
                .unwrap_or_else(|| panic!("`{open}` in rdma/ib_user_verbs.h"));
            self.header[at + open.len()..]
                .lines()
                .map(str::trim)
                .find(|l| l.ends_with(';'))
                .unwrap_or_default()
        }
    }

    impl RequestCheck for Framing {
        fn check<T: Request + FromBytes>(&mut self, c_name: &str) {
            let first = self.first_member(c_name).to_string();
            let begins_with_response = first.split_whitespace().last() == Some("response;");
            assert_eq!(
                begins_with_response,
                T::RESPONSE,
                "{c_name} begins with `{first}`: RESPONSE must say whether that is the response pointer"
            );
            // Framed into a pipe: what the kernel would read.
            let size = size_of::<T>();
            let pattern: Vec<u8> = (0..size).map(|i| 0xa0 ^ i as u8).collect();
            let req = T::read_from_bytes(&pattern).unwrap();
            let (rx, tx) = nix::unistd::pipe().unwrap();
            let driver_in = [1u8, 2, 3, 4, 5, 6, 7, 8];
            let mut driver_out = [0x77u8; 16];
            // SAFETY: the request holds the test's pattern, no address the pipe would follow.
            let sent = unsafe {
                if T::RESPONSE {
                    execute::<T, [u8; 8]>(tx.as_fd(), "test", 77, &req, &driver_in, &mut driver_out).map(drop)
                } else {
                    execute::<T, ()>(tx.as_fd(), "test", 77, &req, &driver_in, &mut driver_out)
                }
            };
            sent.unwrap_or_else(|e| panic!("{c_name}: {e}"));
            let mut got = [0u8; MAX_CMD];
            let n = nix::unistd::read(rx.as_raw_fd(), &mut got).unwrap();
            let got = &got[..n];
            assert_eq!(n, 8 + size + driver_in.len(), "{c_name}: the command's length");
            let hdr = CmdHdr::read_from_bytes(&got[..8]).unwrap();
            let out_words = if T::RESPONSE { (8 + 16) / 4 } else { 0 };
            assert_eq!(
                (hdr.command, usize::from(hdr.in_words), hdr.out_words),
                (77, n / 4, out_words),
                "{c_name}: the header"
            );
            let body = &got[8..8 + size];
            if T::RESPONSE {
                assert_ne!(&body[..8], &pattern[..8], "{c_name}: the response pointer");
                assert_eq!(&body[8..], &pattern[8..], "{c_name}: the request past the pointer");
            } else {
                assert_eq!(body, &pattern[..], "{c_name}: every byte as built");
                assert_eq!(driver_out, [0x77; 16], "{c_name}: no driver response");
            }
            assert_eq!(&got[8 + size..], &driver_in, "{c_name}: the driver's request");
            self.checked.push(c_name.to_string());
        }
    }

    /// Every framed command's request reaches the kernel as the caller built it: the
    /// response pointer only over a `response` field (the header's layouts decide), and no
    /// response words for a command that has none. MODIFY_QP with a driver response once had
    /// its destination GID's first 8 bytes replaced by a stack address.
    #[test]
    #[cfg_attr(miri, ignore)] // pipe(2)
    fn every_request_frames_as_built() {
        let header = std::fs::read_to_string("/usr/include/rdma/ib_user_verbs.h")
            .expect("rdma/ib_user_verbs.h (linux-libc-dev)");
        let mut framing = Framing {
            header,
            checked: Vec::new(),
        };
        super::super::abi::each_request(&mut framing);
        assert_eq!(framing.checked.len(), 13, "{:?}", framing.checked);
    }

    /// The send doorbell is an empty POST_SEND on the QP's handle, its response pointer
    /// naming the doorbell's own word; a post that wrote nothing does not ring, and a refused
    /// request is reported whatever the doorbell said.
    #[test]
    #[cfg_attr(miri, ignore)] // pipe(2)
    fn send_doorbell_is_an_empty_post_send() {
        let (rx, tx) = nix::unistd::pipe().unwrap();
        let mut bell = SendDoorbell::new(0x1234_5678);
        bell.ring(tx.as_fd()).unwrap();
        let mut got = [0u8; 64];
        let n = nix::unistd::read(rx.as_raw_fd(), &mut got).unwrap();
        assert_eq!(n, size_of::<SendDoorbellCmd>());
        let hdr = CmdHdr::read_from_bytes(&got[..size_of::<CmdHdr>()]).unwrap();
        assert_eq!(
            (hdr.command, hdr.in_words, hdr.out_words),
            (cmd::POST_SEND, (n / 4) as u16, 1)
        );
        let body = PostSend::read_from_bytes(&got[size_of::<CmdHdr>()..n]).unwrap();
        assert_eq!(body.response, std::ptr::addr_of!(bell.resp) as u64);
        assert_eq!(
            (body.qp_handle, body.wr_count, body.sge_count, body.wqe_size),
            (0x1234_5678, 0, 0, SEND_WR_SIZE)
        );

        // Nothing written: no ring, even with a refusal to report.
        let refused = Some((0, WrReject::OpcodeNotSupported));
        let err = bell.finish_post(tx.as_fd(), false, refused.clone()).unwrap_err();
        assert!(
            matches!(
                err,
                Error::WorkRequest {
                    verb: "post_send",
                    index: 0,
                    reason: WrReject::OpcodeNotSupported
                }
            ),
            "{err}"
        );
        bell.finish_post(tx.as_fd(), false, None).unwrap();
        // Written: rung (the doorbell's error when nothing was refused, the refusal otherwise).
        let bad = rx.as_fd(); // a pipe's read end refuses writes
        assert!(matches!(
            bell.finish_post(bad, true, None),
            Err(Error::Kernel { verb: "POST_SEND", .. })
        ));
        let err = bell
            .finish_post(bad, true, Some((2, WrReject::OpcodeNotSupported)))
            .unwrap_err();
        assert!(matches!(err, Error::WorkRequest { index: 2, .. }), "{err}");
        bell.finish_post(tx.as_fd(), true, None).unwrap();
        let n = nix::unistd::read(rx.as_raw_fd(), &mut got).unwrap();
        assert_eq!(n, size_of::<SendDoorbellCmd>(), "one ring, the last post's");
    }
}

#[cfg(test)]
crate::sys::layout_check::kernel_layouts! {
    headers: ["rdma/ib_user_verbs.h"],
    structs: {
        // A `write()` command: the header, then the body.
        SendDoorbellCmd sized("sizeof(struct ib_uverbs_cmd_hdr) + sizeof(struct ib_uverbs_post_send)") {
            hdr @ "0",
            body @ "sizeof(struct ib_uverbs_cmd_hdr)",
        },
    },
}
