//! The Kubernetes client both products build the same way.

use crate::Error;
use std::path::Path;

/// A client from `kubeconfig`, else the in-cluster configuration (or the usual
/// kubeconfig search, for running outside a cluster).
///
/// Client-side retries are off: every caller watches through [`crate::watch`], which
/// restarts and backs off by itself, and the client's own retries of 5xx answers would
/// only hide an outage from the products' `*_up` metrics and readiness for minutes.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, Error> {
    let mut config = match kubeconfig {
        Some(path) => {
            // Refused before kube reads it whole: `/dev/zero` or a FIFO would grow or
            // block. kube reads it by path, as it must to resolve relative file names.
            config_file::check(path, config_file::DEFAULT_LIMIT).map_err(|source| {
                Error::KubeconfigFile {
                    path: path.to_path_buf(),
                    source,
                }
            })?;
            let kubeconfig =
                kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|source| Error::Kubeconfig {
                path: path.to_path_buf(),
                source,
            })?
        }
        None => kube::Config::infer().await?,
    };
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kubeconfig_that_does_not_load_names_its_path() {
        let missing = Path::new("/nonexistent/kubeconfig");
        let Err(e) = client(Some(missing)).await else {
            panic!("a missing kubeconfig made a client");
        };
        assert!(matches!(e, Error::KubeconfigFile { .. }), "{e:?}");
        assert!(e.to_string().contains("/nonexistent/kubeconfig"), "{e}");
    }

    /// `--kubeconfig /dev/zero` or a FIFO fails at once, naming the path, instead of
    /// growing without end or blocking startup.
    #[tokio::test]
    async fn a_kubeconfig_that_is_not_a_regular_file_is_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        for (path, says) in [
            (Path::new("/dev/zero"), "a character device"),
            (fifo.as_path(), "a FIFO"),
        ] {
            let Err(e) = client(Some(path)).await else {
                panic!("{path:?} made a client");
            };
            assert!(matches!(e, Error::KubeconfigFile { .. }), "{e:?}");
            assert!(e.to_string().contains(says), "{e}");
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        }
    }

    #[tokio::test]
    async fn a_kubeconfig_file_is_used_as_given() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'http://127.0.0.1:1'}}]\n\
             users: [{name: u, user: {token: t}}]\n\
             contexts: [{name: c, context: {cluster: k, user: u, namespace: gpu-team}}]\n",
        )
        .expect("write kubeconfig");
        let client = client(Some(&path)).await.expect("client from the file");
        assert_eq!(client.default_namespace(), "gpu-team");
    }
}
