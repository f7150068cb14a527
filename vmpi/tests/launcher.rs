//! `via-run`: ranks and rendezvous data in the environment, exit codes of
//! failed processes, signal forwarding, no orphans.

mod common;

use common::*;
use std::time::Duration;

fn sh(name: &str, n: u32, script: &str) -> Outcome {
    let mut c = via_run(name);
    c.args(["-n", &n.to_string(), "sh", "-c", script]);
    finish(c.spawn().unwrap())
}

#[test]
fn every_process_gets_its_rank_and_the_job() {
    let o = sh(
        "env",
        4,
        "echo rank=$VMPI_RANK size=$VMPI_SIZE job=$VMPI_JOB addr=${VMPI_PMI_ADDR:+set}",
    );
    assert_eq!(o.code, Some(0), "{}", o.output);
    for r in 0..4 {
        assert!(
            o.output.contains(&format!("rank={r} size=4 job=")),
            "{}",
            o.output
        );
    }
    assert_eq!(o.output.matches("addr=set").count(), 4);
}

#[test]
fn a_failed_process_ends_the_job_with_its_code() {
    // Rank 1 fails at once; rank 0 would run for a minute.
    let o = sh(
        "fail",
        2,
        "if [ $VMPI_RANK = 1 ]; then exit 7; fi; exec sleep 60",
    );
    assert_eq!(o.code, Some(7), "{}", o.output);
    assert!(o.elapsed < Duration::from_secs(20), "took {:?}", o.elapsed);
    // Killed by a signal: 128 + signal.
    let o = sh(
        "signal",
        2,
        "if [ $VMPI_RANK = 0 ]; then kill -KILL $$; fi; exec sleep 60",
    );
    assert_eq!(o.code, Some(128 + 9), "{}", o.output);
    // All succeed: 0.
    assert_eq!(sh("ok", 3, "exit 0").code, Some(0));
}

#[test]
fn a_program_that_cannot_start_fails_the_job() {
    let mut c = via_run("nostart");
    c.args(["-n", "2", "/nonexistent/program"]);
    let o = finish(c.spawn().unwrap());
    assert_eq!(o.code, Some(127), "{}", o.output);
}

/// Starts a job whose processes record their pids and sleep; returns the
/// launcher and the pids once every process is up.
fn sleeping_job(name: &str, n: u32) -> (std::process::Child, Vec<u32>, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!("vmpi-launch-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = via_run(name);
    c.args(["-n", &n.to_string(), "sh", "-c"]).arg(format!(
        "echo $$ > {}/pid.$VMPI_RANK; exec sleep 60",
        dir.display()
    ));
    let child = c.spawn().unwrap();
    let read = |r: u32| {
        std::fs::read_to_string(dir.join(format!("pid.{r}")))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    assert!(
        wait_for(Duration::from_secs(20), || (0..n)
            .all(|r| read(r).is_some())),
        "processes did not start"
    );
    let pids = (0..n).map(|r| read(r).unwrap()).collect();
    (child, pids, dir)
}

#[test]
fn sigterm_is_forwarded_and_the_job_ends() {
    let (child, pids, dir) = sleeping_job("term", 3);
    // SAFETY-free: kill(1) through the shell's binary.
    std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let o = finish(child);
    assert_eq!(o.code, Some(128 + 15), "{}", o.output);
    assert!(pids.iter().all(|&p| !alive(p)), "a process survived");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sigint_is_forwarded() {
    let (child, pids, dir) = sleeping_job("int", 2);
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let o = finish(child);
    assert_eq!(o.code, Some(128 + 2), "{}", o.output);
    assert!(pids.iter().all(|&p| !alive(p)));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn no_orphans_when_the_launcher_is_killed() {
    let (mut child, pids, dir) = sleeping_job("orphans", 3);
    child.kill().unwrap(); // SIGKILL: the launcher cannot forward anything.
    let _ = child.wait();
    assert!(
        wait_for(Duration::from_secs(10), || pids.iter().all(|&p| !alive(p))),
        "processes outlived their launcher"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_process_that_skips_finalize_fails_the_job() {
    let mut c = via_run("nofinalize");
    c.args(["-n", "2", env!("CARGO_BIN_EXE_vmpi-check"), "no-finalize"]);
    let o = finish(c.spawn().unwrap());
    assert_eq!(o.code, Some(1), "{}", o.output);
    assert!(o.output.contains("without finalizing"), "{}", o.output);
}

/// The CPUs this test may use, from its own `Cpus_allowed_list`.
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

#[test]
fn with_a_core_per_process_rank_r_is_bound_to_the_r_th_cpu() {
    let cpus = allowed_cpus();
    let script = "echo rank=$VMPI_RANK $(grep Cpus_allowed_list /proc/self/status)";
    let o = sh("bind", 1, script);
    assert_eq!(o.code, Some(0), "{}", o.output);
    assert!(
        o.output
            .contains(&format!("rank=0 Cpus_allowed_list: {}", cpus[0])),
        "{}",
        o.output
    );
    if cpus.len() >= 2 {
        let o = sh("bind2", 2, script);
        assert!(
            o.output
                .contains(&format!("rank=1 Cpus_allowed_list: {}", cpus[1])),
            "{}",
            o.output
        );
    }
    // More processes than CPUs, or VMPI_BIND=none: unbound.
    let n = cpus.len() as u32 + 1;
    let o = sh("nobind", n, "grep Cpus_allowed_list /proc/self/status");
    assert_eq!(o.code, Some(0), "{}", o.output);
    let mut c = via_run("nobind2");
    c.env("VMPI_BIND", "none").args([
        "-n",
        "1",
        "sh",
        "-c",
        "grep Cpus_allowed_list /proc/self/status",
    ]);
    let o2 = finish(c.spawn().unwrap());
    for out in [&o.output, &o2.output] {
        let lines: Vec<&str> = out.lines().filter(|l| l.contains("Cpus_allowed")).collect();
        assert!(!lines.is_empty(), "{out}");
        if cpus.len() >= 2 {
            assert!(
                lines
                    .iter()
                    .all(|l| !l.trim_end().ends_with(&format!(": {}", cpus[0]))),
                "{out}"
            );
        }
    }
}
