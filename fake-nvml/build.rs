//! Give the cdylib the SONAME of the real driver library, so that it can stand in for
//! `libnvidia-ml.so.1` wherever the dynamic loader looks for it.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
