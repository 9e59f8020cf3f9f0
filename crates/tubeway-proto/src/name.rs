//! Destination names: queues, topics and functions.

/// Longest name, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// Why a name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("name is empty")]
    Empty,
    /// The name is too long.
    #[error("name is {0} bytes; the limit is {MAX_NAME_LEN}")]
    TooLong(usize),
    /// The name holds whitespace or a control character.
    #[error("name contains {0:?}; names are printable characters without spaces")]
    BadChar(char),
}

/// Checks a destination name: non-empty, at most [`MAX_NAME_LEN`] bytes,
/// printable characters with no whitespace.
pub fn validate(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(NameError::TooLong(name.len()));
    }
    if let Some(c) = name.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(NameError::BadChar(c));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate("orders.eu-1/a_b").is_ok());
        assert_eq!(validate(""), Err(NameError::Empty));
        assert_eq!(validate("a b"), Err(NameError::BadChar(' ')));
        assert_eq!(validate("a\u{7}"), Err(NameError::BadChar('\u{7}')));
        assert!(matches!(
            validate(&"x".repeat(256)),
            Err(NameError::TooLong(256))
        ));
    }
}
