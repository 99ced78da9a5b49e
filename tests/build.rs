//! Sets the cfg `gpu_machine` where an NVIDIA driver is present, so that the
//! tests written for a machine without a GPU show as ignored there instead
//! of passing without checking anything.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(gpu_machine)");
    // Not `/dev/nvidiactl` itself: a path that does not exist would rerun
    // this script, and rebuild every test, at each build.
    println!("cargo::rerun-if-changed=build.rs");
    if std::path::Path::new("/dev/nvidiactl").exists() {
        println!("cargo::rustc-cfg=gpu_machine");
    }
}
