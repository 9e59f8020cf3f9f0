//! `tubeway.Message`: the message model, read-only, with typed payload access.

use std::time::Duration;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use tubeway::{Message, PayloadKind};

use crate::{buffer, errors, json};

/// Payloads up to this size are copied when a message is built; larger ones
/// are borrowed from the Python object (kept exported until the message is
/// dropped), where a copy would cost more than holding the buffer.
pub const COPY_BELOW: usize = 64 * 1024;

/// A Tubeway message. Read-only; build one with `Message.plain_text`,
/// `Message.text`, `Message.binary` or `Message.data`.
#[pyclass(name = "Message", module = "tubeway", frozen)]
#[derive(Clone, Debug)]
pub struct PyMessage {
    pub inner: Message,
}

impl PyMessage {
    /// Wraps a message.
    pub fn new(inner: Message) -> Self {
        PyMessage { inner }
    }
}

/// The options every constructor takes.
fn finish(
    mut msg: Message,
    request_id: Option<String>,
    subject: Option<String>,
    durable: bool,
    ttl: Option<f64>,
) -> PyResult<PyMessage> {
    msg.request_id = request_id;
    msg.subject = subject;
    msg.durable = durable;
    if let Some(ttl) = crate::runtime::seconds(ttl)? {
        msg = msg.with_ttl(ttl);
    }
    Ok(PyMessage::new(msg))
}

/// Any buffer as a payload: copied when small, borrowed when large.
pub fn payload_of(data: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    if let Ok(b) = data.cast::<PyBytes>() {
        if b.as_bytes().len() < COPY_BELOW {
            return Ok(Bytes::copy_from_slice(b.as_bytes()));
        }
    }
    if buffer::len(data)? < COPY_BELOW {
        return buffer::copy(data);
    }
    buffer::borrow(data, None)
}

fn ms_to_seconds(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

#[pymethods]
impl PyMessage {
    /// A message with a UTF-8 `text/plain` payload.
    #[staticmethod]
    #[pyo3(signature = (text, *, request_id=None, subject=None, durable=false, ttl=None))]
    fn _plain_text(
        text: String,
        request_id: Option<String>,
        subject: Option<String>,
        durable: bool,
        ttl: Option<f64>,
    ) -> PyResult<Self> {
        finish(Message::plain_text(text), request_id, subject, durable, ttl)
    }

    /// A message with a text payload of any mimetype and charset.
    #[staticmethod]
    #[pyo3(signature = (text, mimetype="text/plain", charset="utf-8", *, request_id=None, subject=None, durable=false, ttl=None))]
    #[allow(clippy::too_many_arguments)]
    fn _text(
        text: &Bound<'_, PyString>,
        mimetype: &str,
        charset: &str,
        request_id: Option<String>,
        subject: Option<String>,
        durable: bool,
        ttl: Option<f64>,
    ) -> PyResult<Self> {
        // Encoded in the charset named, so the receiver can decode it.
        let encoded = text.call_method1("encode", (charset,))?;
        let bytes = encoded.cast::<PyBytes>()?.as_bytes().to_vec();
        let mut msg = Message::request();
        msg.set_payload(Bytes::from(bytes), Some(mimetype), Some(charset));
        finish(msg, request_id, subject, durable, ttl)
    }

    /// A message with a binary payload: any object supporting the buffer
    /// protocol, borrowed without a copy when large.
    #[staticmethod]
    #[pyo3(signature = (data, mimetype=None, *, request_id=None, subject=None, durable=false, ttl=None))]
    fn _binary(
        data: &Bound<'_, PyAny>,
        mimetype: Option<&str>,
        request_id: Option<String>,
        subject: Option<String>,
        durable: bool,
        ttl: Option<f64>,
    ) -> PyResult<Self> {
        let msg = Message::binary(payload_of(data)?, mimetype);
        finish(msg, request_id, subject, durable, ttl)
    }

    /// A message with structured data (JSON-compatible values).
    #[staticmethod]
    #[pyo3(signature = (value, *, request_id=None, subject=None, durable=false, ttl=None))]
    fn _data(
        value: &Bound<'_, PyAny>,
        request_id: Option<String>,
        subject: Option<String>,
        durable: bool,
        ttl: Option<f64>,
    ) -> PyResult<Self> {
        let text = json::dumps(value)?;
        let mut msg = Message::request();
        msg.set_payload(
            Bytes::from(text.into_bytes()),
            Some(tubeway::MIME_JSON),
            None,
        );
        finish(msg, request_id, subject, durable, ttl)
    }

    /// The text payload, or `None` when the payload is not text.
    fn _text_payload(&self) -> PyResult<Option<String>> {
        match self.inner.payload_kind() {
            PayloadKind::Text => self
                .inner
                .text_payload()
                .map(|t| Some(t.into_owned()))
                .map_err(|e| errors::SerializationError::new_err(e.to_string())),
            _ => Ok(None),
        }
    }

    /// The structured payload decoded, or `None` when the payload is not data.
    fn _data_payload<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match self.inner.payload_kind() {
            PayloadKind::Data => json::loads(py, &self.inner.payload).map(Some),
            _ => Ok(None),
        }
    }

    /// The payload bytes, whatever their kind, as a read-only memoryview (no copy).
    #[getter]
    fn payload<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        buffer::export(py, self.inner.payload.clone())
    }

    /// How the payload is to be read: "empty", "text", "data" or "binary".
    #[getter]
    fn payload_kind(&self) -> &'static str {
        match self.inner.payload_kind() {
            PayloadKind::Empty => "empty",
            PayloadKind::Text => "text",
            PayloadKind::Data => "data",
            _ => "binary",
        }
    }

    /// Unique id (a UUID string).
    #[getter]
    fn id(&self) -> String {
        self.inner.id.to_string()
    }

    /// The message type ("request", "response", "publish", ...).
    #[getter]
    fn r#type(&self) -> &'static str {
        self.inner.r#type.as_str()
    }

    /// The sender wants no response.
    #[getter]
    fn oneway(&self) -> bool {
        self.inner.oneway
    }

    /// The message must survive a broker restart.
    #[getter]
    fn durable(&self) -> bool {
        self.inner.durable
    }

    /// The response status name on responses, else None.
    #[getter]
    fn response_status(&self) -> Option<&'static str> {
        self.inner.response_status.map(|s| s.as_str())
    }

    /// Creation time, milliseconds since the Unix epoch.
    #[getter]
    fn timestamp(&self) -> u64 {
        self.inner.timestamp
    }

    /// Expiry time (ms since the epoch), or None.
    #[getter]
    fn expires_at(&self) -> Option<u64> {
        self.inner.expires_at
    }

    /// How long the broker may wait for this message, in seconds, or None.
    #[getter]
    fn timeout(&self) -> Option<f64> {
        ms_to_seconds(self.inner.timeout)
    }

    /// The sender's own key, echoed in responses.
    #[getter]
    fn request_id(&self) -> Option<String> {
        self.inner.request_id.clone()
    }

    /// On a response: the id of the message answered; on a delivery: of the subscription.
    #[getter]
    fn correlation_id(&self) -> Option<String> {
        self.inner.correlation_id.map(|c| c.to_string())
    }

    /// Free-form subject.
    #[getter]
    fn subject(&self) -> Option<String> {
        self.inner.subject.clone()
    }

    /// The queue, topic or function the message is for.
    #[getter]
    fn destination(&self) -> Option<String> {
        self.inner.destination.clone()
    }

    /// A queue where an answer should be offered.
    #[getter]
    fn reply_to(&self) -> Option<String> {
        self.inner.reply_to.clone()
    }

    /// The payload's mimetype, as written; none for binary sent without one.
    #[getter]
    fn payload_mimetype(&self) -> Option<String> {
        self.inner.payload_mimetype.clone()
    }

    /// The payload's mimetype as a receiver reads it: the one written, else
    /// `application/octet-stream` for a non-empty payload.
    #[getter]
    fn mimetype(&self) -> Option<&str> {
        self.inner.mimetype()
    }

    /// The payload's charset (text payloads).
    #[getter]
    fn payload_charset(&self) -> Option<String> {
        self.inner.payload_charset.clone()
    }

    /// The message in its JSON form (docs/protocol.md, section 11).
    #[pyo3(signature = (pretty=false))]
    fn to_json(&self, pretty: bool) -> String {
        if pretty {
            self.inner.to_json_pretty()
        } else {
            self.inner.to_json()
        }
    }

    /// The JSON form as a dict.
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        json::loads(py, self.inner.to_json().as_bytes())
    }

    fn __len__(&self) -> usize {
        self.inner.payload.len()
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyMessage>()
            .is_ok_and(|o| o.get().inner == self.inner)
    }

    fn __hash__(&self) -> u64 {
        self.inner.id.as_u64_pair().0
    }

    fn __repr__(&self) -> String {
        format!(
            "Message(type={:?}, id={:?}, destination={:?}, status={:?}, payload={} bytes {})",
            self.inner.r#type.as_str(),
            self.inner.id.to_string(),
            self.inner.destination,
            self.inner.response_status.map(|s| s.as_str()),
            self.inner.payload.len(),
            self.inner.payload_mimetype.as_deref().unwrap_or("-"),
        )
    }
}

/// A message argument: a `Message`, or a plain value made into one (str →
/// text, bytes-like → binary, anything else → data).
pub fn to_message(value: &Bound<'_, PyAny>) -> PyResult<Message> {
    if let Ok(m) = value.cast::<PyMessage>() {
        return Ok(m.get().inner.clone());
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(Message::plain_text(s.extract::<String>()?));
    }
    if let Ok(payload) = payload_of(value) {
        return Ok(Message::binary(payload, None));
    }
    let text = json::dumps(value)?;
    let mut msg = Message::request();
    msg.set_payload(
        Bytes::from(text.into_bytes()),
        Some(tubeway::MIME_JSON),
        None,
    );
    Ok(msg)
}
