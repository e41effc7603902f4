//! The exporter's one error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A counters CSV line is malformed or names an unknown field.
    #[error("{file}:{line}: {message}")]
    Counters {
        file: String,
        line: u64,
        message: String,
    },
    /// A counters CSV line names a field that DCGM does not have. The closest names are
    /// scored when the error is shown, not when it is made: scoring every DCGM name
    /// costs about a millisecond, and most such errors (a fuzzer's, a rejected reload's
    /// retry) are never shown.
    #[error(
        "{file}:{line}: unknown DCGM field {name:?}; closest known fields: {}",
        crate::plan::catalog::closest_names(name).join(", ")
    )]
    CountersUnknownField {
        file: String,
        line: u64,
        name: String,
    },
    #[error("cannot read counters file {file}: {source}")]
    CountersRead {
        file: String,
        source: std::io::Error,
    },
    #[error("counters file {file} enables no metric")]
    CountersEmpty { file: String },
    /// A `--simulate` scenario that does not load.
    #[cfg(feature = "demo")]
    #[error(transparent)]
    Scenario(#[from] gpu_sim::ScenarioError),
    #[error("NVML ({library}): {message}")]
    Nvml { library: String, message: String },
    #[error("invalid listen address {0:?}: expected HOST:PORT or :PORT")]
    Address(String),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: String,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    WebConfig(#[from] crate::serving::web_config::WebConfigError),
    #[error(
        "--kubernetes-pod-label-allowlist-regex {pattern:?} is not a regular expression: {source}"
    )]
    PodLabelPattern {
        pattern: String,
        source: regex::Error,
    },
    /// Flags or a source they name that cannot be used.
    #[error("{0}")]
    Config(String),
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
