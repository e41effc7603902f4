//! Certificate (and other file) rotation without a restart.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use tokio::sync::Notify;

/// The current server configuration; each new connection uses whatever it holds then.
pub type TlsConfigHandle = Arc<ArcSwap<ServerConfig>>;

/// Why a reload failed, and the files to watch from then on when the attempt got far
/// enough to know them (a new config that names other files), else `None`: keep
/// watching the old ones.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct ReloadError {
    pub error: Box<dyn std::error::Error + Send + Sync>,
    pub files: Option<Vec<PathBuf>>,
}

impl ReloadError {
    /// A failure before the new configuration named its files.
    pub fn new(error: impl std::error::Error + Send + Sync + 'static) -> ReloadError {
        ReloadError {
            error: Box::new(error),
            files: None,
        }
    }

    /// A failure of a configuration that names `files`.
    pub fn with_files(
        error: impl std::error::Error + Send + Sync + 'static,
        files: Vec<PathBuf>,
    ) -> ReloadError {
        ReloadError {
            error: Box::new(error),
            files: Some(files),
        }
    }
}

/// Polls `files` every `interval` and, when any file's bytes change, calls `reload`,
/// which loads and applies the new configuration and returns the files it read
/// (watched from then on). Content is compared, not modification times, because
/// Secret and ConfigMap mounts change through a symlink swap that can keep the times,
/// and two writes can share a second. A reload that fails (half-written file, wrong
/// key) must leave the running configuration as it was; it is logged once per distinct
/// error. `what` names the files in the logs. The task ends with the runtime.
pub fn watch_files<F>(what: &'static str, files: Vec<PathBuf>, interval: Duration, reload: F)
where
    F: FnMut() -> Result<Vec<PathBuf>, ReloadError> + Send + 'static,
{
    watch_files_or_notified(what, files, interval, Arc::new(Notify::new()), reload);
}

/// [`watch_files`], and also reload, changed or not, whenever `reload_now` is notified
/// (a SIGHUP).
pub fn watch_files_or_notified<F>(
    what: &'static str,
    files: Vec<PathBuf>,
    interval: Duration,
    reload_now: Arc<Notify>,
    mut reload: F,
) where
    F: FnMut() -> Result<Vec<PathBuf>, ReloadError> + Send + 'static,
{
    tokio::spawn(async move {
        let mut watched = files;
        let mut last = snapshot(&watched);
        let mut last_error = String::new();
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let forced = tokio::select! {
                _ = ticker.tick() => false,
                _ = reload_now.notified() => true,
            };
            if !forced && snapshot(&watched) == last {
                continue;
            }
            if forced {
                // A reload asked for is answered, even with an error already logged.
                last_error.clear();
            }
            match reload() {
                Ok(files) => {
                    tracing::info!(what, files = ?files, "a watched file changed: reloaded, new connections and requests use it");
                    watched = files;
                    last_error.clear();
                }
                Err(ReloadError { error, files }) => {
                    let message = error.to_string();
                    if message != last_error {
                        tracing::error!(what, error = %message, "a watched file changed but the configuration does not load: keeping the previous one");
                        last_error = message;
                    }
                    if let Some(files) = files {
                        watched = files;
                    }
                }
            }
            last = snapshot(&watched);
        }
    });
}

/// [`watch_files`] for a server configuration that `build` makes (with the files it
/// read), stored into `handle`.
pub fn watch_server_config<F>(
    handle: TlsConfigHandle,
    files: Vec<PathBuf>,
    interval: Duration,
    build: F,
) where
    F: Fn() -> Result<(ServerConfig, Vec<PathBuf>), crate::Error> + Send + 'static,
{
    watch_files("TLS certificate", files, interval, move || {
        let (config, files) = build().map_err(ReloadError::new)?;
        handle.store(Arc::new(config));
        Ok(files)
    });
}

fn snapshot(files: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    // Bounded as the loads are: a file swapped for something huge reads as unreadable
    // (the reload then says why) instead of being held in memory.
    files
        .iter()
        .map(|path| crate::pem::read(path).ok())
        .collect()
}
