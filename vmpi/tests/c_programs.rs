//! C programs built with `vmpicc` against `mpi.h` and libvmpi, run under
//! `via-run`: the classic ring, pi by reduction, matrix transpose by
//! Alltoall, collectives with user operations, the error paths under
//! `MPI_ERRORS_RETURN`, and `MPI_ERRORS_ARE_FATAL` ending the job.
//!
//! libvmpi is built into the workspace's target directory (as the test
//! binaries are); the programs go to `target/tmp/vmpi-c-<profile>/`.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use common::*;

const PROGRAMS: &[&str] = &[
    "ring",
    "pi",
    "transpose",
    "coll",
    "errors",
    "fatal",
    "watchdog",
];

fn programs() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        build(true);
        let dir = target_dir()
            .join("tmp")
            .join(format!("vmpi-c-{}", profile()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = root().join("vmpi/tests/c");
        for p in PROGRAMS {
            let out = Command::new(root().join("vmpi/vmpicc"))
                .env("VMPI_LIBDIR", target_dir().join(profile()))
                .args([
                    "-std=c99",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-pedantic",
                    "-pthread",
                    "-g",
                    "-o",
                ])
                .arg(dir.join(p))
                .arg(src.join(format!("{p}.c")))
                .output()
                .expect("vmpicc");
            assert!(
                out.status.success(),
                "vmpicc {p}.c:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

fn run(p: &str, n: u32) -> Outcome {
    let mut c = via_run(&format!("c-{p}-{n}"));
    c.args(["-n", &n.to_string()]).arg(programs().join(p));
    finish(c.spawn().unwrap())
}

#[test]
fn classic_programs() {
    for p in ["ring", "pi", "transpose", "coll"] {
        for n in [2, 3, 8] {
            let o = run(p, n);
            assert!(
                o.code == Some(0) && o.output.contains(&format!("PASS {p}")),
                "{p} on {n}:\n{}",
                o.output
            );
        }
    }
}

#[test]
fn errors_are_returned_under_errors_return() {
    for n in [2, 5] {
        let o = run("errors", n);
        assert!(
            o.code == Some(0) && o.output.contains("PASS errors"),
            "on {n}:\n{}",
            o.output
        );
    }
}

#[test]
fn errors_are_fatal_by_default_and_end_the_job() {
    // Rank 0's truncated receive ends the job; rank 1 blocks in a receive
    // and the third rank in a barrier: both are killed, nothing hangs.
    let o = run("fatal", 3);
    assert_eq!(o.code, Some(15), "{}", o.output);
    assert!(
        o.output.contains("MPI_ERR_TRUNCATE") || o.output.contains("truncated"),
        "{}",
        o.output
    );
    assert!(!o.output.contains("not reached"));
}

#[test]
fn another_thread_may_ask_initialized_and_abort_while_a_call_blocks() {
    let o = run("watchdog", 2);
    assert_eq!(o.code, Some(42), "{}", o.output);
    assert!(o.output.contains("initialized 1"), "{}", o.output);
    assert!(!o.output.contains("not reached"), "{}", o.output);
}

#[test]
fn vmpicc_compiles_c89_and_cxx() {
    build(true);
    let dir = target_dir()
        .join("tmp")
        .join(format!("vmpi-c-{}-hdr", profile()));
    std::fs::create_dir_all(&dir).unwrap();
    let probe = dir.join("probe.c");
    std::fs::write(
        &probe,
        "#include <mpi.h>\nint main(void) { MPI_Status s; (void)s; return MPI_SUCCESS; }\n",
    )
    .unwrap();
    for (cc, std) in [("cc", "-std=c89"), ("c++", "-std=c++11")] {
        let out = Command::new(root().join("vmpi/vmpicc"))
            .env("VMPICC_CC", cc)
            .env("VMPI_LIBDIR", target_dir().join(profile()))
            .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-c", "-x"])
            .arg(if cc == "cc" { "c" } else { "c++" })
            .arg(&probe)
            .arg("-o")
            .arg(dir.join(format!("probe-{cc}.o")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cc} {std}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
