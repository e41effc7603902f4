//! `/proc/<pid>/cgroup` contents and cgroup paths (which pod and container a GPU
//! process runs in).
//! Invariants: a found pod UID is dashed lower-case UUID or a 32-hex config hash, and
//! the container ID 64 lower-case hex digits, both taken from the text; a path reads
//! the same alone and as the cgroup v2 line `0::<path>`.
#![no_main]

use gpu_exporter::attribution::cgroup::{PodContainer, parse_cgroup_path, parse_proc_cgroup};
use libfuzzer_sys::fuzz_target;

fn lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn check(found: &PodContainer, text: &str) {
    let uid = &found.pod_uid;
    let uuid = uid.len() == 36
        && uid.split('-').map(str::len).eq([8, 4, 4, 4, 12])
        && lower_hex(&uid.replace('-', ""));
    assert!(
        uuid || (uid.len() == 32 && lower_hex(uid)),
        "pod UID {uid:?}"
    );
    let id = &found.container_id;
    assert!(id.len() == 64 && lower_hex(id), "container ID {id:?}");
    let folded = text.to_ascii_lowercase().replace('_', "-");
    assert!(folded.contains(uid.as_str()), "{uid:?} is not in {text:?}");
    assert!(folded.contains(id.as_str()), "{id:?} is not in {text:?}");
}

fuzz_target!(|text: &str| {
    if let Some(found) = parse_proc_cgroup(text) {
        check(&found, text);
    }
    let path = parse_cgroup_path(text);
    if let Some(found) = &path {
        check(found, text);
    }
    if !text.contains('\n') {
        assert_eq!(parse_proc_cgroup(&format!("0::{text}")), path, "{text:?}");
    }
});
