//! Taking the GIL from threads Python did not start, and a thread that runs
//! small jobs needing it (releasing Python buffers, resolving futures) on
//! behalf of the I/O threads, which must never wait for the GIL themselves:
//! a Python thread may hold it for milliseconds.
//!
//! At interpreter exit, CPython ends any thread that tries to take the GIL
//! once finalization has begun, by unwinding it with `pthread_exit`, which a
//! Rust thread cannot survive (the process aborts). So [`attach`] refuses
//! once `atexit` has run [`at_exit`], which first waits (briefly) for the
//! calls already in Python to return.

use std::cell::RefCell;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use pyo3::marker::Ungil;
use pyo3::prelude::*;

use crate::thread_state;

/// How long interpreter exit waits for callbacks still running.
const EXIT_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Gate {
    /// Threads between a successful `attach` check and the end of their call.
    inside: usize,
    /// Set at exit: nobody may take the GIL from a Rust thread any more.
    closed: bool,
}

fn gate() -> &'static (Mutex<Gate>, Condvar) {
    static GATE: OnceLock<(Mutex<Gate>, Condvar)> = OnceLock::new();
    GATE.get_or_init(Default::default)
}

/// Runs `f` with the GIL from a thread Python did not start; `None` once
/// the interpreter is exiting. The thread keeps the thread state it takes
/// the GIL with (see [`thread_state`]).
pub fn attach<R>(f: impl FnOnce(Python<'_>) -> R) -> Option<R> {
    entered(|| {
        let keep = thread_state::wanted();
        Python::try_attach(|py| {
            if keep {
                thread_state::keep(py);
            }
            f(py)
        })
    })
    .flatten()
}

/// Runs `f`, which takes the GIL, unless the interpreter is exiting: then
/// `None`. [`at_exit`] waits for the `f`s already running.
pub fn entered<R>(f: impl FnOnce() -> R) -> Option<R> {
    {
        let mut g = gate().0.lock().unwrap_or_else(PoisonError::into_inner);
        if g.closed {
            return None;
        }
        g.inside += 1;
    }
    struct Leave<'a>(&'a (Mutex<Gate>, Condvar));
    impl Drop for Leave<'_> {
        fn drop(&mut self) {
            let mut g = self.0 .0.lock().unwrap_or_else(PoisonError::into_inner);
            g.inside -= 1;
            self.0 .1.notify_all();
        }
    }
    let _leave = Leave(gate());
    Some(f())
}

/// Registered with `atexit`: stops Rust threads from taking the GIL, after
/// waiting up to [`EXIT_GRACE`] for those inside Python to return.
#[pyfunction]
pub fn at_exit(py: Python<'_>) {
    py.detach(|| {
        let (lock, cvar) = gate();
        let mut g = lock.lock().unwrap_or_else(PoisonError::into_inner);
        g.closed = true;
        let _ = cvar
            .wait_timeout_while(g, EXIT_GRACE, |g| g.inside > 0)
            .map(drop);
    });
}

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
                    let attached = attach(|py| {
                        job(py);
                        while let Ok(next) = rx.try_recv() {
                            next(py);
                        }
                    });
                    if attached.is_none() {
                        // The interpreter is exiting: nothing left to release.
                        return;
                    }
                }
            });
        Mutex::new(started.ok().map(|_| tx))
    })
}

thread_local! {
    /// Jobs posted by a Python thread while it runs [`detach_collecting`]:
    /// it runs them itself once it holds the GIL again.
    static COLLECTED: RefCell<Option<Vec<Job>>> = const { RefCell::new(None) };
}

/// Runs `f` with the GIL released, like `py.detach`, and then, GIL held
/// again, the jobs `f` posted on this thread (releasing the buffers of a
/// frame it wrote, resolving a `put`'s future): a Python thread that will
/// take the GIL anyway saves the GIL thread's wake-up and the hand-over of
/// the GIL to it and back, for every large object.
pub fn detach_collecting<T: Ungil>(py: Python<'_>, f: impl Ungil + FnOnce() -> T) -> T {
    let outer = COLLECTED.with(|c| {
        let mut c = c.borrow_mut();
        let outer = c.is_some();
        if !outer {
            *c = Some(Vec::new());
        }
        outer
    });
    if outer {
        return py.detach(f);
    }
    let _stop = StopCollecting;
    let out = py.detach(f);
    // Jobs may post more jobs (a released buffer resolves its future): run
    // them until none is left.
    loop {
        let jobs = COLLECTED.with(|c| c.borrow_mut().as_mut().map(std::mem::take));
        match jobs {
            Some(jobs) if !jobs.is_empty() => jobs.into_iter().for_each(|job| job(py)),
            _ => break,
        }
    }
    out
}

/// Ends collecting on this thread however [`detach_collecting`] ends; after
/// a panic, the jobs collected and not run go to the GIL thread.
struct StopCollecting;

impl Drop for StopCollecting {
    fn drop(&mut self) {
        let left = COLLECTED
            .with(|c| c.borrow_mut().take())
            .unwrap_or_default();
        left.into_iter().for_each(to_gil_thread);
    }
}

/// Runs `job` with the GIL on the GIL thread, soon (or on this thread, when
/// it is inside [`detach_collecting`]). Dropped unrun if the thread could
/// not start or the interpreter is exiting.
pub fn post(job: impl FnOnce(Python<'_>) + Send + 'static) {
    let job: Job = Box::new(job);
    let job = COLLECTED.with(|c| match c.borrow_mut().as_mut() {
        Some(jobs) => {
            jobs.push(job);
            None
        }
        None => Some(job),
    });
    if let Some(job) = job {
        to_gil_thread(job);
    }
}

fn to_gil_thread(job: Job) {
    let guard = sender().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(tx) = guard.as_ref() {
        let _ = tx.send(job);
    }
}
