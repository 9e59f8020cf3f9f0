//! A thread that runs small jobs needing the GIL (releasing Python buffers,
//! resolving futures) on behalf of the I/O threads, which must never wait
//! for the GIL themselves: a Python thread may hold it for milliseconds.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock, PoisonError};

use pyo3::prelude::*;

/// A job for the GIL thread.
pub type Job = Box<dyn FnOnce(Python<'_>) + Send>;

fn sender() -> &'static Mutex<Option<Sender<Job>>> {
    static SENDER: OnceLock<Mutex<Option<Sender<Job>>>> = OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        let started = std::thread::Builder::new()
            .name("tubeway-py-gil".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    // Take every job already queued under one acquisition.
                    let attached = Python::try_attach(|py| {
                        job(py);
                        while let Ok(next) = rx.try_recv() {
                            next(py);
                        }
                    });
                    if attached.is_none() {
                        // The interpreter is finalizing: nothing left to release.
                        return;
                    }
                }
            });
        Mutex::new(started.ok().map(|_| tx))
    })
}

/// Runs `job` with the GIL on the GIL thread, soon. Dropped unrun if the
/// thread could not start or the interpreter is finalizing.
pub fn post(job: impl FnOnce(Python<'_>) + Send + 'static) {
    let guard = sender().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(tx) = guard.as_ref() {
        let _ = tx.send(Box::new(job));
    }
}
