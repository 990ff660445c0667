//! `fork()`, `waitpid()` and `_exit()`: the only `unsafe` of this test (the fork step of
//! `verbs.rs` uses them).

pub fn fork() -> libc::pid_t {
    // SAFETY: the child only drops the objects it inherited (the library refuses every
    // verb in a child and its drops destroy nothing) and `_exit`s; glibc's malloc is
    // usable after fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    pid
}

/// The child's exit status, or the signal that killed it.
pub fn wait(pid: libc::pid_t) -> Result<i32, i32> {
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    if libc::WIFEXITED(status) {
        Ok(libc::WEXITSTATUS(status))
    } else {
        Err(libc::WTERMSIG(status))
    }
}

pub fn exit_child(code: i32) -> ! {
    // SAFETY: ends the child without running destructors, atexit handlers or the test
    // harness's remaining code.
    unsafe { libc::_exit(code) }
}
