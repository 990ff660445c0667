//! The framing of a `write()` command: header, in and out words, unknown and unmodelled
//! commands, and commands before GET_CONTEXT.

use super::*;

#[test]
fn a_write_shorter_than_the_header_is_einval() {
    let env = Env::new(false);
    env.mem.write(CMD, &[0; 8]).unwrap();
    assert_eq!(
        env.model.lock().unwrap().write(CTX, CMD, 7, &env.mem, &env.host),
        Err(EINVAL)
    );
}

#[test]
fn in_words_must_cover_the_whole_write() {
    let env = Env::new(false);
    let hdr = abi::CmdHdr {
        command: cmd::ALLOC_PD,
        in_words: 5,
        out_words: 2,
    };
    let mut b = hdr.as_bytes().to_vec();
    b.extend_from_slice(&RESP.to_ne_bytes());
    env.mem.write(CMD, &b).unwrap();
    assert_eq!(
        env.model.lock().unwrap().write(CTX, CMD, b.len(), &env.mem, &env.host),
        Err(EINVAL)
    );
}

#[test]
fn a_request_shorter_than_the_command_is_enospc() {
    let env = Env::new(false);
    assert_eq!(env.write(cmd::REG_MR, &[0; 16], &[], 3), Err(ENOSPC));
}

#[test]
fn out_words_short_of_the_core_response_is_enospc() {
    let env = Env::new(false);
    assert_eq!(env.write(cmd::QUERY_DEVICE, &RESP.to_ne_bytes(), &[], 43), Err(ENOSPC));
}

#[test]
fn unknown_command_bits_are_einval_and_unmodelled_commands_eopnotsupp() {
    let env = Env::new(false);
    assert_eq!(
        env.write(0x100 | cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 2),
        Err(EINVAL)
    );
    // POST_SEND (28) is not enabled on mlx5; REQ_NOTIFY_CQ (23) neither.
    assert_eq!(env.write(28, &[0; 24], &[], 1), Err(EOPNOTSUPP));
    assert_eq!(env.write(23, &[0; 8], &[], 0), Err(EOPNOTSUPP));
    // Their in_words is checked first (sizes 0: core/uverbs_main.c:535), inside the table
    // only: command 41 lies beyond it.
    for (command, expected) in [(28, EINVAL), (23, EINVAL), (41, EOPNOTSUPP)] {
        let hdr = abi::CmdHdr {
            command,
            in_words: 5,
            out_words: 0,
        };
        env.mem.write(CMD, hdr.as_bytes()).unwrap();
        let got = env.model.lock().unwrap().write(CTX, CMD, 8, &env.mem, &env.host);
        assert_eq!(got, Err(expected), "command {command}");
    }
}

#[test]
fn commands_before_get_context_are_einval() {
    let env = Env::bare();
    assert_eq!(env.write(cmd::ALLOC_PD, &RESP.to_ne_bytes(), &[], 2), Err(EINVAL));
}

/// Commands that only look a handle up ask for no ucontext: the lookup's ENOENT.
#[test]
fn lookups_before_get_context_are_enoent() {
    let env = Env::bare();
    assert_eq!(env.write(cmd::DEALLOC_PD, &[0; 4], &[], 0), Err(ENOENT));
    assert_eq!(env.write(cmd::DEREG_MR, &[0; 4], &[], 0), Err(ENOENT));
    assert_eq!(
        env.write(cmd::DESTROY_QP, &RESP.to_ne_bytes().repeat(2), &[], 1),
        Err(ENOENT)
    );
    assert_eq!(
        env.write(cmd::DESTROY_CQ, &RESP.to_ne_bytes().repeat(2), &[], 2),
        Err(ENOENT)
    );
    assert_eq!(
        env.write(cmd::QUERY_QP, &RESP.to_ne_bytes().repeat(2), &[], 32),
        Err(ENOENT)
    );
}
