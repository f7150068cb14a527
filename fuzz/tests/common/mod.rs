//! Shared by the replay tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target)
}

fn files(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(d) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.is_file()
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// Runs `f` on every file of `seeds/<target>` and `regressions/<target>`.
pub fn replay(target: &str, f: fn(&[u8])) {
    via_fuzz::abort_on_panic();
    let mut n = 0;
    for kind in ["seeds", "regressions"] {
        for p in files(&dir(kind, target)) {
            eprintln!("{target}: {}", p.display());
            f(&std::fs::read(&p).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "no seeds for {target}");
}

/// Compares `seeds/` with `via_fuzz::seeds::all()`; rewrites it when
/// `VIA_FUZZ_WRITE_SEEDS` is set.
pub fn check_seeds() {
    let write = std::env::var_os("VIA_FUZZ_WRITE_SEEDS").is_some();
    let mut stale = Vec::new();
    for (target, seeds) in via_fuzz::seeds::all() {
        let d = dir("seeds", target);
        if write {
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
        }
        let want: Vec<String> = seeds.iter().map(|s| s.0.clone()).collect();
        for (name, bytes) in &seeds {
            let p = d.join(name);
            if write {
                std::fs::write(&p, bytes).unwrap();
            } else if std::fs::read(&p).ok().as_ref() != Some(bytes) {
                stale.push(p.display().to_string());
            }
        }
        for p in files(&d) {
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            if !want.contains(&name) {
                stale.push(format!("{} (not generated)", p.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "seed files differ from via_fuzz::seeds: {stale:?}; \
         rewrite with VIA_FUZZ_WRITE_SEEDS=1 cargo test --test replay seeds"
    );
}
