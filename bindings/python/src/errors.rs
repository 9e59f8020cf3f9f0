//! The exception hierarchy and the mapping from Rust errors to it.
//!
//! Every exception derives from `tubeway.Error` and carries `status`: the
//! protocol's response status name (`"queue_full"`, ...) or `None` when the
//! failure was local (a closed connection, a bad URL).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use tubeway::ResponseStatus;

create_exception!(tubeway, Error, PyException, "Every error Tubeway raises.");
create_exception!(tubeway, Timeout, Error, "No answer within the timeout.");
create_exception!(
    tubeway,
    QueueFull,
    Error,
    "A bounded queue stayed full until the offer's timeout."
);
create_exception!(
    tubeway,
    QueueEmpty,
    Error,
    "The queue stayed empty until the poll's timeout."
);
create_exception!(
    tubeway,
    NotFound,
    Error,
    "No queue, topic or function of that name."
);
create_exception!(
    tubeway,
    TooLarge,
    Error,
    "The message exceeds the maximum message size."
);
create_exception!(
    tubeway,
    ConnectionClosed,
    Error,
    "The connection is closed, or closed during the call."
);
create_exception!(
    tubeway,
    ConnectError,
    Error,
    "The connection could not be established."
);
create_exception!(
    tubeway,
    PermissionDenied,
    Error,
    "The peer is not authenticated or may not do this."
);
create_exception!(
    tubeway,
    HandlerError,
    Error,
    "The function's handler failed; the message is its reason."
);
create_exception!(
    tubeway,
    BadRequest,
    Error,
    "The request was malformed or not allowed in this form."
);
create_exception!(
    tubeway,
    Conflict,
    Error,
    "The destination exists with different settings."
);
create_exception!(
    tubeway,
    Unavailable,
    Error,
    "The broker cannot take this now (shutting down, connection limit)."
);
create_exception!(
    tubeway,
    Expired,
    Error,
    "The message expired before it could be handed out or answered."
);
create_exception!(tubeway, ServerError, Error, "The broker failed.");
create_exception!(
    tubeway,
    SerializationError,
    Error,
    "An object could not be serialized, or a received one could not be loaded (or was refused)."
);

/// Registers every exception class on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("Timeout", py.get_type::<Timeout>())?;
    m.add("QueueFull", py.get_type::<QueueFull>())?;
    m.add("QueueEmpty", py.get_type::<QueueEmpty>())?;
    m.add("NotFound", py.get_type::<NotFound>())?;
    m.add("TooLarge", py.get_type::<TooLarge>())?;
    m.add("ConnectionClosed", py.get_type::<ConnectionClosed>())?;
    m.add("ConnectError", py.get_type::<ConnectError>())?;
    m.add("PermissionDenied", py.get_type::<PermissionDenied>())?;
    m.add("HandlerError", py.get_type::<HandlerError>())?;
    m.add("BadRequest", py.get_type::<BadRequest>())?;
    m.add("Conflict", py.get_type::<Conflict>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("Expired", py.get_type::<Expired>())?;
    m.add("ServerError", py.get_type::<ServerError>())?;
    m.add("SerializationError", py.get_type::<SerializationError>())?;
    Ok(())
}

/// An exception of the class for `status`, with `status` set on it.
pub fn status_error(status: ResponseStatus, reason: &str) -> PyErr {
    use ResponseStatus as S;
    let text = if reason.is_empty() {
        status.as_str().to_owned()
    } else {
        format!("{}: {reason}", status.as_str())
    };
    let err = match status {
        S::Timeout => Timeout::new_err(text),
        S::QueueFull => QueueFull::new_err(text),
        S::QueueEmpty => QueueEmpty::new_err(text),
        S::QueueNotFound | S::TopicNotFound | S::FunctionNotFound => NotFound::new_err(text),
        S::TooLarge => TooLarge::new_err(text),
        S::Unauthorized | S::NoPermission => PermissionDenied::new_err(text),
        S::HandlerError => HandlerError::new_err(text),
        S::BadRequest | S::UnsupportedVersion => BadRequest::new_err(text),
        S::Conflict => Conflict::new_err(text),
        S::Unavailable => Unavailable::new_err(text),
        S::Expired => Expired::new_err(text),
        _ => ServerError::new_err(text),
    };
    with_status(err, Some(status.as_str()))
}

fn with_status(err: PyErr, status: Option<&str>) -> PyErr {
    Python::attach(|py| {
        // Setting an attribute on a fresh exception instance cannot fail in
        // practice; if it did, the exception is still the right class.
        let _ = err.value(py).setattr("status", status);
    });
    err
}

/// The Python exception for a client or server error.
pub fn to_py(e: tubeway::Error) -> PyErr {
    use tubeway::Error as E;
    match e {
        E::Status { status, reason } => status_error(status, &reason),
        E::Timeout(d) => with_status(
            Timeout::new_err(format!("no response within {:.3} s", d.as_secs_f64())),
            Some(ResponseStatus::Timeout.as_str()),
        ),
        E::TooLarge { len, max } => with_status(
            TooLarge::new_err(format!(
                "message is {len} bytes; the broker accepts at most {max}"
            )),
            Some(ResponseStatus::TooLarge.as_str()),
        ),
        E::ConnectionClosed(why) => with_status(
            ConnectionClosed::new_err(format!("connection closed: {why}")),
            None,
        ),
        E::SubscriptionEnded => with_status(ConnectionClosed::new_err("subscription ended"), None),
        E::Connect { .. } | E::Handshake(_) => {
            with_status(ConnectError::new_err(e.to_string()), None)
        }
        E::InvalidUrl(_) => pyo3::exceptions::PyValueError::new_err(e.to_string()),
        E::Payload(_) | E::Encode(_) => with_status(BadRequest::new_err(e.to_string()), None),
        // The wait of a blocking call was cut short by a signal (Ctrl-C).
        E::Interrupted => pyo3::exceptions::PyKeyboardInterrupt::new_err(()),
        other => with_status(Error::new_err(other.to_string()), None),
    }
}

/// The error of a poll that got no message in time.
pub fn queue_empty() -> PyErr {
    status_error(tubeway::ResponseStatus::QueueEmpty, "no message in time")
}

/// The error for an object used after `close()`.
pub fn closed(what: &str) -> PyErr {
    with_status(
        ConnectionClosed::new_err(format!("the {what} is closed")),
        None,
    )
}
