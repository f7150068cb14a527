//! Finding and starting `viad`.
#![forbid(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::place::{self, Target};
use crate::sys;

/// Where `viad` is: `$VIA_VIAD`; beside the running executable (or one
/// directory up, for test binaries in `target/*/deps`); beside the library
/// that holds this code and in `../libexec/via-rs`, `../bin` from it (an
/// installed `libvipl.so`); then `$PATH`.
pub fn find_viad() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VIA_VIAD") {
        return Some(p.into());
    }
    let mut dirs = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        if let Some(d) = exe.parent() {
            dirs.push(d.to_path_buf());
            if let Some(up) = d.parent() {
                dirs.push(up.to_path_buf());
            }
        }
    }
    if let Some(lib) = sys::own_object_path() {
        if let Some(d) = lib.parent() {
            dirs.push(d.to_path_buf());
            dirs.push(d.join("../libexec/via-rs"));
            dirs.push(d.join("../bin"));
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.into_iter()
        .map(|d| d.join("viad"))
        .find(|p| p.is_file())
}

/// Connects to the per-user daemon at `t`, starting it first if nobody
/// listens there. Each connect is bounded by `timeout`; the daemon's
/// identity is checked before the socket is returned.
pub fn connect_or_start(t: &Target, attempt: u32, timeout: Duration) -> io::Result<OwnedFd> {
    match connect_checked(t, timeout) {
        Ok(s) => return Ok(s),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ECONNREFUSED) | Some(libc::ENOENT)
            ) => {}
        Err(e) => return Err(e),
    }
    let viad = find_viad().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            "viad not found (set VIA_VIAD, or install it beside the program or libvipl.so, or in PATH)",
        )
    })?;
    log::debug!("starting {} (attempt {attempt})", viad.display());
    // `viad --daemon` listens before its foreground process exits, so once
    // `status()` returns the socket accepts connections (or another daemon
    // that won the race does).
    let mut child = Command::new(&viad)
        .arg("--daemon")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    // Bounded: a viad that neither listens nor exits is not waited for.
    let pidfd = sys::pidfd_open(child.id() as i32)?;
    let mut p = [libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }];
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    if sys::poll(&mut p, ms)? == 0 {
        let _ = child.kill();
        let _ = child.wait();
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{} did not start within {timeout:?}", viad.display()),
        ));
    }
    let st = child.wait()?;
    if !st.success() {
        return Err(io::Error::other(format!(
            "{} exited with {st}",
            viad.display()
        )));
    }
    connect_checked(t, timeout)
}

/// Connects to `t` within `timeout` and checks who answers.
pub fn connect_checked(t: &Target, timeout: Duration) -> io::Result<OwnedFd> {
    let s = sys::seqpacket_connect_path(&t.path, timeout)?;
    place::check_identity(&s, t)?;
    Ok(s)
}
