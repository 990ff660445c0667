//! Framed `write()` commands: `ib_uverbs_cmd_hdr | core request | driver request`, with the
//! response (core then driver bytes) written by the kernel through a user pointer.

use super::abi::{cmd, CmdHdr, CreateCompChannel, CreateCompChannelResp};
use crate::error::{Error, Result, Verb};
use nix::errno::Errno;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Largest command this crate frames, header and driver data included.
const MAX_CMD: usize = 256;
/// Largest response (core + driver) this crate accepts.
const MAX_RESP: usize = 512;

/// Sends one non-extended command and returns the response bytes it asked for.
///
/// `req` is the core request. When `Resp` is not zero-sized the request must begin with the
/// ABI's `response` user pointer (every uverbs command that answers does); this fills it in.
/// `driver_in` follows the core request; `driver_out` receives the driver's part of the
/// response.
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
    Req: IntoBytes + Immutable,
    Resp: FromBytes + IntoBytes,
{
    let core_resp_len = size_of::<Resp>();
    let resp_len = core_resp_len + driver_out.len();
    let cmd_len = size_of::<CmdHdr>() + size_of::<Req>() + driver_in.len();
    if cmd_len > MAX_CMD || resp_len > MAX_RESP || cmd_len % 4 != 0 || resp_len % 4 != 0 {
        return Err(Error::invalid(
            verb,
            "command or response does not fit the ABI's framing",
        ));
    }
    // 8-byte aligned so the kernel's response lands on aligned fields.
    let mut resp = [0u64; MAX_RESP / 8];
    let resp_bytes = &mut resp.as_mut_bytes()[..resp_len];

    let mut buf = [0u8; MAX_CMD];
    let hdr = CmdHdr {
        command,
        in_words: (cmd_len / 4) as u16,
        out_words: (resp_len / 4) as u16,
    };
    let mut at = 0;
    for part in [hdr.as_bytes(), req.as_bytes(), driver_in] {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    if resp_len > 0 {
        let ptr = resp_bytes.as_mut_ptr() as u64;
        buf[8..16].copy_from_slice(&ptr.to_ne_bytes());
    }
    // SAFETY: the response pointer (if any) names `resp_bytes`, live and exactly the
    // `out_words` the header declares; other pointers are the caller's contract.
    unsafe { write_raw(fd, &buf[..cmd_len]) }.map_err(|e| Error::kernel(verb, e))?;

    let (core, drv) = resp_bytes.split_at(core_resp_len);
    driver_out.copy_from_slice(drv);
    Resp::read_from_bytes(core).map_err(|_| Error::malformed(verb, "short response"))
}

/// A core request whose only user address is the ABI's `response` field, which [`execute`]
/// fills in itself.
///
/// # Safety
/// Implementors hold no other user address the kernel would access.
pub unsafe trait PlainRequest: IntoBytes + Immutable {}

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
