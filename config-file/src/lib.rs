//! Reading a file whole, bounded: both binaries read several (counters CSV, web
//! config, password and token files, kubeconfigs, scenarios, PEM certificates and
//! keys), and a path given by mistake must fail with a clear error, not hang or eat the
//! node's memory. `-f /dev/zero` would grow without end and a FIFO with no writer would
//! block startup forever: anything but a regular file is refused before it is opened,
//! and a file over the limit is refused after reading one byte past it.
//!
//! Its own crate because kube-support, tls-serving and gpu-sim all need it and share
//! nothing else: tls-serving and gpu-sim (inside the fake libnvidia-ml) must not pull
//! in the Kubernetes client.

use std::io::{Error, ErrorKind, Read};
use std::path::Path;

/// 1 MiB: a hundred times the largest counters CSV or web config in use, and four
/// times the system's whole CA bundle (~220 KB).
pub const DEFAULT_LIMIT: u64 = 1 << 20;

/// 64 KiB: a password or a bearer token (service-account tokens are about 1 KiB).
pub const SECRET_LIMIT: u64 = 64 << 10;

/// Refuse anything but a regular file of at most `limit` bytes, from its metadata,
/// without opening it: for files another library then reads by path (a kubeconfig).
pub fn check(path: &Path, limit: u64) -> Result<(), Error> {
    let metadata = std::fs::metadata(path)?;
    let kind = metadata.file_type();
    if !kind.is_file() {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("not a regular file (it is {})", describe(kind)),
        ));
    }
    if metadata.len() > limit {
        return Err(too_large(limit));
    }
    Ok(())
}

fn too_large(limit: u64) -> Error {
    Error::new(
        ErrorKind::FileTooLarge,
        format!("larger than the {limit} bytes allowed"),
    )
}

/// Read a regular file of at most `limit` bytes.
pub fn read(path: &Path, limit: u64) -> Result<Vec<u8>, Error> {
    check(path, limit)?;
    let file = std::fs::File::open(path)?;
    let mut bytes = Vec::new();
    // The file may have grown since `check`: read one byte past the limit to know.
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_large(limit));
    }
    Ok(bytes)
}

/// Read a regular file of at most `limit` bytes as UTF-8.
pub fn read_to_string(path: &Path, limit: u64) -> Result<String, Error> {
    String::from_utf8(read(path, limit)?)
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

    #[test]
    fn devices_fifos_and_directories_are_refused_before_reading() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        for (path, says) in [
            (Path::new("/dev/zero"), "a character device"),
            (fifo.as_path(), "a FIFO"),
            (dir.path(), "a directory"),
        ] {
            for e in [
                read_to_string(path, DEFAULT_LIMIT).unwrap_err(),
                read(path, DEFAULT_LIMIT).unwrap_err(),
                check(path, DEFAULT_LIMIT).unwrap_err(),
            ] {
                assert_eq!(e.kind(), ErrorKind::InvalidInput, "{path:?}");
                assert!(e.to_string().contains(says), "{path:?}: {e}");
            }
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
