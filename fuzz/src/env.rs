//! Process set-up shared by the targets that run real via-rs code: a
//! private viad instance, found beside this repository's builds.

use std::path::PathBuf;

/// The `viad` to run: `$VIA_VIAD`, else the newest of this repository's
/// `target/{release,debug}/viad`.
pub fn viad_path() -> PathBuf {
    if let Some(p) = std::env::var_os("VIA_VIAD") {
        return p.into();
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = ["release", "debug"]
        .iter()
        .map(|p| root.join("target").join(p).join("viad"))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    match found.pop() {
        Some((_, p)) => p,
        None => panic!(
            "no viad: build it first (cargo build --release -p via-tools --bin viad) \
             or set VIA_VIAD"
        ),
    }
}

/// Points this process at a viad instance of its own (`VIA_INSTANCE`,
/// `VIA_VIAD`) and quiets the library's log. Call before any thread starts.
pub fn private_instance(tag: &str) -> String {
    let inst = format!("fuzz-{tag}-{}", std::process::id());
    let viad = viad_path();
    // SAFETY: called once, first thing, while the process has one thread
    // (libFuzzer calls the target from its main thread; cargo test replays
    // call it from a test before any via object exists in the process).
    unsafe {
        std::env::set_var("VIA_INSTANCE", &inst);
        std::env::set_var("VIA_VIAD", &viad);
        if std::env::var_os("RUST_LOG").is_none() {
            std::env::set_var("RUST_LOG", "error");
        }
    }
    inst
}
