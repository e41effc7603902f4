//! The one grammar of both binaries' `--log-level`: `RUST_LOG` directives
//! (`info`, `gpu_exporter=debug,hyper=warn`), except that a bare word must be a level.
//!
//! tracing's own parser takes any bare word as a target name (`verbose` would mean
//! "everything from the target `verbose`", so nothing would be logged), and the
//! binaries used to fall back to `info` on a filter it refused. Both hid a typo; here
//! each is an error at startup that names the problem.

use tracing_subscriber::EnvFilter;

const LEVELS: [&str; 6] = ["off", "error", "warn", "info", "debug", "trace"];

/// Check a `--log-level` value; as a clap `value_parser`, a bad one fails at startup.
pub fn parse(text: &str) -> Result<String, BadLogFilter> {
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains(['=', '[', ':']);
        if bare && !LEVELS.iter().any(|l| l.eq_ignore_ascii_case(directive)) {
            return Err(BadLogFilter::NotALevel(directive.to_owned()));
        }
    }
    EnvFilter::try_new(text)
        .map(|_| text.to_owned())
        .map_err(|source| BadLogFilter::Filter {
            text: text.to_owned(),
            source,
        })
}

/// A `--log-level` value that is not a level or a filter.
#[derive(Debug, thiserror::Error)]
pub enum BadLogFilter {
    #[error("{0:?} is not a level (one of {levels}); name a target as TARGET=LEVEL", levels = LEVELS.join(", "))]
    NotALevel(String),
    #[error("{text:?} is not a log filter: {source}")]
    Filter {
        text: String,
        source: tracing_subscriber::filter::ParseError,
    },
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn levels_and_directives_are_accepted() {
        for ok in ["info", "DEBUG", "warn,gpu_exporter=debug", "h2=off, trace"] {
            assert_eq!(parse(ok).expect(ok), ok);
        }
    }

    #[test]
    fn typos_and_malformed_filters_are_refused() {
        let bare = parse("verbose").unwrap_err().to_string();
        assert!(bare.contains("\"verbose\" is not a level"), "{bare}");
        let mixed = parse("info,debg").unwrap_err().to_string();
        assert!(mixed.contains("\"debg\""), "{mixed}");
        let level = parse("gpu_exporter=loud").unwrap_err().to_string();
        assert!(level.contains("is not a log filter"), "{level}");
    }
}
