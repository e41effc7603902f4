//! The listener flags both binaries take, declared once and flattened into each
//! binary's command line: every connection is bounded in time and number. Only the
//! default of `--max-connections` differs (`MAX_CONNECTIONS`): the exporter answers
//! every Prometheus replica and adapter of a cluster, the adapter only the API server's
//! aggregator and KEDA.

use crate::duration;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct ListenerFlags<const MAX_CONNECTIONS: u32> {
    /// Close a connection with no request in progress for this long: before its first
    /// request, between requests, and while an HTTP/1.1 request's headers trickle in
    /// (slowloris).
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = duration::parse_flag)]
    pub http_idle_timeout: Duration,

    /// A TLS client must finish its handshake within this.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = duration::parse_flag)]
    pub tls_handshake_timeout: Duration,

    /// Connections served at once on each listening port; more are closed at once,
    /// except a few that may only ask the health paths, so probes still pass under a
    /// flood.
    #[arg(long, value_name = "N", default_value_t = MAX_CONNECTIONS, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// Connections served at once from one client address on each port, within
    /// --max-connections, so one client cannot take every slot; its further connections
    /// may only ask the health paths. Raise it when many clients share one address (a
    /// proxy, SNAT).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_address: u32,

    /// Streams an HTTP/2 client may have open at once on one connection.
    #[arg(long, value_name = "N", default_value_t = 250, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub http2_max_streams_per_connection: u32,
}

impl<const MAX_CONNECTIONS: u32> ListenerFlags<MAX_CONNECTIONS> {
    /// The listener's bounds; the health reserve answers `health_paths` only.
    pub fn limits(&self, health_paths: &[&str]) -> tls_serving::Limits {
        tls_serving::Limits {
            idle_timeout: self.http_idle_timeout,
            handshake_timeout: self.tls_handshake_timeout,
            max_connections: self.max_connections as usize,
            max_connections_per_address: self.max_connections_per_address as usize,
            http2_max_concurrent_streams: self.http2_max_streams_per_connection,
            health_paths: health_paths.iter().map(|p| p.to_string()).collect(),
            ..tls_serving::Limits::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        listener: ListenerFlags<7>,
    }

    #[test]
    fn each_binary_sets_its_own_connection_default_and_the_rest_are_shared() {
        let cli = Cli::try_parse_from(["x"]).expect("defaults");
        let limits = cli.listener.limits(&["/healthz"]);
        assert_eq!(limits.max_connections, 7);
        assert_eq!(limits.max_connections_per_address, 64);
        assert_eq!(limits.idle_timeout, Duration::from_secs(30));
        assert_eq!(limits.handshake_timeout, Duration::from_secs(10));
        assert_eq!(limits.http2_max_concurrent_streams, 250);
        assert_eq!(limits.health_paths, ["/healthz"]);
        let cli = Cli::try_parse_from(["x", "--max-connections", "9", "--http-idle-timeout", "2s"])
            .expect("flags");
        assert_eq!(cli.listener.max_connections, 9);
        assert_eq!(cli.listener.http_idle_timeout, Duration::from_secs(2));
        assert!(Cli::try_parse_from(["x", "--max-connections", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--http-idle-timeout", "1ms"]).is_err());
    }
}
