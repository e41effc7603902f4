//! A real control plane for the tests: `tests/kube/cluster.sh up` in a scratch
//! directory (etcd, kube-apiserver, controller-manager, scheduler, kwok, GPU nodes with
//! fake kubelets and exporters, the adapter behind the aggregator), and the built
//! kubectl of the same Kubernetes release to talk to it. Dropping it runs `down`.

use crate::{scratch_dir, target_profile_dir, wait_for, workspace};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub struct Cluster {
    dir: PathBuf,
    env: HashMap<String, String>,
    down: bool,
}

impl Cluster {
    /// Bring a cluster up (the binaries must be built: tests/run.sh builds the Go ones
    /// with tests/kube/build.sh and the Rust ones with cargo).
    pub fn up() -> Cluster {
        Cluster::up_with(&[])
    }

    /// Bring a cluster up with cluster.sh's environment settings, e.g.
    /// `("DEPLOY_WITH", "helm")`.
    pub fn up_with(env: &[(&str, &str)]) -> Cluster {
        let dir = scratch_dir("cluster");
        let out = Command::new("bash")
            .arg(workspace().join("tests/kube/cluster.sh"))
            .arg("up")
            .arg(&dir)
            .env("RUST_BIN_DIR", target_profile_dir())
            .envs(env.iter().copied())
            .output()
            .expect("run tests/kube/cluster.sh");
        let mut cluster = Cluster {
            env: HashMap::new(),
            dir,
            down: false,
        };
        assert!(
            out.status.success(),
            "cluster.sh up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env = std::fs::read_to_string(cluster.dir.join("env")).expect("DIR/env");
        cluster.env = env
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('"').to_string()))
            .collect();
        cluster
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A value `up` wrote to DIR/env (ports, paths).
    pub fn env(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("{key} not in DIR/env"))
    }

    /// The built kubectl, as the cluster's admin.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(Path::new(self.env("KUBE_BIN_DIR")).join("kubectl"));
        cmd.arg("--kubeconfig").arg(self.dir.join("kubeconfig"));
        cmd
    }

    /// The built helm, as the cluster's admin, with the state `up` gave it (DIR/helm: its
    /// post-renderer plugin among it).
    pub fn helm(&self) -> Command {
        let mut cmd = Command::new(Path::new(self.env("KUBE_BIN_DIR")).join("helm"));
        cmd.env("KUBECONFIG", self.dir.join("kubeconfig"));
        for key in ["HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"] {
            cmd.env(key, self.env(key));
        }
        cmd
    }

    /// Run kubectl with `args`: its output, whatever its exit status.
    pub fn run(&self, args: &[&str]) -> Output {
        self.kubectl().args(args).output().expect("run kubectl")
    }

    /// Run kubectl with `args` and return stdout, panicking with stderr on failure.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&all)).expect("kubectl -o json")
    }

    /// `kubectl get --raw PATH` through the API server (and its aggregator).
    pub fn raw(&self, path: &str) -> Result<serde_json::Value, String> {
        let out = self.run(&["get", "--raw", path]);
        if out.status.success() {
            serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Set every simulated GPU's utilisation (the dial all exporters read).
    pub fn set_utilization(&self, percent: u32) {
        let dial = self.env("DIAL");
        // Written whole and renamed, so a reader never sees half a file.
        let tmp = format!("{dial}.tmp");
        std::fs::write(&tmp, format!("*={percent}\n")).expect("write the dial");
        std::fs::rename(&tmp, dial).expect("replace the dial");
    }

    /// The pids `up` started that are still alive.
    pub fn running(&self) -> Vec<u32> {
        std::fs::read_dir(self.dir.join("pids"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|p| p.trim().parse().ok())
            .filter(|p: &u32| Path::new(&format!("/proc/{p}")).exists())
            .collect()
    }

    /// Run `cluster.sh down` and return the pids that were running before it.
    pub fn down(&mut self) -> Vec<u32> {
        let before = self.running();
        let status = Command::new("bash")
            .arg(workspace().join("tests/kube/cluster.sh"))
            .arg("down")
            .arg(&self.dir)
            .status()
            .expect("run cluster.sh down");
        assert!(status.success(), "cluster.sh down failed");
        self.down = true;
        before
    }

    /// Wait until `f` holds, polling the cluster.
    pub fn wait<T>(&self, what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
        wait_for(what, timeout, f)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.down {
            let _ = Command::new("bash")
                .arg(workspace().join("tests/kube/cluster.sh"))
                .arg("down")
                .arg(&self.dir)
                .status();
        }
    }
}
