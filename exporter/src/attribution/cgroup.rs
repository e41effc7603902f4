//! Which pod and container a process runs in, from `/proc/<pid>/cgroup`.
//!
//! NVML names the processes on a GPU by PID only. With `hostPID`, the exporter can read
//! each PID's cgroup path, which the kubelet and the container runtime build from the
//! pod UID and the container ID; those two identify the pod (through the pod watch) and
//! the container (through the pod's container statuses). This is how a shared GPU's
//! usage is split per pod instead of being copied onto every pod.
//!
//! Supported, for cgroup v1 (any hierarchy line; the first one naming a pod container
//! wins) and v2 (the `0::` line):
//!
//! - systemd cgroup driver: `…/kubepods[-<qos>]-pod<uid with _>.slice/<runtime>-<id>.scope`
//!   with runtime prefix `cri-containerd-`, `crio-` or `docker-` (any slice prefix that
//!   contains `kubepods`, so kind's `kubelet-kubepods-…` slices match too);
//! - cgroupfs driver: `…/pod<uid>/<id>`, optionally `crio-<id>` or `docker-<id>`
//!   (`/kubepods/pod<uid>/…` for Guaranteed, `/kubepods/{burstable,besteffort}/pod<uid>/…`);
//! - the systemd-driver form some nested setups (kind, containerd under a
//!   `containerd.service` slice) write as one component:
//!   `…/kubepods-<qos>-pod<uid>.slice:<runtime>:<id>`;
//! - anything below the container's cgroup (e.g. `…/cri-containerd-<id>.scope/init`,
//!   Docker-in-Docker children): the container is the first one below the pod;
//! - paths relative to a private cgroup namespace (`0::/../../kubepods-…`): the pod
//!   component is searched anywhere in the path.
//!
//! The pod UID is returned in the API's dashed lower-case form. A static pod's cgroup
//! carries the kubelet's 32-hex config hash instead of a UUID; it is returned as is
//! (that hash is the mirror pod's `kubernetes.io/config.hash` annotation, not its UID).
//! The container ID is the runtime's 64-hex ID without a `containerd://`-style prefix.
//! Processes outside pods (system services, user sessions, the root cgroup), processes
//! in a pod's cgroup but not in a container (CRI-O's `crio-conmon-<id>.scope`, the pod
//! cgroup itself) and malformed contents give `None`.

use std::path::Path;

/// The pod and container a process belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodContainer {
    /// The pod's UID, dashed lower-case (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`), or a
    /// static pod's 32-hex config hash.
    pub pod_uid: String,
    /// The container runtime's 64-hex container ID, lower case, without runtime prefix.
    pub container_id: String,
}

/// Reads `<proc_root>/<pid>/cgroup` and finds the process's pod container.
///
/// A process that has exited gives the read error (`NotFound`, or `ESRCH` if it exits
/// mid-read); the caller decides whether that matters.
pub fn read_pod_container(proc_root: &Path, pid: u32) -> std::io::Result<Option<PodContainer>> {
    let contents = std::fs::read_to_string(proc_root.join(pid.to_string()).join("cgroup"))?;
    Ok(parse_proc_cgroup(&contents))
}

/// Finds the pod container in the contents of a `/proc/<pid>/cgroup` file: lines of
/// `hierarchy-ID:controllers:path`, the first line whose path names a pod container.
pub fn parse_proc_cgroup(contents: &str) -> Option<PodContainer> {
    contents.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let hierarchy = fields.next()?;
        let _controllers = fields.next()?;
        let path = fields.next()?;
        if hierarchy.is_empty() || !hierarchy.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        parse_cgroup_path(path)
    })
}

/// Finds the pod container in one cgroup path (the third field of a
/// `/proc/<pid>/cgroup` line).
pub fn parse_cgroup_path(path: &str) -> Option<PodContainer> {
    if !path.starts_with('/') {
        return None;
    }
    let components: Vec<&str> = path.split('/').collect();
    components
        .iter()
        .enumerate()
        .find_map(|(position, component)| {
            // `kubepods-…-pod<uid>.slice:<runtime>:<id>` in one component.
            if let Some((slice, rest)) = component.split_once(':') {
                let pod_uid = systemd_pod_uid(slice)?;
                let (runtime, id) = rest.split_once(':')?;
                if runtime.is_empty() {
                    return None;
                }
                let container_id = container_id(id)?;
                return Some(PodContainer {
                    pod_uid,
                    container_id,
                });
            }
            let pod_uid = systemd_pod_uid(component).or_else(|| cgroupfs_pod_uid(component))?;
            let container = components.get(position + 1)?;
            let container_id = runtime_container_id(container)?;
            Some(PodContainer {
                pod_uid,
                container_id,
            })
        })
}

/// The pod UID in a systemd pod slice name: `<…kubepods…>-pod<uid with _>.slice`.
fn systemd_pod_uid(component: &str) -> Option<String> {
    let stem = component.strip_suffix(".slice")?;
    let (parent, uid) = stem.rsplit_once("-pod")?;
    if !parent.contains("kubepods") {
        return None;
    }
    pod_uid(uid, '_')
}

/// The pod UID in a cgroupfs pod directory name: `pod<uid>`.
fn cgroupfs_pod_uid(component: &str) -> Option<String> {
    pod_uid(component.strip_prefix("pod")?, '-')
}

/// A pod UID whose groups are separated by `separator`, in dashed lower-case form; or a
/// static pod's 32-hex config hash, as is.
fn pod_uid(text: &str, separator: char) -> Option<String> {
    if text.len() == 32 && text.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Some(text.to_ascii_lowercase());
    }
    let groups: Vec<&str> = text.split(separator).collect();
    let well_formed = groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.bytes().all(|c| c.is_ascii_hexdigit()));
    well_formed.then(|| groups.join("-").to_ascii_lowercase())
}

/// The container ID in a container cgroup name: `cri-containerd-<id>.scope`,
/// `crio-<id>.scope`, `docker-<id>.scope` (systemd driver), `<id>`, `crio-<id>` or
/// `docker-<id>` (cgroupfs driver).
fn runtime_container_id(component: &str) -> Option<String> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    let id = ["cri-containerd-", "crio-", "docker-"]
        .iter()
        .find_map(|prefix| name.strip_prefix(prefix))
        .unwrap_or(name);
    container_id(id)
}

/// A 64-hex container ID, lower case.
fn container_id(text: &str) -> Option<String> {
    (text.len() == 64 && text.bytes().all(|c| c.is_ascii_hexdigit()))
        .then(|| text.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UID: &str = "1d2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
    const UID_UNDERSCORED: &str = "1d2b3c4d_5e6f_4a7b_8c9d_0e1f2a3b4c5d";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const STATIC_HASH: &str = "6f4a1c6e1c1d8f1c1b2e3f4a5b6c7d8e";

    /// Every layout and QoS class the simulated node writes (kube-sim, shared with the
    /// end-to-end tests) reads back as its pod and container, and a system process as
    /// none: the parser and the fake agree on every form.
    #[test]
    fn every_layout_the_simulated_node_writes_is_read_back() {
        use kube_sim::procfs::{CgroupLayout, Qos, cgroup_file, non_pod_cgroup};
        for layout in CgroupLayout::ALL {
            for qos in Qos::ALL {
                let file = cgroup_file(layout, qos, UID, ID);
                assert_eq!(
                    parse_proc_cgroup(&file),
                    expected(),
                    "{layout:?} {qos:?}:\n{file}"
                );
            }
        }
        assert_eq!(parse_proc_cgroup(&non_pod_cgroup()), None);
    }

    fn expected() -> Option<PodContainer> {
        Some(PodContainer {
            pod_uid: UID.into(),
            container_id: ID.into(),
        })
    }

    /// Container cgroup paths for each driver × runtime × QoS class.
    fn pod_paths() -> Vec<String> {
        let mut paths = Vec::new();
        for (qos_dir, qos_slice) in [
            ("", ""),
            ("/burstable", "-burstable"),
            ("/besteffort", "-besteffort"),
        ] {
            for runtime in ["cri-containerd", "crio", "docker"] {
                let parent_slice = if qos_slice.is_empty() {
                    String::new()
                } else {
                    format!("/kubepods{qos_slice}.slice")
                };
                paths.push(format!(
                    "/kubepods.slice{parent_slice}/kubepods{qos_slice}-pod{UID_UNDERSCORED}.slice/{runtime}-{ID}.scope"
                ));
            }
            paths.push(format!("/kubepods{qos_dir}/pod{UID}/{ID}"));
            paths.push(format!("/kubepods{qos_dir}/pod{UID}/crio-{ID}"));
            paths.push(format!("/kubepods{qos_dir}/pod{UID}/docker-{ID}"));
        }
        paths
    }

    #[test]
    fn every_driver_runtime_and_qos_class_in_cgroup_v2() {
        for path in pod_paths() {
            assert_eq!(
                parse_proc_cgroup(&format!("0::{path}\n")),
                expected(),
                "{path}"
            );
        }
    }

    #[test]
    fn every_driver_runtime_and_qos_class_in_cgroup_v1() {
        for path in pod_paths() {
            let contents = format!(
                "12:hugetlb:{path}\n11:memory:{path}\n10:devices:{path}\n\
                 9:cpu,cpuacct:{path}\n1:name=systemd:{path}\n0::/\n"
            );
            assert_eq!(parse_proc_cgroup(&contents), expected(), "{path}");
        }
    }

    #[test]
    fn realistic_files_and_unusual_layouts() {
        let rows: Vec<(String, Option<PodContainer>)> = vec![
            // cgroup v1 where only some hierarchies carry the pod (rdma, misc at root).
            (
                format!(
                    "13:rdma:/\n12:misc:/\n11:pids:/kubepods/burstable/pod{UID}/{ID}\n\
                     1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n"
                ),
                expected(),
            ),
            // Hybrid: v1 controllers plus the v2 unified line.
            (
                format!(
                    "5:memory:/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n\
                     0::/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
                ),
                expected(),
            ),
            // Nested below the container's scope.
            (
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope/init\n"
                ),
                expected(),
            ),
            // Docker-in-Docker: the pod's container, not the inner one.
            (
                format!(
                    "0::/kubepods/burstable/pod{UID}/{ID}/docker/{}\n",
                    "f".repeat(64)
                ),
                expected(),
            ),
            // containerd under containerd.service, one component with colons (kind).
            (
                format!(
                    "0::/system.slice/containerd.service/kubepods-burstable-pod{UID_UNDERSCORED}.slice:cri-containerd:{ID}\n"
                ),
                expected(),
            ),
            // kind's kubelet cgroup root with the systemd driver.
            (
                format!(
                    "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
                ),
                expected(),
            ),
            // Seen from a private cgroup namespace.
            (
                format!(
                    "0::/../../kubepods-besteffort-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
                ),
                expected(),
            ),
            (format!("0::/../../pod{UID}/{ID}\n"), expected()),
            // Upper-case hex is normalised.
            (
                format!(
                    "0::/kubepods/pod{}/{}\n",
                    UID.to_uppercase(),
                    ID.to_uppercase()
                ),
                expected(),
            ),
            // No trailing newline.
            (format!("0::/kubepods/pod{UID}/{ID}"), expected()),
            // Static pod: the config hash as is.
            (
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_HASH}.slice/cri-containerd-{ID}.scope\n"
                ),
                Some(PodContainer {
                    pod_uid: STATIC_HASH.into(),
                    container_id: ID.into(),
                }),
            ),
            (
                format!("0::/kubepods/besteffort/pod{STATIC_HASH}/{ID}\n"),
                Some(PodContainer {
                    pod_uid: STATIC_HASH.into(),
                    container_id: ID.into(),
                }),
            ),
        ];
        for (contents, expected) in rows {
            assert_eq!(parse_proc_cgroup(&contents), expected, "{contents}");
        }
    }

    #[test]
    fn non_pod_and_malformed_contents_give_none() {
        let rows: Vec<String> = vec![
            String::new(),
            "\n".into(),
            "0::/\n".into(),
            "0::/init.scope\n".into(),
            "0::/system.slice/containerd.service\n".into(),
            "0::/system.slice/kubelet.service\n".into(),
            "0::/user.slice/user-1000.slice/session-3.scope\n".into(),
            "12:memory:/user.slice\n1:name=systemd:/user.slice/user-0.slice/session-1.scope\n"
                .into(),
            format!("0::/system.slice/docker-{ID}.scope\n"),
            "0::/kubepods.slice\n".into(),
            "0::/kubepods.slice/kubepods-burstable.slice\n".into(),
            // The pod cgroup itself, no container.
            format!("0::/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice\n"),
            format!("0::/kubepods/burstable/pod{UID}\n"),
            format!("0::/kubepods/burstable/pod{UID}/\n"),
            // CRI-O's monitor process is in the pod, not in the container.
            format!(
                "0::/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice/crio-conmon-{ID}.scope\n"
            ),
            // Unknown runtime prefix.
            format!("0::/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice/podman-{ID}.scope\n"),
            // Malformed pod UIDs and container IDs.
            format!("0::/kubepods/pod{}/{ID}\n", &UID[1..]),
            format!("0::/kubepods/pod{}/{ID}\n", UID.replace('d', "g")),
            format!("0::/kubepods/pod{UID_UNDERSCORED}/{ID}\n"),
            format!("0::/kubepods.slice/kubepods-pod{UID}.slice/cri-containerd-{ID}.scope\n"),
            format!("0::/kubepods/pod{UID}x/{ID}\n"),
            format!("0::/kubepods/pod{UID}/{}\n", &ID[1..]),
            format!("0::/kubepods/pod{UID}/{ID}0\n"),
            format!("0::/kubepods/pod{UID}/{}\n", ID.replace('a', "x")),
            format!("0::/kubepods/pod{UID}/cri-containerd-{ID}.scope.extra\n"),
            // A `-pod` slice that is not under kubepods.
            format!("0::/system.slice/foo-pod{UID_UNDERSCORED}.slice/docker-{ID}.scope\n"),
            // Colon form without a runtime or with a bad ID.
            format!("0::/system.slice/kubepods-pod{UID_UNDERSCORED}.slice::{ID}\n"),
            format!("0::/system.slice/kubepods-pod{UID_UNDERSCORED}.slice:cri-containerd\n"),
            // Not `hierarchy:controllers:path` lines.
            format!("/kubepods/pod{UID}/{ID}\n"),
            format!("0:/kubepods/pod{UID}/{ID}\n"),
            format!("x::/kubepods/pod{UID}/{ID}\n"),
            format!("::/kubepods/pod{UID}/{ID}\n"),
            format!("0::kubepods/pod{UID}/{ID}\n"),
        ];
        for contents in rows {
            assert_eq!(parse_proc_cgroup(&contents), None, "{contents}");
        }
    }

    /// A fake `/proc` under the system temporary directory, removed when dropped.
    struct FakeProc(std::path::PathBuf);

    impl FakeProc {
        fn new(name: &str) -> Self {
            let root = std::env::temp_dir()
                .join(format!("gpu-exporter-cgroup-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).expect("create fake proc root");
            Self(root)
        }

        fn add(&self, pid: u32, cgroup: &str) {
            let dir = self.0.join(pid.to_string());
            std::fs::create_dir_all(&dir).expect("create fake pid dir");
            std::fs::write(dir.join("cgroup"), cgroup).expect("write fake cgroup");
        }
    }

    impl Drop for FakeProc {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn read_pod_container_reads_a_proc_tree() {
        let proc_root = FakeProc::new("read");
        proc_root.add(
            4242,
            &format!(
                "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
            ),
        );
        proc_root.add(1, "0::/init.scope\n");
        assert_eq!(
            read_pod_container(&proc_root.0, 4242).expect("read pod process"),
            expected()
        );
        assert_eq!(
            read_pod_container(&proc_root.0, 1).expect("read host process"),
            None
        );
        let gone = read_pod_container(&proc_root.0, 7).expect_err("no such process");
        assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn read_pod_container_reads_this_process() {
        // The real /proc, for this process and for a child in the same cgroup. The oracle
        // is the raw text: outside a pod (no `kubepods` in it) the answer is `None`; in a
        // pod, the UID (in either spelling) and the container ID are in the text.
        let proc_root = Path::new("/proc");
        let own_pid = std::process::id();
        let raw = std::fs::read_to_string(format!("/proc/{own_pid}/cgroup")).expect("own cgroup");
        let own = read_pod_container(proc_root, own_pid).expect("read own cgroup");
        match &own {
            None => assert!(
                !raw.contains("kubepods"),
                "a pod cgroup was not recognised: {raw}"
            ),
            Some(found) => {
                let hex_uid = found.pod_uid.replace('-', "");
                assert!(
                    raw.contains(&found.pod_uid)
                        || raw.contains(&found.pod_uid.replace('-', "_"))
                        || raw.contains(&hex_uid),
                    "{found:?} not in {raw}"
                );
                assert!(raw.contains(&found.container_id), "{found:?} not in {raw}");
            }
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn a child");
        let of_child = read_pod_container(proc_root, child.id());
        child.kill().expect("kill child");
        child.wait().expect("reap child");
        assert_eq!(of_child.expect("read child cgroup"), own);
        // The PID is part of the path: a reaped child's entry is gone.
        let gone = read_pod_container(proc_root, child.id()).expect_err("reaped child");
        assert_eq!(gone.kind(), std::io::ErrorKind::NotFound);
    }

    fn cgroup_soup() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("0::".to_string()),
            Just("1:name=systemd:".to_string()),
            Just("\n".to_string()),
            Just("/".to_string()),
            Just(":".to_string()),
            Just("kubepods".to_string()),
            Just("kubepods.slice".to_string()),
            Just("-pod".to_string()),
            Just("pod".to_string()),
            Just(".slice".to_string()),
            Just(".scope".to_string()),
            Just("cri-containerd-".to_string()),
            Just("crio-".to_string()),
            Just(UID.to_string()),
            Just(UID_UNDERSCORED.to_string()),
            Just(ID.to_string()),
            "[0-9a-f_-]{0,70}",
            "\\PC{0,3}",
        ];
        prop::collection::vec(piece, 0..12).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #[test]
        fn parsing_never_panics_on_arbitrary_text(contents in any::<String>()) {
            let _ = parse_proc_cgroup(&contents);
            let _ = parse_cgroup_path(&contents);
        }

        #[test]
        fn parsing_never_panics_on_cgroup_pieces(contents in cgroup_soup()) {
            if let Some(found) = parse_proc_cgroup(&contents) {
                prop_assert!(found.container_id.len() == 64);
                prop_assert!(found.pod_uid.len() == 36 || found.pod_uid.len() == 32);
            }
        }

        #[test]
        fn generated_pod_paths_give_their_uid_and_id(
            uid in any::<[u8; 16]>(),
            id in any::<[u8; 32]>(),
            systemd in any::<bool>(),
            qos in prop_oneof![Just(""), Just("burstable"), Just("besteffort")],
            runtime in prop_oneof![Just("cri-containerd-"), Just("crio-"), Just("docker-"), Just("")],
        ) {
            let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
            let uid_hex = hex(&uid);
            let dashed = format!(
                "{}-{}-{}-{}-{}",
                &uid_hex[..8], &uid_hex[8..12], &uid_hex[12..16], &uid_hex[16..20], &uid_hex[20..]
            );
            let id = hex(&id);
            let path = if systemd {
                let runtime = if runtime.is_empty() { "cri-containerd-" } else { runtime };
                let qos_slice = if qos.is_empty() { String::new() } else { format!("-{qos}") };
                let parent = if qos.is_empty() { String::new() } else { format!("/kubepods{qos_slice}.slice") };
                format!(
                    "/kubepods.slice{parent}/kubepods{qos_slice}-pod{}.slice/{runtime}{id}.scope",
                    dashed.replace('-', "_")
                )
            } else {
                let qos_dir = if qos.is_empty() { String::new() } else { format!("/{qos}") };
                format!("/kubepods{qos_dir}/pod{dashed}/{runtime}{id}")
            };
            prop_assert_eq!(
                parse_proc_cgroup(&format!("0::{path}\n")),
                Some(PodContainer { pod_uid: dashed, container_id: id }),
                "{}", path
            );
        }
    }
}
