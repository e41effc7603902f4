//! A fake sysfs tree for the exporter's `--path-sysfs`: the nvidia driver's directory
//! with devices bound to it, as the kernel lays it out (a link per bound device,
//! named by its PCI address, to the device's directory with its `class` file).

use std::path::{Path, PathBuf};

/// PCI class of a 3D controller (a datacenter GPU).
pub const CLASS_3D: &str = "0x030200";
/// PCI class of an NVSwitch ("other bridge"), also bound to nvidia on HGX boards.
pub const CLASS_NVSWITCH: &str = "0x068000";

/// A `class` file a broken or hostile tree may hold instead of an attribute.
#[derive(Debug, Clone, Copy)]
pub enum BadClass {
    Fifo,
    DevZero,
}

pub struct FakeSysfs {
    root: PathBuf,
}

impl FakeSysfs {
    /// An empty nvidia driver directory under `root`.
    pub fn new(root: &Path) -> FakeSysfs {
        let s = FakeSysfs { root: root.into() };
        std::fs::create_dir_all(s.driver()).expect("create the driver directory");
        // What the real directory holds besides devices.
        for f in ["bind", "unbind", "new_id", "remove_id", "uevent"] {
            std::fs::write(s.driver().join(f), "").expect("write a driver file");
        }
        s
    }

    /// The root, for `--path-sysfs`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn driver(&self) -> PathBuf {
        self.root.join("bus/pci/drivers/nvidia")
    }

    /// Bind the device at `address` (sysfs form, `0000:18:00.0`) of PCI `class`.
    pub fn bind(&self, address: &str, class: &str) {
        let dev = self.root.join("devices/pci0000:00").join(address);
        std::fs::create_dir_all(&dev).expect("create the device directory");
        std::fs::write(dev.join("class"), format!("{class}\n")).expect("write class");
        std::os::unix::fs::symlink(&dev, self.driver().join(address)).expect("bind");
    }

    /// Bind a device at `address` whose `class` is no sysfs attribute: a FIFO with no
    /// writer, or a link to `/dev/zero`.
    pub fn bind_bad_class(&self, address: &str, bad: BadClass) {
        let dev = self.root.join("devices/pci0000:00").join(address);
        std::fs::create_dir_all(&dev).expect("create the device directory");
        let class = dev.join("class");
        match bad {
            BadClass::Fifo => {
                let made = std::process::Command::new("mkfifo")
                    .arg(&class)
                    .status()
                    .expect("mkfifo");
                assert!(made.success(), "mkfifo {class:?}");
            }
            BadClass::DevZero => {
                std::os::unix::fs::symlink("/dev/zero", &class).expect("link to /dev/zero")
            }
        }
        std::os::unix::fs::symlink(&dev, self.driver().join(address)).expect("bind");
    }

    pub fn unbind(&self, address: &str) {
        std::fs::remove_file(self.driver().join(address)).expect("unbind");
    }
}

/// The sysfs form of an NVML PCI bus ID: `00000000:2A:00.0` → `0000:2a:00.0`.
pub fn address_of(nvml_bus_id: &str) -> String {
    let (domain, rest) = nvml_bus_id.split_once(':').expect("a PCI bus ID");
    let domain = u32::from_str_radix(domain, 16).expect("a hex PCI domain");
    format!("{domain:04x}:{}", rest.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    #[test]
    fn nvml_bus_ids_map_to_sysfs_addresses() {
        assert_eq!(super::address_of("00000000:2A:00.0"), "0000:2a:00.0");
        assert_eq!(super::address_of("00000001:18:1F.7"), "0001:18:1f.7");
    }
}
