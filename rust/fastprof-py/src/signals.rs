//! A signal made harmless at the C level for the rest of the process.
//!
//! fastprof's trigger signal (SIGUSR2 by default) kills a process whose
//! disposition is the default. Once a Profiler stops, a trigger sent late
//! (`kill -USR2` while the job finishes) must still do nothing: a Python
//! handler is not enough, because the interpreter puts the default back
//! early in its finalization (`_PySignal_Fini`) and a signal landing in the
//! rest of the teardown kills the job. A no-op handler installed here
//! stays through finalization; a handler (unlike SIG_IGN) is reset to the
//! default by `exec`, so programs the job starts are not affected.

use pyo3::prelude::*;

extern "C" fn ignore(_signum: libc::c_int) {}

/// Install the no-op handler for `signum`. False when the kernel refused
/// (an invalid or uncatchable signal).
#[pyfunction]
pub fn _signal_harmless(signum: i32) -> bool {
    // SAFETY: a zeroed sigaction is a valid value; the handler is an
    // async-signal-safe function that touches nothing; sigemptyset and
    // sigaction have no other preconditions.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = ignore as extern "C" fn(libc::c_int) as libc::sighandler_t;
        act.sa_flags = libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(signum, &act, std::ptr::null_mut()) == 0
    }
}
