//! A fake `/proc` tree holding `/proc/<pid>/cgroup` files.
//!
//! NVML names a GPU's processes by PID only; the exporter finds each process's pod and
//! container from the cgroup path the kubelet and the container runtime gave it. That
//! path depends on the cgroup version, the kubelet's cgroup driver, the runtime and the
//! pod's QoS class, so [`cgroup_file`] writes each combination the way real nodes do,
//! for tests to check the exporter against all of them.

use std::io;
use std::path::{Path, PathBuf};

/// How a node lays out container cgroups: cgroup version, kubelet cgroup driver and
/// container runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CgroupLayout {
    /// cgroup v2, systemd driver, containerd: `…/cri-containerd-<id>.scope`.
    V2SystemdContainerd,
    /// cgroup v2, systemd driver, CRI-O: `…/crio-<id>.scope`.
    V2SystemdCrio,
    /// cgroup v2, systemd driver, Docker (cri-dockerd): `…/docker-<id>.scope`.
    V2SystemdDocker,
    /// cgroup v2, cgroupfs driver (containerd): `/kubepods/<qos>/pod<uid>/<id>`.
    V2Cgroupfs,
    /// cgroup v1, systemd driver, containerd: one line per controller hierarchy.
    V1Systemd,
    /// cgroup v1, cgroupfs driver (containerd): one line per controller hierarchy.
    V1Cgroupfs,
}

impl CgroupLayout {
    /// Every layout, for tests that cover them all.
    pub const ALL: [CgroupLayout; 6] = [
        CgroupLayout::V2SystemdContainerd,
        CgroupLayout::V2SystemdCrio,
        CgroupLayout::V2SystemdDocker,
        CgroupLayout::V2Cgroupfs,
        CgroupLayout::V1Systemd,
        CgroupLayout::V1Cgroupfs,
    ];

    fn systemd_scope_prefix(self) -> Option<&'static str> {
        match self {
            CgroupLayout::V2SystemdContainerd | CgroupLayout::V1Systemd => Some("cri-containerd-"),
            CgroupLayout::V2SystemdCrio => Some("crio-"),
            CgroupLayout::V2SystemdDocker => Some("docker-"),
            CgroupLayout::V2Cgroupfs | CgroupLayout::V1Cgroupfs => None,
        }
    }
}

/// A pod's QoS class, which decides the cgroup level the pod sits under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Qos {
    /// Directly under `kubepods`.
    Guaranteed,
    /// Under `kubepods-burstable.slice` / `kubepods/burstable`.
    Burstable,
    /// Under `kubepods-besteffort.slice` / `kubepods/besteffort`.
    BestEffort,
}

impl Qos {
    /// Every class, for tests that cover them all.
    pub const ALL: [Qos; 3] = [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort];

    fn name(self) -> Option<&'static str> {
        match self {
            Qos::Guaranteed => None,
            Qos::Burstable => Some("burstable"),
            Qos::BestEffort => Some("besteffort"),
        }
    }
}

/// The container's cgroup path (the third field of a `/proc/<pid>/cgroup` line).
pub fn container_cgroup_path(
    layout: CgroupLayout,
    qos: Qos,
    pod_uid: &str,
    container_id: &str,
) -> String {
    match layout.systemd_scope_prefix() {
        Some(scope) => {
            // systemd escapes the UID's dashes (slice-name separators) as underscores.
            let uid = pod_uid.replace('-', "_");
            match qos.name() {
                None => {
                    format!("/kubepods.slice/kubepods-pod{uid}.slice/{scope}{container_id}.scope")
                }
                Some(q) => format!(
                    "/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{uid}.slice/{scope}{container_id}.scope"
                ),
            }
        }
        None => match qos.name() {
            None => format!("/kubepods/pod{pod_uid}/{container_id}"),
            Some(q) => format!("/kubepods/{q}/pod{pod_uid}/{container_id}"),
        },
    }
}

/// The contents of `/proc/<pid>/cgroup` for a process in this pod's container.
///
/// cgroup v2 files have the single unified line `0::<path>`. cgroup v1 files list the
/// controller hierarchies as a cgroup v1 host (hybrid mode, as systemd sets it up) does:
/// most controllers at the container's path, a couple at the root (`rdma`, `misc`), the
/// `name=systemd` hierarchy, and the unified `0::` line at the root.
pub fn cgroup_file(layout: CgroupLayout, qos: Qos, pod_uid: &str, container_id: &str) -> String {
    let path = container_cgroup_path(layout, qos, pod_uid, container_id);
    match layout {
        CgroupLayout::V2SystemdContainerd
        | CgroupLayout::V2SystemdCrio
        | CgroupLayout::V2SystemdDocker
        | CgroupLayout::V2Cgroupfs => format!("0::{path}\n"),
        CgroupLayout::V1Systemd | CgroupLayout::V1Cgroupfs => {
            let mut lines = String::new();
            for (id, controllers) in [
                (13, "misc"),
                (12, "rdma"),
                (11, "hugetlb"),
                (10, "memory"),
                (9, "devices"),
                (8, "cpu,cpuacct"),
                (7, "pids"),
                (6, "blkio"),
                (5, "freezer"),
                (4, "net_cls,net_prio"),
                (3, "perf_event"),
                (2, "cpuset"),
                (1, "name=systemd"),
            ] {
                let at = if matches!(controllers, "misc" | "rdma") {
                    "/"
                } else {
                    &path
                };
                lines.push_str(&format!("{id}:{controllers}:{at}\n"));
            }
            lines.push_str("0::/\n");
            lines
        }
    }
}

/// The contents of `/proc/<pid>/cgroup` for a process outside any pod (a system service).
pub fn non_pod_cgroup() -> String {
    "0::/system.slice/sshd.service\n".to_string()
}

/// A directory laid out like `/proc`, holding only `<pid>/cgroup` files. The directory
/// is the caller's: it is not removed on drop (tests use a temporary directory).
#[derive(Debug, Clone)]
pub struct FakeProc {
    root: PathBuf,
}

impl FakeProc {
    /// A fake `/proc` at `root`, creating the directory.
    pub fn new(root: &Path) -> io::Result<FakeProc> {
        std::fs::create_dir_all(root)?;
        Ok(FakeProc {
            root: root.to_path_buf(),
        })
    }

    /// The directory to read as `/proc`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Adds (or replaces) process `pid` with these `cgroup` file contents.
    pub fn add(&self, pid: u32, cgroup: &str) -> io::Result<()> {
        let dir = self.root.join(pid.to_string());
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("cgroup"), cgroup)
    }

    /// Removes process `pid`, as when it exits; removing an absent process is not an
    /// error.
    pub fn remove(&self, pid: u32) -> io::Result<()> {
        match std::fs::remove_dir_all(self.root.join(pid.to_string())) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "1d2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
    const UID_: &str = "1d2b3c4d_5e6f_4a7b_8c9d_0e1f2a3b4c5d";
    const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn every_layout_and_qos_class_has_the_expected_shape() {
        use CgroupLayout::*;
        use Qos::*;
        let rows = [
            (
                V2SystemdContainerd,
                Burstable,
                format!(
                    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope\n"
                ),
            ),
            (
                V2SystemdContainerd,
                Guaranteed,
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope\n"),
            ),
            (
                V2SystemdCrio,
                BestEffort,
                format!(
                    "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope\n"
                ),
            ),
            (
                V2SystemdDocker,
                Guaranteed,
                format!("0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{ID}.scope\n"),
            ),
            (
                V2Cgroupfs,
                Burstable,
                format!("0::/kubepods/burstable/pod{UID}/{ID}\n"),
            ),
            (
                V2Cgroupfs,
                Guaranteed,
                format!("0::/kubepods/pod{UID}/{ID}\n"),
            ),
            (
                V2Cgroupfs,
                BestEffort,
                format!("0::/kubepods/besteffort/pod{UID}/{ID}\n"),
            ),
        ];
        for (layout, qos, want) in rows {
            assert_eq!(
                cgroup_file(layout, qos, UID, ID),
                want,
                "{layout:?} {qos:?}"
            );
        }

        let v1 = cgroup_file(V1Systemd, Burstable, UID, ID);
        let path = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
        );
        for line in [
            format!("10:memory:{path}"),
            format!("8:cpu,cpuacct:{path}"),
            format!("7:pids:{path}"),
            format!("1:name=systemd:{path}"),
            "12:rdma:/".to_string(),
            "0::/".to_string(),
        ] {
            assert!(v1.lines().any(|l| l == line), "{line} missing from\n{v1}");
        }
        let v1 = cgroup_file(V1Cgroupfs, Guaranteed, UID, ID);
        assert!(
            v1.lines()
                .any(|l| l == format!("10:memory:/kubepods/pod{UID}/{ID}")),
            "{v1}"
        );
        assert!(
            v1.lines()
                .any(|l| l == format!("1:name=systemd:/kubepods/pod{UID}/{ID}"))
        );
    }

    #[test]
    fn every_file_is_well_formed_and_names_the_pod_once_per_line() {
        for layout in CgroupLayout::ALL {
            for qos in Qos::ALL {
                let file = cgroup_file(layout, qos, UID, ID);
                assert!(file.ends_with('\n'));
                for line in file.lines() {
                    let mut fields = line.splitn(3, ':');
                    let hierarchy = fields.next().unwrap();
                    assert!(
                        !hierarchy.is_empty() && hierarchy.bytes().all(|b| b.is_ascii_digit()),
                        "{line}"
                    );
                    let path = fields.nth(1).expect("three fields");
                    assert!(path.starts_with('/'), "{line}");
                    if path != "/" {
                        assert_eq!(path.matches(ID).count(), 1, "{line}");
                        assert!(path.contains(UID) || path.contains(UID_), "{line}");
                        assert!(path.starts_with("/kubepods"), "{line}");
                    }
                }
                // Exactly one path form per file: a systemd file never has the cgroupfs
                // pod directory and vice versa.
                let systemd = layout.systemd_scope_prefix().is_some();
                assert_eq!(
                    file.contains(&format!("pod{UID_}.slice")),
                    systemd,
                    "{file}"
                );
                assert_eq!(file.contains(&format!("/pod{UID}/")), !systemd, "{file}");
            }
        }
        assert!(!non_pod_cgroup().contains("kubepods"));
    }

    #[test]
    fn fake_proc_adds_and_removes_processes() {
        let dir = tempfile::tempdir().unwrap();
        let proc_root = FakeProc::new(&dir.path().join("proc")).unwrap();
        let file = cgroup_file(CgroupLayout::V2Cgroupfs, Qos::Burstable, UID, ID);
        proc_root.add(4242, &file).unwrap();
        let path = proc_root.root().join("4242").join("cgroup");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), file);
        proc_root.remove(4242).unwrap();
        assert!(!path.exists());
        proc_root.remove(4242).unwrap();
    }
}
