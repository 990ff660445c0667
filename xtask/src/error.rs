//! A string error with context, so every failure says what failed and why.

use std::fmt;

/// An error message, built up with [`Context`].
pub struct Error(String);

/// Result with [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with the given message.
    pub fn msg(message: impl Into<String>) -> Self {
        Error(message.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Adds "what we were doing" to an error: `doing X: cause`.
pub trait Context<T> {
    /// Prefixes the error with `what`.
    fn context(self, what: impl fmt::Display) -> Result<T>;
    /// Like [`Context::context`], computing the message only on error.
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: fmt::Display> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.map_err(|e| Error(format!("{what}: {e}")))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error(format!("{}: {e}", what())))
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, what: impl fmt::Display) -> Result<T> {
        self.ok_or_else(|| Error(what.to_string()))
    }
    fn with_context(self, what: impl FnOnce() -> String) -> Result<T> {
        self.ok_or_else(|| Error(what()))
    }
}

/// Returns early with a formatted [`Error`].
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::Error::msg(format!($($arg)*)))
    };
}
pub(crate) use bail;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_prefixes_the_cause() {
        let r: std::result::Result<(), &str> = Err("boom");
        assert_eq!(r.context("doing x").unwrap_err().to_string(), "doing x: boom");
        assert_eq!(None::<u8>.context("missing").unwrap_err().to_string(), "missing");
    }
}
