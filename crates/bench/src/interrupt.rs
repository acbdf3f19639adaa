//! Ctrl-C during a run: the first SIGINT asks the run to stop so that it can
//! clean up what it created (a second one kills as usual, SA_RESETHAND).

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether Ctrl-C was pressed since the guard was installed.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Catches SIGINT while alive; restores the previous handler when dropped.
pub struct Guard {
    old: Option<libc::sigaction>,
}

impl Guard {
    pub fn install() -> Self {
        REQUESTED.store(false, Ordering::SeqCst);
        // SAFETY: sigaction with a handler that only stores to an atomic.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigint as *const () as libc::sighandler_t;
            new.sa_flags = libc::SA_RESETHAND;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGINT, &new, &mut old) == 0 {
                Self { old: Some(old) }
            } else {
                Self { old: None }
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(old) = self.old.take() {
            // SAFETY: restores the disposition saved by install().
            unsafe {
                libc::sigaction(libc::SIGINT, &old, std::ptr::null_mut());
            }
        }
    }
}
