//! JSON between Python values and payloads, through Python's own `json`
//! module (exact integers, the usual float and string rules).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

fn module(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    static JSON: PyOnceLock<Py<PyModule>> = PyOnceLock::new();
    JSON.get_or_try_init(py, || Ok(py.import("json")?.unbind()))
        .map(|m| m.bind(py))
}

/// `value` as compact JSON; raises for values JSON cannot carry.
pub fn dumps(value: &Bound<'_, PyAny>) -> PyResult<String> {
    let py = value.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("separators", (",", ":"))?;
    kwargs.set_item("ensure_ascii", false)?;
    kwargs.set_item("allow_nan", false)?;
    module(py)?
        .call_method("dumps", (value,), Some(&kwargs))?
        .extract()
}

/// The Python value of a JSON document.
pub fn loads<'py>(py: Python<'py>, text: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    let text = std::str::from_utf8(text).map_err(|e| {
        crate::errors::SerializationError::new_err(format!("payload is not UTF-8: {e}"))
    })?;
    module(py)?.call_method1("loads", (text,))
}

/// Any serializable value (a status body) as a Python value.
pub fn to_py<'py, T: serde::Serialize>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(value)
        .map_err(|e| crate::errors::Error::new_err(format!("cannot render a status: {e}")))?;
    loads(py, text.as_bytes())
}
