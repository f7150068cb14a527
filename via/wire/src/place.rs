//! Where the daemon listens, and whether a place can be trusted.
//!
//! The socket is a path in a directory only its owner can write: an
//! abstract socket name (what via-rs used before) can be bound by any local
//! user, who then receives the Hello, the NIC segment and the registered
//! memory of whoever connects.
//!
//! * Per-user daemon: `$XDG_RUNTIME_DIR/via-rs/<instance>.p<N>.sock` when
//!   `XDG_RUNTIME_DIR` is a directory of the caller with mode 0700, else
//!   `/tmp/via-rs-<uid>/<instance>.p<N>.sock`, where `N` is the protocol
//!   version: programs built against different versions of the library
//!   each start and use a daemon that speaks their protocol, side by side. The directory is created with mode
//!   0700; one that exists must be a real directory (not a symlink: checked
//!   with `lstat`) owned by the caller with mode 0700, or it is refused.
//!   The daemon of that directory must run as the caller (`SO_PEERCRED`).
//! * System daemon (`viad --system`): `/run/via-rs/system.sock` (the
//!   directory can be moved with `VIA_SYSTEM_DIR`, a knob for tests and
//!   unusual deployments), used only when the directory is a root-owned
//!   directory that nobody else can write, the socket in it is root's, and
//!   the daemon answers as uid 0.
//!
//! [`targets`] lists the places to try, in order.
#![forbid(unsafe_code)]

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use via_sys as sys;

/// Directory of the system-wide daemon (unless `VIA_SYSTEM_DIR` names
/// another).
pub const SYSTEM_DIR: &str = "/run/via-rs";
/// Socket of the system-wide daemon in its directory.
pub const SYSTEM_SOCKET_NAME: &str = "system.sock";
/// Lock file of the system-wide daemon in its directory.
pub const SYSTEM_LOCK_NAME: &str = "system.lock";
/// Socket of the system-wide daemon (unless `VIA_SYSTEM_DIR` names
/// another directory).
pub const SYSTEM_SOCKET: &str = "/run/via-rs/system.sock";

/// The system daemon's directory: `$VIA_SYSTEM_DIR` if it is an absolute
/// path (for tests, and deployments that keep it elsewhere), else
/// [`SYSTEM_DIR`]. Whatever it names is trusted only if it passes the
/// checks of [`system_target`], and the daemon must answer as root.
pub fn system_dir() -> PathBuf {
    match std::env::var_os("VIA_SYSTEM_DIR").map(PathBuf::from) {
        Some(d) if d.is_absolute() => d,
        Some(d) => {
            log::warn!(
                "ignoring VIA_SYSTEM_DIR={}: not an absolute path",
                d.display()
            );
            SYSTEM_DIR.into()
        }
        None => SYSTEM_DIR.into(),
    }
}

/// Checks that `dir` is a real directory (not a symlink) owned by root that
/// neither its group nor others can write: where the system daemon's
/// socket may live.
pub fn check_system_dir(dir: &Path) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    if !m.file_type().is_dir() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a root-owned directory closed to others (owner {}, mode {:04o}, {})",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777,
                if m.file_type().is_symlink() {
                    "a symbolic link"
                } else if m.file_type().is_dir() {
                    "a directory"
                } else {
                    "not a directory"
                }
            ),
        ));
    }
    Ok(())
}

/// Longest `VIA_INSTANCE`.
pub const MAX_INSTANCE: usize = 64;

/// Which daemon a place belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The system-wide daemon (uid 0).
    System,
    /// The caller's own daemon.
    User,
}

/// A place to reach a daemon, and who must answer there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Socket path.
    pub path: PathBuf,
    /// Which daemon.
    pub kind: Kind,
    /// The uid the daemon must run as (`SO_PEERCRED`).
    pub uid: u32,
}

/// The instance name (`VIA_INSTANCE`, default `default`), checked.
pub fn instance() -> io::Result<String> {
    let i = std::env::var("VIA_INSTANCE").unwrap_or_else(|_| "default".into());
    check_instance(&i)?;
    Ok(i)
}

fn check_instance(i: &str) -> io::Result<()> {
    let ok = !i.is_empty()
        && i.len() <= MAX_INSTANCE
        && !i.starts_with('.')
        && i.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
    if ok {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "VIA_INSTANCE {i:?} is not a usable name (1 to {MAX_INSTANCE} printable characters, no '/', not starting with '.')"
            ),
        ))
    }
}

/// Checks (with `lstat`: a symlink is refused, never followed) that `dir`
/// is a directory owned by `uid` with mode exactly 0700.
pub fn check_private_dir(dir: &Path, uid: u32) -> io::Result<()> {
    let m = std::fs::symlink_metadata(dir)?;
    let refuse = |why: String| {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}; refusing to use it", dir.display()),
        ))
    };
    if !m.file_type().is_dir() {
        return refuse(if m.file_type().is_symlink() {
            "is a symbolic link".into()
        } else {
            "is not a directory".into()
        });
    }
    if m.uid() != uid {
        return refuse(format!("is owned by uid {}, not {uid}", m.uid()));
    }
    if m.mode() & 0o7777 != 0o700 {
        return refuse(format!("has mode {:04o}, not 0700", m.mode() & 0o7777));
    }
    Ok(())
}

/// Creates `dir` with mode 0700 if it does not exist, then checks it with
/// [`check_private_dir`].
fn private_dir(dir: &Path, uid: u32) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {
            // A umask may have taken bits away; we own it, set them.
            let m = std::fs::symlink_metadata(dir)?;
            if m.file_type().is_dir() && m.uid() == uid && m.mode() & 0o7777 != 0o700 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    check_private_dir(dir, uid)
}

/// The caller's private directory for daemon sockets (created if needed):
/// `$XDG_RUNTIME_DIR/via-rs` when `XDG_RUNTIME_DIR` is a 0700 directory of
/// the caller, else `/tmp/via-rs-<uid>`.
pub fn user_dir() -> io::Result<PathBuf> {
    let uid = sys::getuid();
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if xdg.is_absolute() {
            match check_private_dir(&xdg, uid) {
                Ok(()) => {
                    let d = xdg.join("via-rs");
                    private_dir(&d, uid)?;
                    return Ok(d);
                }
                Err(e) => log::debug!("not using XDG_RUNTIME_DIR: {e}"),
            }
        }
    }
    let d = PathBuf::from(format!("/tmp/via-rs-{uid}"));
    private_dir(&d, uid)?;
    Ok(d)
}

/// The per-user daemon's socket for `instance`, in [`user_dir`].
pub fn user_socket_for(instance: &str) -> io::Result<PathBuf> {
    check_instance(instance)?;
    Ok(user_dir()?.join(format!("{instance}.p{}.sock", crate::proto::VERSION)))
}

/// The per-user daemon's socket for `VIA_INSTANCE`.
pub fn user_socket() -> io::Result<PathBuf> {
    user_socket_for(&instance()?)
}

/// The lock file that makes the per-user daemon of `instance` unique.
pub fn user_lock_for(instance: &str) -> io::Result<PathBuf> {
    check_instance(instance)?;
    Ok(user_dir()?.join(format!("{instance}.p{}.lock", crate::proto::VERSION)))
}

/// The system daemon's place, if it is there and trustworthy: its
/// directory ([`system_dir`]) a real directory owned by root that nobody
/// else can write, and the socket in it owned by root. (Who answers on it
/// is checked when connecting: uid 0.)
pub fn system_target() -> Option<Target> {
    let dir = system_dir();
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        _ => {}
    }
    if let Err(e) = check_system_dir(&dir) {
        log::warn!("{e}: no system daemon there");
        return None;
    }
    let path = dir.join(SYSTEM_SOCKET_NAME);
    let sock = std::fs::symlink_metadata(&path).ok()?;
    if !sock.file_type().is_socket() || sock.uid() != 0 {
        log::warn!("{} is not a socket owned by root: ignored", path.display());
        return None;
    }
    Some(Target {
        path,
        kind: Kind::System,
        uid: 0,
    })
}

/// The places to try, in order: the system daemon if its place checks out,
/// then the caller's own daemon (which the library starts when none runs).
/// Fails only if the caller's own place is unusable.
pub fn targets() -> io::Result<Vec<Target>> {
    let mut v: Vec<Target> = system_target().into_iter().collect();
    v.push(Target {
        path: user_socket()?,
        kind: Kind::User,
        uid: sys::getuid(),
    });
    Ok(v)
}

/// Whether the daemon on `sock` is the one `t` requires (`SO_PEERCRED`).
pub fn check_identity(sock: &std::os::fd::OwnedFd, t: &Target) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let cred = sys::peer_cred(sock.as_raw_fd())?;
    if cred.uid != t.uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "the daemon at {} runs as uid {} (pid {}), not uid {}: refusing to talk to it",
                t.path.display(),
                cred.uid,
                cred.pid,
                t.uid
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_names() {
        for ok in ["default", "via-tests-x-12", "csuite-1-timeout-VIA_CQ=scan"] {
            assert!(check_instance(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "..", ".x", "a b", &"x".repeat(65)] {
            assert!(check_instance(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn private_dir_checks() {
        let uid = sys::getuid();
        let base = std::env::temp_dir().join(format!("via-place-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let d = base.join("ok");
        private_dir(&d, uid).unwrap();
        assert!(check_private_dir(&d, uid).is_ok());
        // Wrong mode.
        let open = base.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(private_dir(&open, uid).is_err());
        // A symlink to a good directory is still refused.
        let link = base.join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(private_dir(&link, uid).is_err());
        // A file.
        let f = base.join("file");
        std::fs::write(&f, b"").unwrap();
        assert!(private_dir(&f, uid).is_err());
        // Another owner.
        assert!(check_private_dir(&d, uid.wrapping_add(1)).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
