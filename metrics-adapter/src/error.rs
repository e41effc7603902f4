//! The adapter's errors.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("cannot listen on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}
