//! Issue 13's container images, run as the manifests run them. `deploy/images/build.sh`
//! builds both (release binaries, the exporter without default features); then:
//!
//! - the exporter image runs with the DaemonSet's own security settings, read here from
//!   `deploy/base/exporter/daemonset.yaml` (user, group, read-only root filesystem,
//!   capabilities, privilege escalation, seccomp, host PID), its args, env and volume
//!   mounts, with the fake `libnvidia-ml.so.1` mounted where the NVIDIA container
//!   toolkit puts the host's library and the fake kubelet's socket directory where the
//!   DaemonSet mounts the kubelet's. It is scraped from outside and its GPU series must
//!   name their pods; `/proc/<pid>/status` of the containerised process must show the
//!   settings in force;
//! - the same, as a non-root user, cannot reach the kubelet's socket: why the DaemonSet
//!   runs as uid 0;
//! - the adapter image runs with the Deployment's settings, its serving certificate
//!   mounted as the Deployment mounts its Secret, and finds that exporter through its
//!   Service's EndpointSlice; it must answer the custom metrics API over HTTPS;
//! - each image adds only its binary to its base: no shell, no package manager, no
//!   NVIDIA library, at most 15 MiB, labelled and tagged with the crate version under
//!   the names deploy/ uses;
//! - both are built for amd64 and arm64 (Grace nodes), each tag one OCI image index
//!   listing both, each image labelled with its architecture; the arm64 exporter image
//!   runs as the amd64 one does, under emulation (qemu-aarch64 registered with
//!   binfmt_misc, as `tests/setup.sh` does it; where the kernel refuses that, the arm64
//!   runs are skipped with a message naming what is missing).
//!
//! The containers run in the host's network namespace (neither manifest asks for it):
//! the fake kubelet and API server listen on loopback, so every byte stays there. Ports
//! are free ones instead of the manifests' 9400 and 6443. Needs root (podman, as
//! `tests/setup.sh` installs it, with runc).

use e2e_tests::https::HttpsClient;
use e2e_tests::pki::Ca;
use e2e_tests::{
    KubeNode, Process, fake_nvml, free_port, sample_value, samples, scratch_dir, try_get, wait_for,
    workspace,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authorization::v1::SubjectAccessReviewSpec;
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const DAEMONSET: &str = "deploy/base/exporter/daemonset.yaml";
const DEPLOYMENT: &str = "deploy/base/adapter/deployment.yaml";
const KUSTOMIZATION: &str = "deploy/base/kustomization.yaml";
const SCENARIO: &str = "tests/fixtures/pods-node.toml";
const NODE: &str = "node-a";
/// The goal of issue 13: what each image may add to its base.
const MAX_ADDED_BYTES: u64 = 15 << 20;
/// Where the kube-apiserver's aggregator comes from: the front proxy's client
/// certificate, asking as the HPA controller.
const HPA_USER: &str = "system:serviceaccount:kube-system:horizontal-pod-autoscaler";

// ---------------------------------------------------------------------------------
// podman

/// podman as this host runs it: runc (crun fails on its cgroup layout), cgroupfs.
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    cmd
}

/// Run a command to success; its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e} (tests/setup.sh installs podman)"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn inspect(image: &str, format: &str) -> String {
    run(podman().args(["image", "inspect", "--format", format, image]))
        .trim()
        .to_string()
}

fn label(image: &str, name: &str) -> String {
    let labels: BTreeMap<String, String> =
        serde_json::from_str(&inspect(image, "{{json .Config.Labels}}")).expect("labels JSON");
    labels
        .get(name)
        .cloned()
        .unwrap_or_else(|| panic!("{image} has no label {name}: {labels:?}"))
}

fn size(image: &str) -> u64 {
    inspect(image, "{{.Size}}").parse().expect("image size")
}

/// The two images, built once per test process by the build script exactly as a user
/// runs it (both architectures), the base it chose for this machine's architecture, and
/// where it wrote the indexes.
struct Images {
    exporter: String,
    adapter: String,
    base: String,
    oci_dir: PathBuf,
}

/// The architectures the images are built for (OCI platform names).
const ARCHES: [&str; 2] = ["amd64", "arm64"];

/// This machine's architecture, as OCI names it.
fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => panic!("the image tests run on amd64 or arm64, not {other}"),
    }
}

/// The local tag of `image`'s build for `arch`.
fn for_arch(image: &str, arch: &str) -> String {
    format!("{image}-{arch}")
}

/// Whether podman can run `arch`'s images here: natively, or through qemu registered
/// with binfmt_misc with its interpreter loaded at registration (flag F), so it works
/// inside containers. Otherwise a line naming what is missing.
fn runnable(arch: &str) -> Result<(), String> {
    if arch == host_arch() {
        return Ok(());
    }
    let qemu = match arch {
        "arm64" => "qemu-aarch64",
        "amd64" => "qemu-x86_64",
        other => return Err(format!("no emulator known for {other}")),
    };
    let entry = format!("/proc/sys/fs/binfmt_misc/{qemu}");
    let Ok(text) = std::fs::read_to_string(&entry) else {
        return Err(format!(
            "{entry} is missing: binfmt_misc is not mounted or {qemu} is not registered \
             (tests/setup.sh does both; Debian packages qemu-user-static, binfmt-support)"
        ));
    };
    if text.lines().next() != Some("enabled") {
        return Err(format!(
            "{entry} is disabled (update-binfmts --enable {qemu})"
        ));
    }
    let flags = text
        .lines()
        .find_map(|l| l.strip_prefix("flags: "))
        .unwrap_or_default();
    if !flags.contains('F') {
        return Err(format!(
            "{entry} lacks flag F: its interpreter cannot be found inside containers"
        ));
    }
    Ok(())
}

/// Skip the rest of a test that runs `arch`'s image, visibly (straight to the test's
/// stderr, not the captured output), when podman cannot run it here.
fn skip_unless_runnable(arch: &str, what: &str) -> bool {
    match runnable(arch) {
        Ok(()) => false,
        Err(missing) => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "SKIPPED: {what} on {arch}: {missing}"
            );
            true
        }
    }
}

fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        assert!(
            run(Command::new("id").arg("-u")).trim() == "0",
            "the image tests run podman as root (rootful containers, files owned by the \
             manifests' groups)"
        );
        let oci_dir = scratch_dir("images-oci");
        let mut cmd = Command::new("bash");
        cmd.arg(workspace().join("deploy/images/build.sh"))
            .arg("--oci-dir")
            .arg(&oci_dir)
            .current_dir(workspace());
        if let Ok(cargo) = std::env::var("CARGO") {
            cmd.env("CARGO", cargo);
        }
        let out = run(&mut cmd);
        let refs: Vec<&str> = out.lines().collect();
        assert_eq!(refs.len(), 2, "build.sh prints the two references: {out}");
        let base = label(refs[0], "org.opencontainers.image.base.name");
        Images {
            exporter: refs[0].to_string(),
            adapter: refs[1].to_string(),
            base,
            oci_dir,
        }
    })
}

/// A container run in the foreground (its output collected), removed on drop.
struct Running {
    name: String,
    process: Process,
}

impl Running {
    fn start(image: &str, options: &[String], args: &[String]) -> Running {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "e2e-images-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let mut cmd = podman();
        cmd.args(["run", "--rm", "--name", &name, "--network", "host"])
            // This host's runc cannot apply podman's default limits.
            .args([
                "--ulimit",
                "nofile=1024:1024",
                "--ulimit",
                "nproc=1024:1024",
            ])
            .args(options)
            .arg(image)
            .args(args);
        Running {
            name,
            process: Process::spawn(cmd),
        }
    }

    /// The containerised process's PID on the host, once it runs.
    fn host_pid(&mut self) -> u32 {
        let name = self.name.clone();
        wait_for("the container to run", Duration::from_secs(60), || {
            self.assert_running();
            let out = podman()
                .args(["inspect", "--format", "{{.State.Pid}}", &name])
                .output()
                .ok()?;
            let pid: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
            (pid != 0).then_some(pid)
        })
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.process.exited() {
            panic!(
                "container {} exited ({status}):\n{}",
                self.name,
                self.process.log()
            );
        }
    }

    /// Poll `url` until `pred` accepts its 200 body; the container must keep running.
    fn wait_for_body(&mut self, what: &str, url: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            self.assert_running();
            if let Ok((200, body)) = try_get(url, &[]) {
                if pred(&body) {
                    return body;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what} at {url}; container log:\n{}",
                self.process.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = podman()
            .args(["rm", "--force", "--time", "0", &self.name])
            .output();
    }
}

// ---------------------------------------------------------------------------------
// The manifests

/// YAML as Kubernetes reads it (YAML 1.1: `0440` is octal).
fn read_yaml<T: k8s_openapi::serde::de::DeserializeOwned>(rel: &str) -> T {
    let text = std::fs::read_to_string(workspace().join(rel))
        .unwrap_or_else(|e| panic!("read {rel}: {e}"));
    serde_saphyr::from_str_with_options(
        &text,
        serde_saphyr::options! { legacy_octal_numbers: true },
    )
    .unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn daemonset_pod() -> PodSpec {
    let ds: DaemonSet = read_yaml(DAEMONSET);
    ds.spec
        .and_then(|s| s.template.spec)
        .expect("the DaemonSet's pod spec")
}

fn deployment_pod() -> PodSpec {
    let d: Deployment = read_yaml(DEPLOYMENT);
    d.spec
        .and_then(|s| s.template.spec)
        .expect("the Deployment's pod spec")
}

fn only_container(pod: &PodSpec) -> &Container {
    assert_eq!(pod.containers.len(), 1, "one container per pod");
    assert!(
        pod.init_containers
            .as_deref()
            .unwrap_or_default()
            .is_empty(),
        "init containers are not run by this test"
    );
    &pod.containers[0]
}

/// The image reference a container runs once kustomize's `images:` of deploy/base
/// applied.
fn deployed_image(container: &Container) -> String {
    let image = container.image.as_deref().expect("container image");
    let (name, tag) = image.rsplit_once(':').expect("image with a tag");
    let k: Value = read_yaml(KUSTOMIZATION);
    let mut reference = (name.to_string(), tag.to_string());
    for i in k["images"].as_array().into_iter().flatten() {
        if i["name"].as_str() == Some(name) {
            assert!(
                i.get("digest").is_none(),
                "a digest in {KUSTOMIZATION}: {i}"
            );
            if let Some(n) = i["newName"].as_str() {
                reference.0 = n.to_string();
            }
            if let Some(t) = i["newTag"].as_str() {
                reference.1 = t.to_string();
            }
        }
    }
    format!("{}:{}", reference.0, reference.1)
}

/// How the test provides each volume the manifest mounts: a host directory.
type Volumes<'a> = &'a [(&'a str, &'a Path)];

/// `podman run` options for `container` of `pod` exactly as its security settings,
/// environment and volume mounts say. Anything in those the test does not know how to
/// apply fails the test, so a manifest change cannot slip by unapplied.
fn run_options(
    pod: &PodSpec,
    container: &Container,
    image: &str,
    volumes: Volumes,
    node_name: &str,
) -> Vec<String> {
    let mut o: Vec<String> = Vec::new();
    let psc = pod.security_context.clone().unwrap_or_default();
    let sc = container.security_context.clone().unwrap_or_default();
    assert!(
        psc.se_linux_options.is_none()
            && psc.windows_options.is_none()
            && psc.sysctls.is_none()
            && psc.app_armor_profile.is_none()
            && sc.se_linux_options.is_none()
            && sc.windows_options.is_none()
            && sc.app_armor_profile.is_none()
            && sc.proc_mount.is_none(),
        "a security setting this test does not apply: {psc:?} {sc:?}"
    );
    assert!(
        pod.host_ipc != Some(true) && pod.share_process_namespace != Some(true),
        "hostIPC/shareProcessNamespace are not applied by this test"
    );

    // User and groups; runAsNonRoot as the kubelet checks it.
    let uid = sc.run_as_user.or(psc.run_as_user);
    let gid = sc.run_as_group.or(psc.run_as_group);
    let non_root = sc.run_as_non_root.or(psc.run_as_non_root) == Some(true);
    match (uid, gid) {
        (Some(u), Some(g)) => o.push(format!("--user={u}:{g}")),
        (Some(u), None) => o.push(format!("--user={u}")),
        (None, None) => {}
        (None, Some(_)) => panic!("runAsGroup without runAsUser is not applied by this test"),
    }
    if non_root {
        let effective = match uid {
            Some(u) => u.to_string(),
            None => inspect(image, "{{.Config.User}}"),
        };
        let numeric = effective.split(':').next().unwrap_or_default();
        assert!(
            numeric.parse::<u32>().is_ok_and(|u| u != 0),
            "runAsNonRoot: the kubelet refuses user {effective:?}"
        );
    }
    for g in psc
        .fs_group
        .into_iter()
        .chain(psc.supplemental_groups.into_iter().flatten())
    {
        o.push(format!("--group-add={g}"));
    }

    if sc.privileged == Some(true) {
        o.push("--privileged".into());
    }
    if sc.read_only_root_filesystem == Some(true) {
        // Kubernetes adds no writable tmpfs; podman would, on /tmp, /var/tmp and /run.
        o.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
    }
    if sc.allow_privilege_escalation == Some(false) {
        o.push("--security-opt=no-new-privileges".into());
    }
    if let Some(caps) = &sc.capabilities {
        for c in caps.drop.iter().flatten() {
            o.push(format!("--cap-drop={}", c.to_lowercase()));
        }
        for c in caps.add.iter().flatten() {
            o.push(format!("--cap-add={}", c.to_lowercase()));
        }
    }
    match sc
        .seccomp_profile
        .or(psc.seccomp_profile)
        .map(|p| p.type_)
        .as_deref()
    {
        // podman's default profile is the runtime's default.
        None | Some("RuntimeDefault") => {}
        Some("Unconfined") => o.push("--security-opt=seccomp=unconfined".into()),
        Some(other) => panic!("seccomp profile {other} is not applied by this test"),
    }
    if pod.host_pid == Some(true) {
        o.push("--pid=host".into());
    }

    for e in container.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), None) => v.clone(),
            (None, Some(from)) => {
                let field = from
                    .field_ref
                    .as_ref()
                    .map(|f| f.field_path.as_str())
                    .unwrap_or_else(|| panic!("env {} from {from:?}: not applied", e.name));
                assert_eq!(field, "spec.nodeName", "env {} from {field}", e.name);
                node_name.to_string()
            }
            _ => String::new(),
        };
        o.push(format!("--env={}={value}", e.name));
    }

    let declared: BTreeMap<&str, _> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    for m in container.volume_mounts.iter().flatten() {
        assert!(
            m.sub_path.is_none() && m.sub_path_expr.is_none() && m.mount_propagation.is_none(),
            "volume mount {m:?}: not applied by this test"
        );
        assert!(
            declared.contains_key(m.name.as_str()),
            "mount of undeclared volume {}",
            m.name
        );
        let host = volumes
            .iter()
            .find(|(name, _)| *name == m.name)
            .map(|(_, p)| p)
            .unwrap_or_else(|| panic!("the test provides no host directory for volume {}", m.name));
        let ro = if m.read_only == Some(true) { ":ro" } else { "" };
        o.push(format!("--volume={}:{}{ro}", host.display(), m.mount_path));
    }
    if let Some(command) = &container.command {
        o.push(format!(
            "--entrypoint={}",
            serde_json::to_string(command).unwrap()
        ));
    }
    o
}

/// The value of flag `--name=VALUE` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    args.iter()
        .find_map(|a| a.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}=… among {args:?}"))
}

/// `args` with `--name=…` set to `value`.
fn with_flag(args: &[String], name: &str, value: &str) -> Vec<String> {
    let _ = flag(args, name);
    args.iter()
        .map(|a| {
            if a.starts_with(&format!("{name}=")) {
                format!("{name}={value}")
            } else {
                a.clone()
            }
        })
        .collect()
}

/// The directory (mode `0750`, as the kubelet makes `/var/lib/kubelet/pod-resources`)
/// holding the fake kubelet's `kubelet.sock`.
fn pod_resources_dir(node: &KubeNode) -> PathBuf {
    let socket = node.socket();
    assert_eq!(
        socket.file_name().and_then(|n| n.to_str()),
        Some("kubelet.sock")
    );
    let dir = socket.parent().expect("socket directory").to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).expect("chmod");
    dir
}

/// Where the NVIDIA container toolkit puts the host's `libnvidia-ml.so.1` in a
/// Debian-based image (distroless is one): the multiarch library directory, which the
/// dynamic loader searches without an `ld.so.cache`.
fn toolkit_library_path(arch: &str) -> String {
    let gnu = match arch {
        "amd64" => "x86_64",
        "arm64" => "aarch64",
        other => panic!("no multiarch directory known for {other}"),
    };
    format!("/usr/lib/{gnu}-linux-gnu/libnvidia-ml.so.1")
}

/// The exporter image as the DaemonSet runs it, on `node`, as `pod` says (the
/// DaemonSet's pod, possibly with a changed security context). Returns the container
/// and its metrics URL.
fn run_exporter(node: &KubeNode, pod: &PodSpec) -> (Running, String) {
    run_exporter_on(node, pod, host_arch())
}

/// [`run_exporter`] with `arch`'s image and that architecture's fake library.
fn run_exporter_on(node: &KubeNode, pod: &PodSpec, arch: &str) -> (Running, String) {
    let images = images();
    let container = only_container(pod);
    assert_eq!(
        deployed_image(container),
        images.exporter,
        "the DaemonSet runs the image build.sh builds"
    );
    let dir = scratch_dir("images-exporter");
    // The counters ConfigMap, as deploy/base's configMapGenerator makes it.
    let counters = dir.join("counters");
    std::fs::create_dir_all(&counters).expect("mkdir");
    std::fs::copy(
        workspace().join("deploy/base/exporter/counters.csv"),
        counters.join("counters.csv"),
    )
    .expect("copy counters.csv");
    let pod_resources = pod_resources_dir(node);
    let volumes: Volumes = &[("pod-resources", &pod_resources), ("counters", &counters)];
    let image = if arch == host_arch() {
        images.exporter.clone()
    } else {
        for_arch(&images.exporter, arch)
    };
    let library = match arch {
        "arm64" => crate::arm64::arm64_artifact("libnvidia_ml.so"),
        _ if arch == host_arch() => fake_nvml(),
        other => panic!("no fake libnvidia-ml for {other}"),
    };
    let mut options = run_options(pod, container, &image, volumes, NODE);

    // What the cluster provides besides the manifest: the driver library (the NVIDIA
    // container toolkit), here the fake one with its scenario; API access (the service
    // account), here a kubeconfig for the fake API server; a listening address on
    // loopback instead of :9400 (host network).
    let port = free_port();
    options.extend([
        format!(
            "--volume={}:{}:ro",
            library.display(),
            toolkit_library_path(arch)
        ),
        format!(
            "--volume={}:/var/run/gpu-sim/scenario.toml:ro",
            workspace().join(SCENARIO).display()
        ),
        "--env=GPU_SIM_SCENARIO=/var/run/gpu-sim/scenario.toml".into(),
        format!(
            "--volume={}:/var/run/e2e/kubeconfig:ro",
            node.kubeconfig().display()
        ),
        "--env=KUBECONFIG=/var/run/e2e/kubeconfig".into(),
        format!("--env=DCGM_EXPORTER_LISTEN=127.0.0.1:{port}"),
    ]);
    let args = container.args.clone().unwrap_or_default();
    assert!(
        !args.iter().any(|a| a == "-a" || a.starts_with("--address")),
        "the DaemonSet sets the address: DCGM_EXPORTER_LISTEN would not apply"
    );
    let running = Running::start(&image, &options, &args);
    (running, format!("http://127.0.0.1:{port}"))
}

/// `Name:\tvalue` of `/proc/<pid>/status`.
fn proc_status(pid: u32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .trim()
        .to_string()
}

/// The mount options of the process's root filesystem.
fn root_mount_options(pid: u32) -> Vec<String> {
    let mountinfo =
        std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).expect("proc mountinfo");
    mountinfo
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(4) == Some(&"/")).then(|| f[5].split(',').map(str::to_string).collect())
        })
        .next_back()
        .expect("a root mount")
}

/// Assert that the containerised process runs as `pod`/`container` say: effective uid
/// and gid, no capability at all (every set empty, so no ambient or bounding ones
/// either), no-new-privileges, a seccomp filter, a read-only root.
fn assert_confined(pid: u32, pod: &PodSpec, container: &Container) {
    let psc = pod.security_context.clone().unwrap_or_default();
    let sc = container.security_context.clone().unwrap_or_default();
    let ids = |field: &str| -> Vec<String> {
        proc_status(pid, field)
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let uid = sc.run_as_user.or(psc.run_as_user).expect("runAsUser");
    let gid = sc.run_as_group.or(psc.run_as_group).expect("runAsGroup");
    assert_eq!(
        ids("Uid"),
        vec![uid.to_string(); 4],
        "real, effective, saved, fs uid"
    );
    assert_eq!(
        ids("Gid"),
        vec![gid.to_string(); 4],
        "real, effective, saved, fs gid"
    );
    let caps = sc.capabilities.clone().unwrap_or_default();
    if caps.drop.iter().flatten().any(|c| c == "ALL") && caps.add.is_none() {
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(proc_status(pid, set), "0000000000000000", "{set}");
        }
    }
    if sc.allow_privilege_escalation == Some(false) {
        assert_eq!(proc_status(pid, "NoNewPrivs"), "1");
    }
    let seccomp = sc.seccomp_profile.or(psc.seccomp_profile).map(|p| p.type_);
    if seccomp.as_deref() == Some("RuntimeDefault") {
        assert_eq!(proc_status(pid, "Seccomp"), "2", "seccomp filter mode");
    }
    if sc.read_only_root_filesystem == Some(true) {
        let options = root_mount_options(pid);
        assert!(options.iter().any(|o| o == "ro"), "root mount {options:?}");
    }
    // The host's PID namespace exactly when the manifest asks for it.
    let host_pid = std::fs::read_link(format!("/proc/{pid}/ns/pid")).expect("pid namespace")
        == std::fs::read_link("/proc/self/ns/pid").expect("own pid namespace");
    assert_eq!(host_pid, pod.host_pid == Some(true), "host PID namespace");
}

/// The scenario node's GPUs, at the scenario's frozen time.
fn sim() -> gpu_sim::SimNode {
    let s = gpu_sim::Scenario::load(&workspace().join(SCENARIO)).expect("scenario");
    gpu_sim::SimNode::new(&s, std::time::SystemTime::now())
}

/// The exporter's series of GPU 0 name its pod `train-0` (held whole, uuid form) with
/// the allow-listed pod label from the pod watch, and come from the mounted driver.
fn attributed(body: &str) -> bool {
    sample_value(body, "gpu_exporter_kubelet_up") == Some(1.0)
        && sample_value(body, "gpu_exporter_pod_watch_up") == Some(1.0)
        && body.contains("pod=\"train-0\"")
}

// ---------------------------------------------------------------------------------
// The tests

/// The base `image` names in its labels, as the local image of `arch`: by name where
/// that is the image of `arch`, else by the digest the build recorded (a base pulled for
/// several architectures under one name).
fn base_of(image: &str, arch: &str) -> String {
    let name = label(image, "org.opencontainers.image.base.name");
    if inspect(&name, "{{.Architecture}}") == arch {
        return name;
    }
    let digest = label(image, "org.opencontainers.image.base.digest");
    let repository = name.rsplit_once(':').map_or(name.as_str(), |(r, _)| r);
    format!("{repository}@{digest}")
}

#[test]
fn the_build_script_tags_what_deploy_runs_and_adds_only_the_binaries() {
    let images = images();
    let version = env!("CARGO_PKG_VERSION");
    for (image, pod) in [
        (&images.exporter, daemonset_pod()),
        (&images.adapter, deployment_pod()),
    ] {
        // The names and tags deploy/ runs, the tag the crate version (never latest); on
        // this machine the tag is this architecture's image, as a pull gives it.
        assert_eq!(&deployed_image(only_container(&pod)), image);
        assert!(image.ends_with(&format!(":{version}")), "{image}");
        assert_eq!(
            inspect(image, "{{.Id}}"),
            inspect(&for_arch(image, host_arch()), "{{.Id}}"),
            "{image} is not this machine's {} image",
            host_arch()
        );
    }
    for arch in ARCHES {
        let exporter = for_arch(&images.exporter, arch);
        let adapter = for_arch(&images.adapter, arch);
        let base = base_of(&exporter, arch);
        assert_eq!(base_of(&adapter, arch), base, "one base per architecture");
        assert_eq!(inspect(&base, "{{.Architecture}}"), arch, "{base}");
        if arch == host_arch() {
            assert_eq!(base, images.base);
        }
        for (image, binary) in [
            (&exporter, "gpu-exporter"),
            (&adapter, "gpu-metrics-adapter"),
        ] {
            assert_adds_only_its_binary(image, binary, &base, arch, version);
        }
        assert_file_systems(&exporter, &adapter, &base);
    }
}

/// `image` (of `arch`) is labelled, says its version, runs as non-root, and adds one
/// layer to `base` holding only `binary`.
fn assert_adds_only_its_binary(image: &str, binary: &str, base: &str, arch: &str, version: &str) {
    assert_eq!(label(image, "org.opencontainers.image.version"), version);
    assert_eq!(label(image, "org.opencontainers.image.title"), binary);
    assert_eq!(
        label(image, "org.opencontainers.image.licenses"),
        "Apache-2.0"
    );
    assert_eq!(label(image, "architecture"), arch, "{image}");
    assert_eq!(inspect(image, "{{.Architecture}}"), arch, "{image}");
    assert_eq!(inspect(image, "{{.Os}}"), "linux", "{image}");
    let revision = label(image, "org.opencontainers.image.revision");
    let head = run(Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(workspace()));
    assert!(revision.starts_with(head.trim()), "{revision} vs {head}");
    // The binary inside says the same version (another architecture's through emulation).
    if !skip_unless_runnable(arch, &format!("{image} --version")) {
        let said = run(podman().args([
            "run",
            "--rm",
            "--network=none",
            "--ulimit=nofile=1024:1024",
            "--ulimit=nproc=1024:1024",
            image,
            "--version",
        ]));
        assert_eq!(said.trim(), format!("{binary} {version}"));
    }

    // Non-root by default, numerically (the kubelet checks runAsNonRoot on it).
    let user = inspect(image, "{{.Config.User}}");
    let uid: u32 = user
        .split(':')
        .next()
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("{image}: user {user:?} is not numeric"));
    assert_ne!(uid, 0, "{image} runs as root by default");
    assert_eq!(
        inspect(image, "{{json .Config.Entrypoint}}"),
        format!("[\"/usr/bin/{binary}\"]")
    );

    // One layer over the base, holding the binary and nothing else.
    let base_layers: Vec<String> =
        serde_json::from_str(&inspect(base, "{{json .RootFS.Layers}}")).unwrap();
    let layers: Vec<String> =
        serde_json::from_str(&inspect(image, "{{json .RootFS.Layers}}")).unwrap();
    assert_eq!(layers[..layers.len() - 1], base_layers[..], "{image}");
    let diff: Vec<String> = run(podman().args(["image", "diff", image, base]))
        .lines()
        .map(str::to_string)
        .collect();
    let own = format!("/usr/bin/{binary}");
    for line in &diff {
        let (_kind, path) = line.split_once(' ').expect("diff line");
        assert!(
            path == own || own.starts_with(&format!("{path}/")),
            "{image} changes {line} (diff: {diff:?})"
        );
    }
    assert!(diff.iter().any(|l| l == &format!("A {own}")), "{diff:?}");
    let added = size(image) - size(base);
    assert!(
        added <= MAX_ADDED_BYTES,
        "{image} adds {added} bytes to its base, more than 15 MiB"
    );
}

/// What is in the file systems: no shell or package manager unless the base has one,
/// no NVIDIA library in the exporter (the toolkit mounts the host's), CA certificates
/// for the adapter.
fn assert_file_systems(exporter: &str, adapter: &str, base: &str) {
    let base_fs = Mounted::new(base);
    let exporter = Mounted::new(exporter);
    let adapter = Mounted::new(adapter);
    for fs in [&exporter, &adapter] {
        let image = &fs.image;
        for tool in [
            "/bin/sh",
            "/usr/bin/sh",
            "/bin/bash",
            "/bin/dash",
            "/bin/ash",
            "/bin/busybox",
            "/usr/bin/busybox",
            "/usr/bin/apt",
            "/usr/bin/apt-get",
            "/usr/bin/dpkg",
            "/sbin/apk",
            "/usr/bin/rpm",
            "/usr/bin/dnf",
            "/usr/bin/microdnf",
            "/usr/bin/yum",
        ] {
            assert!(
                !fs.exists(tool) || base_fs.exists(tool),
                "{image} has {tool}, its base {base} does not"
            );
        }
        assert!(!fs.exists("/bin/sh"), "{image}: a shell (its base has one)");
    }
    let nvidia = exporter.files_named(|n| n.starts_with("libnvidia-ml"));
    assert!(
        nvidia.is_empty(),
        "NVIDIA's library in the exporter image: {nvidia:?}"
    );
    let bundle = adapter.read("/etc/ssl/certs/ca-certificates.crt");
    assert!(
        bundle.matches("-----BEGIN CERTIFICATE-----").count() >= 1,
        "the adapter image's CA bundle holds no certificate"
    );
}

/// A blob of an OCI image layout, by digest, as JSON.
fn oci_blob(layout: &Path, digest: &str) -> Value {
    let hex = digest
        .strip_prefix("sha256:")
        .unwrap_or_else(|| panic!("digest {digest}"));
    let path = layout.join("blobs/sha256").join(hex);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let sum = run(Command::new("sha256sum").arg(&path));
    assert_eq!(
        sum.split_whitespace().next(),
        Some(hex),
        "{} does not match its digest",
        path.display()
    );
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn each_tag_is_one_index_listing_both_architectures() {
    let images = images();
    let version = env!("CARGO_PKG_VERSION");
    for (image, name) in [
        (&images.exporter, "gpu-exporter"),
        (&images.adapter, "gpu-metrics-adapter"),
    ] {
        // The OCI image layout build.sh wrote: one index, tagged with the version…
        let layout = images.oci_dir.join(name);
        let top: Value = serde_json::from_str(
            &std::fs::read_to_string(layout.join("index.json")).expect("index.json"),
        )
        .expect("index.json");
        let entries = top["manifests"].as_array().expect("manifests");
        assert_eq!(entries.len(), 1, "{top}");
        assert_eq!(
            entries[0]["mediaType"], "application/vnd.oci.image.index.v1+json",
            "{top}"
        );
        assert_eq!(
            entries[0]["annotations"]["org.opencontainers.image.ref.name"], version,
            "{top}"
        );
        // …listing one image per architecture…
        let index = oci_blob(&layout, entries[0]["digest"].as_str().expect("digest"));
        let mut listed = BTreeMap::new();
        for m in index["manifests"].as_array().expect("manifests") {
            assert_eq!(m["platform"]["os"], "linux", "{m}");
            let arch = m["platform"]["architecture"].as_str().expect("arch");
            let manifest = oci_blob(&layout, m["digest"].as_str().expect("digest"));
            let config_digest = manifest["config"]["digest"].as_str().expect("config");
            let config = oci_blob(&layout, config_digest);
            assert_eq!(config["architecture"], arch, "{name} {arch}");
            assert_eq!(config["config"]["Labels"]["architecture"], arch);
            assert_eq!(
                config["config"]["Labels"]["org.opencontainers.image.version"],
                version
            );
            assert!(
                listed
                    .insert(arch.to_string(), config_digest.to_string())
                    .is_none()
            );
        }
        assert_eq!(
            listed.keys().map(String::as_str).collect::<Vec<_>>(),
            ARCHES.to_vec(),
            "{name}'s index"
        );
        // …each exactly the image tagged locally for that architecture.
        for (arch, config_digest) in &listed {
            assert_eq!(
                &format!("sha256:{}", inspect(&for_arch(image, arch), "{{.Id}}")),
                config_digest,
                "{name} {arch}"
            );
        }
    }
}

#[test]
fn the_arm64_exporter_image_attributes_gpus_under_the_daemonsets_security_settings() {
    let images = images();
    if skip_unless_runnable("arm64", "the exporter image") {
        return;
    }
    let node = KubeNode::start(SCENARIO, NODE);
    let pod = daemonset_pod();
    let (mut exporter, base) = run_exporter_on(&node, &pod, "arm64");
    let body = exporter.wait_for_body(
        "GPU series attributed to pod train-0",
        &format!("{base}/metrics"),
        attributed,
    );
    let n = sim();
    let uuid = &n.gpus[0].uuid;
    let power = samples(&body, "DCGM_FI_DEV_POWER_USAGE");
    let gpu0 = power
        .iter()
        .find(|l| l.contains(&format!("UUID=\"{uuid}\"")))
        .unwrap_or_else(|| panic!("no power series of GPU 0 ({uuid}): {power:#?}"));
    for label in ["pod=\"train-0\"", "app=\"trainer\"", "namespace=\"ml\""] {
        assert!(gpu0.contains(label), "{label} missing from {gpu0}");
    }
    // The arm64 binary, on the arm64 library (NVML, not a simulation).
    assert_eq!(
        label(&for_arch(&images.exporter, "arm64"), "architecture"),
        "arm64"
    );
    let build = samples(&body, "gpu_exporter_build_info");
    assert!(
        build.iter().any(|l| l.contains("source=\"nvml")),
        "not read through NVML: {build:?}"
    );
    let container = only_container(&pod);
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        let path = get.path.as_deref().unwrap_or("/");
        let (status, text) = try_get(&format!("{base}{path}"), &[]).expect("probe");
        assert_eq!(status, 200, "probe {path}: {text}");
    }
    // The emulator is the process the kernel runs, with the settings in force.
    let pid = exporter.host_pid();
    assert_confined(pid, &pod, container);
}

#[test]
fn the_exporter_image_attributes_gpus_under_the_daemonsets_security_settings() {
    let node = KubeNode::start(SCENARIO, NODE);
    let pod = daemonset_pod();
    let (mut exporter, base) = run_exporter(&node, &pod);
    let body = exporter.wait_for_body(
        "GPU series attributed to pod train-0",
        &format!("{base}/metrics"),
        attributed,
    );

    // Series of GPU 0 (the fake driver's, mounted where the toolkit puts it) carry the
    // pod holding it and its `app` label from the pod watch.
    let n = sim();
    let uuid = &n.gpus[0].uuid;
    let power = samples(&body, "DCGM_FI_DEV_POWER_USAGE");
    let gpu0 = power
        .iter()
        .find(|l| l.contains(&format!("UUID=\"{uuid}\"")))
        .unwrap_or_else(|| panic!("no power series of GPU 0 ({uuid}): {power:#?}"));
    for label in [
        "app=\"trainer\"",
        "container=\"trainer\"",
        "namespace=\"ml\"",
        "pod=\"train-0\"",
        &format!("Hostname=\"{NODE}\""),
    ] {
        assert!(gpu0.contains(label), "{label} missing from {gpu0}");
    }
    let build = samples(&body, "gpu_exporter_build_info");
    assert!(
        build.iter().any(|l| l.contains("source=\"nvml")),
        "not read through NVML: {build:?}"
    );

    // The DaemonSet's probes pass.
    let container = only_container(&pod);
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_ne!(get.scheme.as_deref(), Some("HTTPS"));
        let path = get.path.as_deref().unwrap_or("/");
        let (status, text) = try_get(&format!("{base}{path}"), &[]).expect("probe");
        assert_eq!(status, 200, "probe {path}: {text}");
    }

    // And the settings are in force on the running process.
    let pid = exporter.host_pid();
    assert_confined(pid, &pod, container);
}

#[test]
fn without_uid_0_the_exporter_image_cannot_reach_the_kubelet_socket() {
    // The DaemonSet's pod with the one change its comment says fails: a non-root user.
    let node = KubeNode::start(SCENARIO, NODE);
    let mut pod = daemonset_pod();
    let psc = pod.security_context.get_or_insert_default();
    assert_eq!(psc.run_as_user, Some(0), "the DaemonSet runs as uid 0");
    psc.run_as_user = Some(65534);
    psc.run_as_group = Some(65534);
    psc.run_as_non_root = Some(true);
    let (mut exporter, base) = run_exporter(&node, &pod);
    let body = exporter.wait_for_body("a failed kubelet list", &format!("{base}/metrics"), |b| {
        sample_value(b, "gpu_exporter_kubelet_list_failures_total").is_some_and(|n| n >= 1.0)
            && sample_value(b, "gpu_exporter_samples_total").is_some_and(|n| n >= 1.0)
    });
    assert_eq!(sample_value(&body, "gpu_exporter_kubelet_up"), Some(0.0));
    assert!(!body.contains("pod=\""), "pod labels without the kubelet");
    // GPU series still flow, unattributed.
    assert!(!samples(&body, "DCGM_FI_DEV_POWER_USAGE").is_empty());
    let pid = exporter.host_pid();
    assert_confined(pid, &pod, only_container(&pod));
    assert_eq!(
        node.kubelet().calls(),
        0,
        "the kubelet answered a non-root caller"
    );
}

#[test]
fn the_adapter_image_answers_the_custom_metrics_api_over_https() {
    let node = KubeNode::start(SCENARIO, NODE);
    let (mut exporter, exporter_base) = run_exporter(&node, &daemonset_pod());
    let exporter_body = exporter.wait_for_body(
        "attribution",
        &format!("{exporter_base}/metrics"),
        attributed,
    );
    let exporter_port: u16 = exporter_base
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("port");

    let images = images();
    let pod = deployment_pod();
    let container = only_container(&pod);
    assert_eq!(deployed_image(container), images.adapter);
    let args = container.args.clone().unwrap_or_default();

    // The exporter's Service's EndpointSlice, as the EndpointSlice controller writes it,
    // for the Service and port name the Deployment's args name.
    let (namespace, service) = flag(&args, "--exporter-service")
        .split_once('/')
        .expect("--exporter-service=NAMESPACE/NAME");
    let port_name = flag(&args, "--exporter-port-name");
    node.api().apply_endpoint_slice(EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("{service}-e2e")),
            namespace: Some(namespace.into()),
            labels: Some([("kubernetes.io/service-name".into(), service.into())].into()),
            ..ObjectMeta::default()
        },
        endpoints: vec![Endpoint {
            addresses: vec!["127.0.0.1".into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                serving: Some(true),
                terminating: Some(false),
            }),
            ..Endpoint::default()
        }],
        ports: Some(vec![EndpointPort {
            name: Some(port_name.into()),
            port: Some(i32::from(exporter_port)),
            protocol: Some("TCP".into()),
            ..EndpointPort::default()
        }]),
    });

    // The cluster's side of delegated authentication: the aggregator's front-proxy CA
    // in kube-system/extension-apiserver-authentication, and a policy allowing the HPA
    // controller only.
    let serving_ca = Ca::new("serving-ca");
    let front_proxy_ca = Ca::new("front-proxy-ca");
    let aggregator = front_proxy_ca.client("front-proxy-client", &[]);
    node.api().apply_config_map(ConfigMap {
        metadata: ObjectMeta {
            name: Some("extension-apiserver-authentication".into()),
            namespace: Some("kube-system".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            [
                ("requestheader-client-ca-file", front_proxy_ca.pem()),
                (
                    "requestheader-allowed-names",
                    r#"["front-proxy-client"]"#.into(),
                ),
                (
                    "requestheader-username-headers",
                    r#"["X-Remote-User"]"#.into(),
                ),
                (
                    "requestheader-group-headers",
                    r#"["X-Remote-Group"]"#.into(),
                ),
                (
                    "requestheader-extra-headers-prefix",
                    r#"["X-Remote-Extra-"]"#.into(),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ),
        ..ConfigMap::default()
    });
    node.api()
        .set_authorizer(|spec: &SubjectAccessReviewSpec| spec.user.as_deref() == Some(HPA_USER));

    // The serving certificate as the kubelet mounts the Secret: files of the volume's
    // defaultMode, group fsGroup.
    let cert_dir = scratch_dir("images-serving-cert");
    serving_ca
        .server(&["127.0.0.1", "localhost"])
        .write(&cert_dir, "tls");
    // cert-manager's Secret also carries the issuing CA, which the manifests trust for
    // KEDA's client certificates (--grpc-client-ca-file).
    std::fs::write(cert_dir.join("ca.crt"), serving_ca.pem()).expect("ca.crt");
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "serving-cert")
        .and_then(|v| v.secret.as_ref())
        .expect("the serving-cert Secret volume");
    let mode = volume.default_mode.expect("defaultMode") as u32;
    let fs_group = pod
        .security_context
        .as_ref()
        .and_then(|s| s.fs_group)
        .map(|g| g as u32);
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        let path = cert_dir.join(f);
        std::os::unix::fs::chown(&path, Some(0), fs_group).expect("chown");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let volumes: Volumes = &[("serving-cert", &cert_dir)];
    let mut options = run_options(&pod, container, &images.adapter, volumes, NODE);
    options.extend([
        format!(
            "--volume={}:/var/run/e2e/kubeconfig:ro",
            node.kubeconfig().display()
        ),
        "--env=KUBECONFIG=/var/run/e2e/kubeconfig".into(),
    ]);
    // Free loopback ports instead of 6443 and 9090 (host network).
    let (https_port, grpc_port) = (free_port(), free_port());
    let mut args = with_flag(&args, "--secure-port", &https_port.to_string());
    args = with_flag(&args, "--grpc-port", &grpc_port.to_string());
    args.push("--bind-address=127.0.0.1".into());
    let mut adapter = Running::start(&images.adapter, &options, &args);

    let base = format!("https://127.0.0.1:{https_port}");
    let client = HttpsClient::new(&serving_ca.pem(), Some(&aggregator));
    let anonymous = HttpsClient::new(&serving_ca.pem(), None);
    let path = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/ml/pods/*/gpu_utilization";
    let headers = [
        ("X-Remote-User", HPA_USER),
        ("X-Remote-Group", "system:serviceaccounts"),
    ];
    let answer = wait_for("the custom metrics answer", Duration::from_secs(60), || {
        adapter.assert_running();
        match client.get(&format!("{base}{path}"), &headers) {
            Ok((200, body)) => Some(body),
            _ => None,
        }
    });
    let v: Value = serde_json::from_str(&answer).expect("JSON");
    assert_eq!(v["kind"], "MetricValueList", "{v}");
    let items: BTreeMap<String, i64> = e2e_tests::metrics_api::items_milli(&v)
        .into_iter()
        .collect();
    // The pods of namespace ml, each its GPU's utilisation as the exporter reports it.
    let expected: BTreeMap<String, i64> = ["train-0", "idx-0"]
        .iter()
        .map(|pod| {
            let util = samples(&exporter_body, "DCGM_FI_DEV_GPU_UTIL")
                .into_iter()
                .find(|l| l.contains(&format!("pod=\"{pod}\"")))
                .and_then(e2e_tests::line_value)
                .unwrap_or_else(|| panic!("no utilisation of {pod}"));
            (pod.to_string(), (util * 1000.0) as i64)
        })
        .collect();
    assert_eq!(items, expected, "{v}");
    assert!(
        node.api()
            .access_reviews()
            .iter()
            .any(|r| r.user.as_deref() == Some(HPA_USER)),
        "the adapter asked the API server to authorise the HPA controller"
    );
    // Without the front proxy's certificate the request is anonymous, and not allowed.
    let (status, body) = anonymous
        .get(&format!("{base}{path}"), &headers)
        .expect("anonymous answer");
    assert_eq!(status, 403, "{body}");

    // The Deployment's probes pass, over the scheme they name.
    for probe in [&container.liveness_probe, &container.readiness_probe] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("an HTTP probe");
        assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
        let path = get.path.as_deref().unwrap_or("/");
        let (status, text) = anonymous
            .get(&format!("{base}{path}"), &[])
            .expect("probe answer");
        assert_eq!(status, 200, "probe {path}: {text}");
    }
    let pid = adapter.host_pid();
    assert_confined(pid, &pod, container);
}

// ---------------------------------------------------------------------------------
// Image file systems

/// An image's file system, mounted read-only by podman (root) until drop.
struct Mounted {
    image: String,
    root: PathBuf,
}

impl Mounted {
    fn new(image: &str) -> Mounted {
        let root = PathBuf::from(run(podman().args(["image", "mount", image])).trim());
        Mounted {
            image: image.to_string(),
            root,
        }
    }

    /// `path` inside the image, symbolic links resolved inside it (an absolute link
    /// target is relative to the image's root, not the host's).
    fn resolve(&self, path: &str) -> Option<PathBuf> {
        let mut inside = PathBuf::from("/");
        let mut pending: Vec<String> = Path::new(path)
            .components()
            .rev()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                Component::ParentDir => Some("..".into()),
                _ => None,
            })
            .collect();
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            if part == ".." {
                inside.pop();
                continue;
            }
            let candidate = inside.join(&part);
            let on_host = self.root.join(candidate.strip_prefix("/").unwrap());
            let meta = std::fs::symlink_metadata(&on_host).ok()?;
            if meta.file_type().is_symlink() {
                hops += 1;
                assert!(hops < 40, "symlink loop at {path} in {}", self.image);
                let target = std::fs::read_link(&on_host).ok()?;
                if target.is_absolute() {
                    inside = PathBuf::from("/");
                }
                pending.extend(target.components().rev().filter_map(|c| match c {
                    Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
                    Component::ParentDir => Some("..".into()),
                    _ => None,
                }));
            } else {
                inside = candidate;
            }
        }
        Some(self.root.join(inside.strip_prefix("/").unwrap()))
    }

    fn exists(&self, path: &str) -> bool {
        self.resolve(path).is_some()
    }

    fn read(&self, path: &str) -> String {
        let p = self
            .resolve(path)
            .unwrap_or_else(|| panic!("{} has no {path}", self.image));
        std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {path}: {e}", self.image))
    }

    /// Every file or link whose name `pred` accepts, as paths inside the image.
    fn files_named(&self, pred: impl Fn(&str) -> bool) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let mut dirs = vec![self.root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                let file_type = entry.file_type().expect("file type");
                if file_type.is_dir() {
                    dirs.push(path);
                } else if pred(&entry.file_name().to_string_lossy()) {
                    found.insert(format!(
                        "/{}",
                        path.strip_prefix(&self.root).unwrap().display()
                    ));
                }
            }
        }
        found
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = podman().args(["image", "unmount", &self.image]).output();
    }
}
