//! Python buffers without copies, both ways.
//!
//! [`borrow`] turns any object supporting the buffer protocol (bytes,
//! bytearray, memoryview, numpy arrays, pickle buffers) into a [`Bytes`] that
//! points at the object's memory; [`export`] turns a received [`Bytes`] into
//! a read-only `memoryview` over the same memory.
//!
//! The buffer protocol joined the stable ABI in CPython 3.11, with the
//! layout and functions it has had since 3.3; the package is built for the
//! stable ABI of 3.9, so these few declarations are made here (PyO3 gates
//! its own on 3.11). With `thread_state`, one of the two modules with
//! `unsafe` code.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use bytes::Bytes;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use crate::gil_jobs;

/// `Py_buffer`, as laid out by CPython 3.3 and later.
#[repr(C)]
struct RawBuffer {
    buf: *mut c_void,
    obj: *mut ffi::PyObject,
    len: ffi::Py_ssize_t,
    itemsize: ffi::Py_ssize_t,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut ffi::Py_ssize_t,
    strides: *mut ffi::Py_ssize_t,
    suboffsets: *mut ffi::Py_ssize_t,
    internal: *mut c_void,
}

const PYBUF_SIMPLE: c_int = 0;

extern "C" {
    fn PyObject_GetBuffer(obj: *mut ffi::PyObject, view: *mut RawBuffer, flags: c_int) -> c_int;
    fn PyBuffer_Release(view: *mut RawBuffer);
    fn PyBuffer_FillInfo(
        view: *mut RawBuffer,
        obj: *mut ffi::PyObject,
        buf: *mut c_void,
        len: ffi::Py_ssize_t,
        readonly: c_int,
        flags: c_int,
    ) -> c_int;
}

/// A Python object's buffer, held until dropped; the owner of a [`Bytes`].
struct Held {
    view: Box<RawBuffer>,
    /// Kept until the buffer is released, so whoever waits on it (a queue
    /// `put`'s future) learns only then that the memory may be reused.
    _done: Option<Arc<dyn Send + Sync>>,
}

// SAFETY: the memory belongs to a Python object kept alive by the buffer
// (`view.obj` holds a reference) and is only read through it; the buffer is
// released with the GIL held (see `Drop`).
unsafe impl Send for Held {}
// SAFETY: shared access only reads the memory.
unsafe impl Sync for Held {}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if self.view.buf.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: a C-contiguous buffer of `len` bytes at `buf`, exported by
        // the object until `PyBuffer_Release`, which only `Drop` calls.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let view = SendView(std::mem::replace(&mut self.view, Box::new(empty_view())));
        let done = self._done.take();
        // Releasing needs the GIL, which an I/O thread must not wait for.
        gil_jobs::post(move |_py| {
            let mut view = view;
            // SAFETY: the view was filled by PyObject_GetBuffer and is released once.
            unsafe { PyBuffer_Release(&mut *view.0) };
            drop(done);
        });
    }
}

struct SendView(Box<RawBuffer>);
// SAFETY: only moved to the GIL thread, which releases it with the GIL held.
unsafe impl Send for SendView {}

fn empty_view() -> RawBuffer {
    RawBuffer {
        buf: std::ptr::null_mut(),
        obj: std::ptr::null_mut(),
        len: 0,
        itemsize: 0,
        readonly: 1,
        ndim: 0,
        format: std::ptr::null_mut(),
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        suboffsets: std::ptr::null_mut(),
        internal: std::ptr::null_mut(),
    }
}

/// The memory of `obj` (any C-contiguous buffer) as [`Bytes`], without a
/// copy. The object's buffer stays exported, and `done` alive, until the
/// last clone of the returned [`Bytes`] is dropped.
pub fn borrow(obj: &Bound<'_, PyAny>, done: Option<Arc<dyn Send + Sync>>) -> PyResult<Bytes> {
    let mut view = Box::new(empty_view());
    // SAFETY: `obj` is a live object and the GIL is held; `view` is a valid
    // Py_buffer to fill.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut *view, PYBUF_SIMPLE) };
    if rc != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(Bytes::from_owner(Held { view, _done: done }))
}

/// A buffer held while the GIL is: released as soon as it is dropped.
struct Scoped<'py> {
    view: RawBuffer,
    _gil: Python<'py>,
}

impl Scoped<'_> {
    fn bytes(&self) -> &[u8] {
        let len = usize::try_from(self.view.len).unwrap_or(0);
        if self.view.buf.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: as for `Held`: exported until released in `Drop`.
        unsafe { std::slice::from_raw_parts(self.view.buf.cast::<u8>(), len) }
    }
}

impl Drop for Scoped<'_> {
    fn drop(&mut self) {
        // SAFETY: filled by PyObject_GetBuffer; the GIL is held (`_gil`).
        unsafe { PyBuffer_Release(&mut self.view) };
    }
}

fn scoped<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Scoped<'py>> {
    let mut view = empty_view();
    // SAFETY: as in `borrow`.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut view, PYBUF_SIMPLE) };
    if rc != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(Scoped {
        view,
        _gil: obj.py(),
    })
}

/// The memory of `obj` copied into [`Bytes`]: for small payloads, where a
/// copy is cheaper than holding the buffer.
pub fn copy(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    Ok(Bytes::copy_from_slice(scoped(obj)?.bytes()))
}

/// The size in bytes of `obj`'s buffer.
pub fn len(obj: &Bound<'_, PyAny>) -> PyResult<usize> {
    Ok(scoped(obj)?.bytes().len())
}

/// The instance layout of `tubeway._Payload`.
#[repr(C)]
struct PayloadObject {
    ob_base: ffi::PyObject,
    data: *mut Bytes,
}

unsafe extern "C" fn payload_getbuffer(
    obj: *mut ffi::PyObject,
    view: *mut RawBuffer,
    flags: c_int,
) -> c_int {
    // SAFETY: called by CPython on an instance of our type, whose `data` was
    // set at creation and lives until dealloc; the view holds a reference to
    // `obj` (set by PyBuffer_FillInfo), so the bytes outlive every export.
    unsafe {
        let data = &*(*obj.cast::<PayloadObject>()).data;
        PyBuffer_FillInfo(
            view,
            obj,
            data.as_ptr().cast_mut().cast(),
            data.len() as ffi::Py_ssize_t,
            1,
            flags,
        )
    }
}

unsafe extern "C" fn payload_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: the last reference is gone, so no export remains; `data` came
    // from Box::into_raw and is freed once. Heap types own a type reference.
    unsafe {
        let this = obj.cast::<PayloadObject>();
        if !(*this).data.is_null() {
            drop(Box::from_raw((*this).data));
        }
        let tp = ffi::Py_TYPE(obj);
        let free = ffi::PyType_GetSlot(tp, ffi::Py_tp_free);
        if !free.is_null() {
            let free: ffi::freefunc = std::mem::transmute(free);
            free(obj.cast());
        }
        ffi::Py_DECREF(tp.cast());
    }
}

fn payload_type(py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
    static TYPE: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    TYPE.get_or_try_init(py, || {
        let slots = Box::leak(Box::new([
            ffi::PyType_Slot {
                slot: ffi::Py_bf_getbuffer,
                pfunc: payload_getbuffer as *mut c_void,
            },
            ffi::PyType_Slot {
                slot: ffi::Py_tp_dealloc,
                pfunc: payload_dealloc as *mut c_void,
            },
            ffi::PyType_Slot {
                slot: ffi::Py_tp_doc,
                pfunc: c"A received payload, exposed as a read-only buffer.".as_ptr()
                    as *mut c_void,
            },
            ffi::PyType_Slot {
                slot: 0,
                pfunc: std::ptr::null_mut(),
            },
        ]));
        let spec = Box::leak(Box::new(ffi::PyType_Spec {
            name: c"tubeway._Payload".as_ptr(),
            basicsize: std::mem::size_of::<PayloadObject>() as c_int,
            itemsize: 0,
            flags: ffi::Py_TPFLAGS_DEFAULT as _,
            slots: slots.as_mut_ptr(),
        }));
        // SAFETY: a valid spec whose strings and slots live forever.
        unsafe {
            let tp = ffi::PyType_FromSpec(spec);
            Bound::from_owned_ptr_or_err(py, tp).and_then(|t| Ok(t.cast_into::<PyType>()?.unbind()))
        }
    })
    .map(|t| t.bind(py))
}

/// A read-only `memoryview` over `data`, which lives as long as any view of it.
pub fn export<'py>(py: Python<'py>, data: Bytes) -> PyResult<Bound<'py, PyAny>> {
    let tp = payload_type(py)?;
    // SAFETY: allocating an instance of our heap type; on success its `data`
    // is set before anything else can see the object.
    let payload = unsafe {
        let obj = ffi::PyType_GenericAlloc(tp.as_ptr().cast(), 0);
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        (*obj.cast::<PayloadObject>()).data = Box::into_raw(Box::new(data));
        Bound::from_owned_ptr(py, obj)
    };
    // SAFETY: `payload` supports the buffer protocol; the result is a new reference.
    unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyMemoryView_FromObject(payload.as_ptr())) }
}
