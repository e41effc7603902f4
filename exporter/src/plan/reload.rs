//! Where the counters CSV comes from, and reloading it without a restart.
//!
//! As in dcgm-exporter, `-m/--configmap-data NAMESPACE:NAME` (the ConfigMap's `metrics`
//! key, read through the API server) takes precedence over `-f/--collectors`; without
//! either, the built-in default list is used. A source that does not load at startup
//! stops startup.
//!
//! A running exporter reloads its counters when the file's content changes (polled as
//! the web config is, through [`tls_serving::watch_files`]), when the ConfigMap's
//! `metrics` changes (a `get` every [`CONFIGMAP_POLL`]), and on SIGHUP. A new list that
//! does not load (a bad line, a missing key) leaves the running one in place, is logged
//! with its file and line, and `gpu_exporter_config_last_reload_successful` reads 0
//! until a reload succeeds. The sampler picks a new plan up at its next cycle and
//! rediscovers the devices for it: the served series change without a restart.

use crate::error::{Error, Result};
use crate::plan::counters::{self, ExportPlan};
use arc_swap::ArcSwap;
use k8s_openapi::api::core::v1::ConfigMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;

/// How often the ConfigMap is read again (one `get` of one object: cheap for the API
/// server, which answers it from its cache, even from thousands of nodes).
pub const CONFIGMAP_POLL: Duration = Duration::from_secs(10);

/// The ConfigMap key dcgm-exporter reads the counters from.
pub const CONFIGMAP_KEY: &str = "metrics";

/// Counters files that dcgm-exporter's image ships and deployments name without mounting
/// them (the GPU Operator sets DCGM_EXPORTER_COLLECTORS to the second). The rows they
/// enable are dcgm-exporter's default list, which is built in.
const DCGM_IMAGE_COUNTERS_FILES: &[&str] = &[
    "/etc/dcgm-exporter/default-counters.csv",
    "/etc/dcgm-exporter/dcp-metrics-included.csv",
];

/// Where the counters come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanSource {
    Builtin,
    File(PathBuf),
    ConfigMap { namespace: String, name: String },
}

impl PlanSource {
    /// From `-m` (`none` or empty: unset) and `-f`: the ConfigMap wins, as in
    /// dcgm-exporter.
    pub fn new(configmap_data: &str, collectors: Option<&std::path::Path>) -> Result<PlanSource> {
        let cm = configmap_data.trim();
        if !cm.is_empty() && cm != "none" {
            return match cm.split_once(':') {
                Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
                    Ok(PlanSource::ConfigMap {
                        namespace: ns.to_string(),
                        name: name.to_string(),
                    })
                }
                _ => Err(Error::Config(format!(
                    "--configmap-data {configmap_data:?}: expected NAMESPACE:NAME"
                ))),
            };
        }
        Ok(match collectors.filter(|p| !p.as_os_str().is_empty()) {
            Some(path)
                if DCGM_IMAGE_COUNTERS_FILES
                    .iter()
                    .any(|f| path.as_os_str() == *f)
                    && !path.exists() =>
            {
                tracing::info!(file = %path.display(), "dcgm-exporter's image file is not mounted here: serving the same counters, built in");
                PlanSource::Builtin
            }
            Some(path) => PlanSource::File(path.to_path_buf()),
            None => PlanSource::Builtin,
        })
    }

    /// How the logs and errors name the source.
    pub fn describe(&self) -> String {
        match self {
            PlanSource::Builtin => "built-in default counters".into(),
            PlanSource::File(p) => p.display().to_string(),
            PlanSource::ConfigMap { namespace, name } => {
                format!("configmap/{namespace}/{name}[{CONFIGMAP_KEY}]")
            }
        }
    }
}

/// Parse a counters text, logging its warnings.
fn plan_logged(text: &str, source: &str) -> Result<ExportPlan> {
    let (plan, warnings) = counters::plan(text, source)?;
    log_warnings(warnings);
    Ok(plan)
}

pub fn log_warnings(warnings: Vec<counters::PlanWarning>) {
    for w in warnings {
        if w.notice {
            tracing::info!(line = w.line, "{}", w.message);
        } else {
            tracing::warn!(line = w.line, "{}", w.message);
        }
    }
}

/// Load a local source (file or built-in).
pub fn load_local(source: &PlanSource) -> Result<ExportPlan> {
    match source {
        PlanSource::Builtin => plan_logged(counters::DEFAULT_COUNTERS, &source.describe()),
        PlanSource::File(path) => {
            let (plan, warnings) = counters::load(path)?;
            log_warnings(warnings);
            Ok(plan)
        }
        PlanSource::ConfigMap { .. } => Err(Error::Config(
            "a ConfigMap is read through the API server".into(),
        )),
    }
}

/// The counters text of a ConfigMap: its `metrics` key.
pub async fn fetch_configmap(client: &kube::Client, namespace: &str, name: &str) -> Result<String> {
    let what = format!("configmap/{namespace}/{name}");
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), namespace);
    let found = api.get_opt(name).await;
    let map = found
        .map_err(|e| Error::Config(format!("cannot read {what}: {e}")))?
        .ok_or_else(|| Error::Config(format!("{what} does not exist")))?;
    map.data
        .and_then(|mut d| d.remove(CONFIGMAP_KEY))
        .ok_or_else(|| Error::Config(format!("{what} has no {CONFIGMAP_KEY:?} key")))
}

/// The outcome of the last reload, for the exporter's own metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReloadStatus {
    /// The last reload (or the startup load) succeeded.
    pub successful: bool,
    /// When the last successful load was.
    pub last_success: SystemTime,
}

/// The current plan and how its last reload went: written by the reloaders, read by
/// the sampler each cycle.
#[derive(Debug)]
pub struct PlanHandle {
    plan: ArcSwap<ExportPlan>,
    status: Mutex<ReloadStatus>,
}

impl PlanHandle {
    pub fn new(plan: Arc<ExportPlan>) -> PlanHandle {
        PlanHandle {
            plan: ArcSwap::new(plan),
            status: Mutex::new(ReloadStatus {
                successful: true,
                last_success: SystemTime::now(),
            }),
        }
    }

    pub fn plan(&self) -> Arc<ExportPlan> {
        self.plan.load_full()
    }

    pub fn status(&self) -> ReloadStatus {
        *self.status.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A reload succeeded: serve `plan` from the next cycle on.
    pub fn succeeded(&self, plan: ExportPlan) {
        self.plan.store(Arc::new(plan));
        *self.status.lock().unwrap_or_else(|e| e.into_inner()) = ReloadStatus {
            successful: true,
            last_success: SystemTime::now(),
        };
    }

    /// A reload failed: the running plan stays.
    pub fn failed(&self) {
        self.status
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .successful = false;
    }
}

/// Reload `source` into `handle` on change and whenever `hangup` is notified (SIGHUP).
/// Spawns on the current runtime; `client` is needed for a ConfigMap.
pub fn watch(
    source: PlanSource,
    handle: Arc<PlanHandle>,
    hangup: Arc<Notify>,
    client: Option<kube::Client>,
    file_poll: Duration,
) {
    match source {
        PlanSource::ConfigMap { namespace, name } => {
            let Some(client) = client else { return };
            tokio::spawn(watch_configmap(client, namespace, name, handle, hangup));
        }
        PlanSource::File(path) => {
            let what = source_describe(&path);
            tls_serving::watch_files_or_notified(
                "counters CSV",
                vec![path.clone()],
                file_poll,
                hangup,
                move || match counters::load(&path) {
                    Ok((plan, warnings)) => {
                        log_warnings(warnings);
                        tracing::info!(file = %what, metrics = plan.metrics.len(), "counters reloaded");
                        handle.succeeded(plan);
                        Ok(vec![path.clone()])
                    }
                    Err(e) => {
                        handle.failed();
                        Err(tls_serving::ReloadError::new(e))
                    }
                },
            );
        }
        PlanSource::Builtin => {
            // Nothing can change; a SIGHUP still reloads (and says so), as dcgm-exporter's
            // does, so that it never ends the process.
            tokio::spawn(async move {
                loop {
                    hangup.notified().await;
                    match plan_logged(counters::DEFAULT_COUNTERS, "built-in default counters") {
                        Ok(plan) => {
                            tracing::info!("SIGHUP: built-in counters reloaded");
                            handle.succeeded(plan);
                        }
                        Err(e) => {
                            tracing::error!(error = %e, "SIGHUP: built-in counters do not load");
                            handle.failed();
                        }
                    }
                }
            });
        }
    }
}

fn source_describe(path: &std::path::Path) -> String {
    path.display().to_string()
}

async fn watch_configmap(
    client: kube::Client,
    namespace: String,
    name: String,
    handle: Arc<PlanHandle>,
    hangup: Arc<Notify>,
) {
    let what = PlanSource::ConfigMap {
        namespace: namespace.clone(),
        name: name.clone(),
    }
    .describe();
    // The text the running plan came from (the startup load read the same).
    let mut last_text = fetch_configmap(&client, &namespace, &name).await.ok();
    let mut last_error = String::new();
    let mut ticker = tokio::time::interval(CONFIGMAP_POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        let forced = tokio::select! {
            _ = ticker.tick() => false,
            _ = hangup.notified() => true,
        };
        let outcome = match fetch_configmap(&client, &namespace, &name).await {
            Ok(text) if !forced && last_text.as_deref() == Some(text.as_str()) => continue,
            Ok(text) => {
                let parsed = plan_logged(&text, &what);
                last_text = Some(text);
                parsed
            }
            // An API server that does not answer is not a bad config: keep polling
            // quietly, unless a reload was asked for.
            Err(e) if !forced && matches!(&e, Error::Config(m) if m.starts_with("cannot read")) => {
                tracing::debug!(error = %e, "counters ConfigMap not read; trying again");
                continue;
            }
            Err(e) => Err(e),
        };
        match outcome {
            Ok(plan) => {
                tracing::info!(configmap = %what, metrics = plan.metrics.len(), "counters reloaded");
                handle.succeeded(plan);
                last_error.clear();
            }
            Err(e) => {
                let message = e.to_string();
                if message != last_error || forced {
                    tracing::error!(configmap = %what, error = %message, "new counters do not load: keeping the running ones");
                    last_error = message;
                }
                handle.failed();
            }
        }
    }
}

/// Notify `hangup` on every SIGHUP until the runtime stops. Installed at startup in
/// every mode, so a SIGHUP never ends the process.
pub fn forward_sighup(hangup: Arc<Notify>) -> std::io::Result<()> {
    let mut signals = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    tokio::spawn(async move {
        while signals.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the counters");
            hangup.notify_one();
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configmap_wins_over_the_file_and_none_means_unset() {
        let f = std::path::Path::new("/etc/c.csv");
        assert_eq!(
            PlanSource::new("gpu:counters", Some(f)).unwrap(),
            PlanSource::ConfigMap {
                namespace: "gpu".into(),
                name: "counters".into()
            }
        );
        assert_eq!(
            PlanSource::new("none", Some(f)).unwrap(),
            PlanSource::File(f.into())
        );
        assert_eq!(PlanSource::new("", None).unwrap(), PlanSource::Builtin);
        assert_eq!(
            PlanSource::new("none", Some(std::path::Path::new(""))).unwrap(),
            PlanSource::Builtin
        );
        for bad in ["gpu", "gpu:", ":counters", "a:b:c"] {
            let e = PlanSource::new(bad, None).unwrap_err().to_string();
            assert!(e.contains("NAMESPACE:NAME"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_failed_reload_keeps_the_plan_and_says_so_until_one_succeeds() {
        let first = load_local(&PlanSource::Builtin).unwrap();
        let n = first.metrics.len();
        let h = PlanHandle::new(Arc::new(first));
        let before = h.plan();
        h.failed();
        assert!(!h.status().successful);
        assert!(Arc::ptr_eq(&before, &h.plan()), "the running plan stays");
        let (small, _) = counters::plan("DCGM_FI_DEV_GPU_TEMP, gauge, t\n", "t").unwrap();
        h.succeeded(small);
        assert!(h.status().successful);
        assert_eq!(h.plan().metrics.len(), 1);
        assert_ne!(n, 1);
    }
}
