//! A Python thread state kept for the life of each thread Python did not
//! start that takes the GIL: the blocking pool's threads that run function
//! handlers, the callback threads of subscriptions, the GIL thread.
//!
//! Taking the GIL on such a thread makes a thread state, and releasing it
//! ends that state again, every time. Kept, each later acquisition only
//! takes the GIL, and a handler's per-thread data (`threading.local`) lasts
//! from one call to the next as it does on a Python thread. The state ends
//! when the thread exits, unless the interpreter is exiting by then
//! ([`gil_jobs::entered`] refuses), when it is left to the process's end.
//!
//! With `buffer`, one of the two modules with `unsafe` code.
#![allow(unsafe_code)]

use std::cell::RefCell;

use pyo3::ffi;
use pyo3::Python;

use crate::gil_jobs;

/// The `PyGILState_Ensure` that keeps this thread's state.
struct Kept(ffi::PyGILState_STATE);

impl Drop for Kept {
    fn drop(&mut self) {
        let _ = gil_jobs::entered(|| {
            // SAFETY: this thread's state, kept by `self.0`, is not current
            // (the GIL was released by the attach that made it); restoring
            // it takes the GIL, and the last release ends the state and
            // releases the GIL.
            unsafe {
                let state = ffi::PyGILState_GetThisThreadState();
                if !state.is_null() {
                    ffi::PyEval_RestoreThread(state);
                    ffi::PyGILState_Release(self.0);
                }
            }
        });
    }
}

thread_local! {
    static KEPT: RefCell<Option<Kept>> = const { RefCell::new(None) };
}

/// Whether the thread's next attach should keep its state: the thread has
/// no Python thread state (Python did not start it) and keeps none yet.
/// False while the thread's locals are being destroyed.
pub fn wanted() -> bool {
    let kept = KEPT.try_with(|k| k.borrow().is_some()).unwrap_or(true);
    // SAFETY: reads this thread's own slot; needs no GIL.
    !kept && unsafe { ffi::PyGILState_GetThisThreadState() }.is_null()
}

/// Keeps the thread state that this thread holds the GIL with until the
/// thread exits. Called once per thread, when [`wanted`] said so before the
/// GIL was taken.
pub fn keep(_py: Python<'_>) {
    // SAFETY: the GIL is held (the token says so), with this thread's
    // current state: this counts one more holder of that state, so it is
    // not ended when the attach that made it releases the GIL.
    let state = unsafe { ffi::PyGILState_Ensure() };
    let _ = KEPT.try_with(|k| *k.borrow_mut() = Some(Kept(state)));
}
