//! Finding and starting `viad`.
#![forbid(unsafe_code)]

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Command, Stdio};

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

/// Connects to the daemon, starting it first if nobody listens.
pub fn connect_or_start(attempt: u32) -> io::Result<OwnedFd> {
    let name = super::socket_name();
    match sys::seqpacket_connect(&name) {
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
    let st = Command::new(&viad)
        .arg("--daemon")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()?;
    if !st.success() {
        return Err(io::Error::other(format!(
            "{} exited with {st}",
            viad.display()
        )));
    }
    sys::seqpacket_connect(&name)
}
