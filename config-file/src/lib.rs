//! Reading a file whole, bounded: both binaries read several (counters CSV, web
//! config, password and token files, kubeconfigs and the files they name, scenarios,
//! PEM certificates and keys, sysfs attributes), and a path given by mistake must fail
//! with a clear error, not hang or eat the node's memory. `-f /dev/zero` would grow
//! without end and a FIFO with no writer would block startup forever: anything but a
//! regular file is refused before it is opened and again once open (never waiting on a
//! FIFO), and a file over the limit is refused after reading one byte past it.
//!
//! Its own crate because kube-support, tls-serving and gpu-sim all need it and share
//! nothing else: tls-serving and gpu-sim (inside the fake libnvidia-ml) must not pull
//! in the Kubernetes client.

use std::fs::{File, OpenOptions};
use std::io::{Error, ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// 1 MiB: a hundred times the largest counters CSV or web config in use, and four
/// times the system's whole CA bundle (~220 KB).
pub const DEFAULT_LIMIT: u64 = 1 << 20;

/// 64 KiB: a password or a bearer token (service-account tokens are about 1 KiB).
pub const SECRET_LIMIT: u64 = 64 << 10;

/// 4 KiB: one sysfs or procfs attribute (the kernel fills at most a page; the class,
/// vendor or driver values read are a few bytes).
pub const ATTRIBUTE_LIMIT: u64 = 4096;

/// Refuse anything but a regular file of at most `limit` bytes, from its metadata,
/// without opening it.
pub fn check(path: &Path, limit: u64) -> Result<(), Error> {
    let metadata = std::fs::metadata(path)?;
    regular(metadata.file_type())?;
    if metadata.len() > limit {
        return Err(too_large(limit));
    }
    Ok(())
}

fn regular(kind: std::fs::FileType) -> Result<(), Error> {
    if kind.is_file() {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::InvalidInput,
            format!("not a regular file (it is {})", describe(kind)),
        ))
    }
}

fn too_large(limit: u64) -> Error {
    Error::new(
        ErrorKind::FileTooLarge,
        format!("larger than the {limit} bytes allowed"),
    )
}

/// Open a path that [`check`] or a `stat` found to be a regular file, and make sure it
/// still is: it may have been replaced in between. `O_NONBLOCK` makes opening a FIFO
/// (which waits for a writer) return at once; the open file's own metadata then
/// refuses it. On a regular file the flag changes nothing.
fn open_regular(path: &Path) -> Result<(File, std::fs::Metadata), Error> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    regular(metadata.file_type())?;
    Ok((file, metadata))
}

/// Read at most `limit` bytes; one byte more is an error. Whatever the file's size
/// said, this is the bound.
fn read_bounded(file: File, limit: u64) -> Result<Vec<u8>, Error> {
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

/// Read a regular file of at most `limit` bytes.
///
/// A device, FIFO, socket or directory is refused from its metadata before it is
/// opened (opening some devices does something), and again from the open file (it
/// may have been swapped since). A file over the limit is refused from its size, and
/// one that grew past it since, after reading one byte past the limit.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    check(path, limit)?;
    let (file, metadata) = open_regular(path)?;
    if metadata.len() > limit {
        return Err(too_large(limit));
    }
    read_bounded(file, limit)
}

/// Read a regular file of at most `limit` bytes as UTF-8.
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, Error> {
    String::from_utf8(read(path, limit)?)
        .map_err(|_| Error::new(ErrorKind::InvalidData, "not UTF-8 text"))
}

/// Read a sysfs (or procfs) attribute of at most `limit` bytes as UTF-8: a regular
/// file whose size says nothing of its content (sysfs reports a page, 4096 bytes,
/// procfs 0), so only the bounded read limits it. A link to a device (`/dev/zero`)
/// or a FIFO in the tree is refused as in [`read`], without blocking.
pub fn read_attribute(path: &Path, limit: u64) -> Result<String, Error> {
    regular(std::fs::metadata(path)?.file_type())?;
    let (file, _) = open_regular(path)?;
    String::from_utf8(read_bounded(file, limit)?)
        .map_err(|_| Error::new(ErrorKind::InvalidData, "not UTF-8 text"))
}

fn describe(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `f` on a thread, which must finish within 5 s: a read that blocks on a FIFO
    /// fails the test instead of hanging it.
    fn promptly<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("{what} did not return within 5 s"))
    }

    fn mkfifo(path: &Path) {
        let made = std::process::Command::new("mkfifo")
            .arg(path)
            .status()
            .expect("mkfifo");
        assert!(made.success());
    }

    #[test]
    fn devices_fifos_and_directories_are_refused_before_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        // A sysfs `class` file linked to /dev/zero, as a hostile tree would have it.
        let zero_link = dir.path().join("class");
        std::os::unix::fs::symlink("/dev/zero", &zero_link).expect("symlink");
        for (path, says) in [
            (Path::new("/dev/zero"), "a character device"),
            (zero_link.as_path(), "a character device"),
            (fifo.as_path(), "a FIFO"),
            (dir.path(), "a directory"),
        ] {
            let path = path.to_path_buf();
            let errors = promptly(&format!("reading {path:?}"), move || {
                [
                    read_to_string(&path, DEFAULT_LIMIT).unwrap_err(),
                    read(&path, DEFAULT_LIMIT).unwrap_err(),
                    read_attribute(&path, ATTRIBUTE_LIMIT).unwrap_err(),
                    check(&path, DEFAULT_LIMIT).unwrap_err(),
                ]
            });
            for e in errors {
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{says}");
                assert!(e.to_string().contains(says), "{says}: {e}");
            }
        }
    }

    /// The file found regular may be swapped for a FIFO before it is opened: opening
    /// must not wait for a writer, and the open file is refused.
    #[test]
    fn opening_a_fifo_does_not_wait_for_a_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        mkfifo(&fifo);
        let e = promptly("opening a FIFO", move || open_regular(&fifo).map(|_| ()))
            .expect_err("a FIFO opened as a regular file");
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("a FIFO"), "{e}");
    }

    /// sysfs reports 4096 bytes for an attribute of a few: only the read bounds it.
    #[test]
    fn an_attribute_is_bounded_by_what_it_holds_not_by_its_size() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("class");
        std::fs::write(&path, "0x030200\n").expect("write");
        assert_eq!(
            read_attribute(&path, 9).expect("at the limit"),
            "0x030200\n"
        );
        let e = read_attribute(&path, 8).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("8 bytes"), "{e}");
        // A real sysfs attribute, where the host has one: its size is a page.
        let online = Path::new("/sys/devices/system/cpu/online");
        if std::fs::metadata(online).is_ok_and(|m| m.len() > 64) {
            let text = read_attribute(online, 64).expect("sysfs attribute");
            assert!(text.ends_with('\n'), "{text:?}");
            assert_eq!(
                read(online, 64).unwrap_err().kind(),
                ErrorKind::FileTooLarge
            );
        }
    }

    #[test]
    fn a_file_is_read_up_to_the_limit_and_refused_past_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, "12345").expect("write");
        assert_eq!(read_to_string(&path, 5).expect("at the limit"), "12345");
        let e = read_to_string(&path, 4).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::FileTooLarge);
        assert!(e.to_string().contains("4 bytes"), "{e}");
        assert_eq!(read(&path, 5).expect("at the limit"), b"12345");
        assert_eq!(read(&path, 4).unwrap_err().kind(), ErrorKind::FileTooLarge);
        check(&path, 5).expect("at the limit");
        assert_eq!(check(&path, 4).unwrap_err().kind(), ErrorKind::FileTooLarge);
    }
}
