//! SIGTERM on a rank blocked in C (issue #37): a native hook under the interpreter's own
//! SIGTERM handler, so that the hang watchdog hears of the signal even when Python cannot run
//! its handler.
//!
//! Python runs a signal handler on the main thread only between two bytecodes: a rank whose
//! main thread waits in a collective's C call (gloo's `wait`, which releases the GIL) never
//! gets there, and fastprof's Python SIGTERM handler, which writes the hang evidence, never
//! runs. The hook installed here (over the C function the interpreter installed, which it then
//! calls) only marks the signal in an atomic: async-signal-safe, and the interpreter's own
//! handling (its pending flag, its wakeup fd) goes on as before. The watchdog thread reads the
//! mark at its next poll ([`pending_since_poll`]); when Python's handler did not take the
//! signal ([`take_python`]) within the grace, the watchdog takes it ([`take_watchdog`]) and
//! asks for the evidence.
//!
//! The hook stays in place only while nobody else sets the disposition: Python's
//! `signal.signal` calls `sigaction` every time, so any later handler (the job's, fastprof's
//! giving the job's back) replaces the hook, and the job's signal then behaves as it did.

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Mutex;

/// No SIGTERM since the watchdog started / one came, not taken / Python's handler took it /
/// the watchdog took it.
const NONE: u8 = 0;
const PENDING: u8 = 1;
const PYTHON: u8 = 2;
const WATCHDOG: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(NONE);
/// The hook is installed by [`install`] (and not yet taken out by [`uninstall`]).
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// [`PREVIOUS`] holds a handler the hook calls: set once written, and left set by
/// [`uninstall`] (a C handler installed over the hook that chains to it still reaches the
/// interpreter's); cleared only while [`install`] writes it again.
static CHAIN: AtomicBool = AtomicBool::new(false);
/// Install and uninstall, one at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// The disposition the hook replaced (the interpreter's C handler), written under [`LOCK`]
/// only while the hook is not installed and [`CHAIN`] is false, read by the hook only while
/// [`CHAIN`] is true.
struct Previous(UnsafeCell<MaybeUninit<libc::sigaction>>);
// SAFETY: see the type's docs: writes happen while CHAIN is false (the hook does not read),
// before the hook is installed again (sigaction is a full barrier for the signal's delivery).
unsafe impl Sync for Previous {}
static PREVIOUS: Previous = Previous(UnsafeCell::new(MaybeUninit::uninit()));

extern "C" fn hook(signum: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Only an atomic compare-and-swap: async-signal-safe, errno untouched.
    let _ = STATE.compare_exchange(NONE, PENDING, Ordering::SeqCst, Ordering::SeqCst);
    if !CHAIN.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: CHAIN says PREVIOUS holds the disposition read when the hook last went in.
    let prev = unsafe { (*PREVIOUS.0.get()).assume_init_ref() };
    let h = prev.sa_sigaction;
    if h == libc::SIG_DFL || h == libc::SIG_IGN {
        return; // never installed over those (see `install`)
    }
    // SAFETY: a handler address the kernel held for this signal, called the way its flags say.
    unsafe {
        if prev.sa_flags & libc::SA_SIGINFO != 0 {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(h);
            f(signum, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = std::mem::transmute(h);
            f(signum);
        }
    }
}

fn hook_address() -> libc::sighandler_t {
    hook as extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void)
        as libc::sighandler_t
}

/// Put the hook over SIGTERM's handler. False (nothing done) when the disposition is the
/// default or ignored (no handler to call on: the default ends the process at once, as it
/// would without fastprof), or the hook is already there.
pub fn install() -> bool {
    let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: sigaction reads into a zeroed struct; PREVIOUS is written while the hook is not
    // installed (INSTALLED false, or the current handler is not the hook).
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut cur) != 0 {
            return false;
        }
        let h = cur.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN || h == hook_address() {
            return false;
        }
        CHAIN.store(false, Ordering::SeqCst);
        (*PREVIOUS.0.get()).write(cur);
        CHAIN.store(true, Ordering::SeqCst);
        INSTALLED.store(true, Ordering::SeqCst);
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = hook_address();
        act.sa_mask = cur.sa_mask;
        act.sa_flags = (cur.sa_flags | libc::SA_SIGINFO) & !libc::SA_RESETHAND;
        if libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut()) != 0 {
            INSTALLED.store(false, Ordering::SeqCst);
            return false;
        }
    }
    STATE.store(NONE, Ordering::SeqCst);
    true
}

/// Take the hook out if it is still SIGTERM's handler (the one it replaced goes back); a
/// handler set since then is left alone.
pub fn uninstall() {
    let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if !INSTALLED.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: as in `install`; PREVIOUS is read, not written, while INSTALLED.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut cur) == 0
            && cur.sa_sigaction == hook_address()
        {
            let prev = (*PREVIOUS.0.get()).assume_init_ref();
            libc::sigaction(libc::SIGTERM, prev, std::ptr::null_mut());
        }
    }
    // The hook may still run (a signal in flight, a C handler installed over it that chains to
    // it): it then marks and calls the handler it replaced, as before (CHAIN stays set).
    INSTALLED.store(false, Ordering::SeqCst);
}

/// Whether the hook is SIGTERM's handler now.
pub fn installed() -> bool {
    if !INSTALLED.load(Ordering::SeqCst) {
        return false;
    }
    // SAFETY: reading the disposition into a zeroed struct.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut cur) == 0
            && cur.sa_sigaction == hook_address()
    }
}

/// A SIGTERM came that nobody took yet.
pub fn pending() -> bool {
    STATE.load(Ordering::SeqCst) == PENDING
}

/// Python's SIGTERM handler runs: it takes the signal (true), unless the watchdog already did
/// (false: the evidence is written, and is not written twice).
pub fn take_python() -> bool {
    match STATE.compare_exchange(PENDING, PYTHON, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => true,
        Err(s) => s != WATCHDOG,
    }
}

/// The watchdog takes a pending SIGTERM (false: none pending, or Python's handler took it).
pub fn take_watchdog() -> bool {
    STATE
        .compare_exchange(PENDING, WATCHDOG, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// A new watchdog: no SIGTERM seen yet.
pub fn reset() {
    STATE.store(NONE, Ordering::SeqCst);
}

/// End the process by SIGTERM's default action, as the job would have ended without fastprof
/// (its disposition under fastprof's handler was the default).
pub fn die_by_sigterm() -> ! {
    // SAFETY: the default disposition put back, the signal unblocked on this thread and sent
    // to this thread; `_exit` in case it does not end the process (it always does).
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut());
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(libc::SIGTERM);
        libc::_exit(128 + libc::SIGTERM)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static CALLED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    extern "C" fn under(_s: libc::c_int) {
        CALLED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn the_hook_marks_calls_the_handler_under_it_and_goes_away() {
        // SAFETY: a plain handler for SIGTERM in this test process, then the signal raised
        // on this thread (handled synchronously, before raise returns).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = under as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut act.sa_mask);
            assert_eq!(
                libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut()),
                0
            );
            assert!(install());
            assert!(installed());
            assert!(!install(), "installed twice");
            assert!(!pending());
            libc::raise(libc::SIGTERM);
            assert_eq!(CALLED.load(Ordering::SeqCst), 1);
            assert!(pending());
            assert!(take_watchdog());
            assert!(!take_python(), "the watchdog took it");
            uninstall();
            assert!(!installed());
            let mut cur: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut cur);
            assert_eq!(
                cur.sa_sigaction,
                under as extern "C" fn(libc::c_int) as libc::sighandler_t
            );
            reset();
            libc::raise(libc::SIGTERM);
            assert_eq!(CALLED.load(Ordering::SeqCst), 2);
            assert!(!pending(), "the hook is out");
            // A C handler put over the hook that chains to it still reaches the one under it.
            hook(libc::SIGTERM, std::ptr::null_mut(), std::ptr::null_mut());
            assert_eq!(CALLED.load(Ordering::SeqCst), 3);
            reset();
            act.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGTERM, &act, std::ptr::null_mut());
            assert!(!install(), "never over the default");
        }
    }
}
