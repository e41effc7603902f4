//! Certificate rotation without a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;

use crate::Error;

/// The current server configuration; each new connection uses whatever it holds then.
pub type TlsConfigHandle = Arc<ArcSwap<ServerConfig>>;

/// Polls `files` (those the current configuration was built from) every `interval`
/// and, when any file's bytes change, calls `build` again (it returns the configuration
/// and the files it read, which are watched from then on). Content is compared, not
/// modification times, because Secret and ConfigMap mounts change through a
/// symlink swap that can keep the times, and two writes can share a second. A file that
/// does not build (half written, wrong key) keeps the previous configuration and is
/// logged once per distinct error. The task ends with the runtime.
pub fn watch_files<F>(handle: TlsConfigHandle, files: Vec<PathBuf>, interval: Duration, build: F)
where
    F: Fn() -> Result<(ServerConfig, Vec<PathBuf>), Error> + Send + 'static,
{
    tokio::spawn(async move {
        let mut watched = files;
        let mut last = snapshot(&watched);
        let mut last_error = String::new();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let now = snapshot(&watched);
            if now == last {
                continue;
            }
            match build() {
                Ok((config, files)) => {
                    handle.store(Arc::new(config));
                    tracing::info!(files = ?files, "TLS files changed: new connections use the new configuration");
                    watched = files;
                    last = snapshot(&watched);
                    last_error.clear();
                }
                Err(e) => {
                    let message = e.to_string();
                    if message != last_error {
                        tracing::error!(error = %message, "TLS files changed but do not load: keeping the previous configuration");
                        last_error = message;
                    }
                    last = now;
                }
            }
        }
    });
}

fn snapshot(files: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|path| std::fs::read(path).ok()).collect()
}
