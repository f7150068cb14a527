//! The configuration file of the system daemon (`viad --system`,
//! default `/etc/via-rs/viad.toml`; `pkg/viad.toml` is a commented
//! example). Every key is optional; an unknown key, a malformed size or a
//! contradiction is an error that stops the daemon with a message naming
//! it (better than serving with a policy the administrator did not write).
//!
//! ```toml
//! [pinning]                 # memory the daemon locks for registrations
//! per_process = "256 MiB"   # one process (all its sessions)
//! per_user = "1 GiB"        # all processes of one user
//! total = "50%"             # all users (bytes, a size, or a share of RAM)
//!
//! [[pinning.user]]          # another quota for one user
//! uid = 1000
//! per_process = "2 GiB"
//! per_user = "4 GiB"
//!
//! [limits]                  # what one client may take from the daemon
//! max_fds_per_session = 131072
//! max_fds_per_user = 262144
//! max_pending = 4096
//! max_connections = 64
//! max_queue = 1048576
//! hello_timeout_ms = 5000
//!
//! [[grant]]                 # a cross-user connection (sockets NICs only)
//! client_uid = 1001
//! server_uid = 1000
//! discriminator_prefix = "svc-"
//! ```

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::broker::{Grant, Quota, SystemPolicy};

/// Default configuration file of the system daemon.
pub const DEFAULT_PATH: &str = "/etc/via-rs/viad.toml";

/// Default pinning quota of one process.
pub const DEFAULT_PER_PROCESS: u64 = 256 << 20;
/// Default pinning quota of one user.
pub const DEFAULT_PER_USER: u64 = 1 << 30;
/// Default share of the host's memory all users may have locked together.
pub const DEFAULT_TOTAL_PERCENT: u64 = 50;

/// A size in bytes as the file may write it: a number of bytes, a string
/// with a binary or decimal unit (`"512 MiB"`, `"2G"`, `"64k"`), a share of
/// the host's memory (`"25%"`), or `"unlimited"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    /// Bytes.
    Bytes(u64),
    /// Percent of the host's memory (`MemTotal`).
    Percent(u64),
    /// No bound.
    Unlimited,
}

impl Size {
    /// Bytes, given the host's memory.
    pub fn bytes(self, mem_total: u64) -> u64 {
        match self {
            Size::Bytes(b) => b,
            Size::Percent(p) => (mem_total as u128 * p as u128 / 100) as u64,
            Size::Unlimited => via_wire::proto::UNLIMITED,
        }
    }
}

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Size, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("unlimited") || t.eq_ignore_ascii_case("infinity") {
            return Ok(Size::Unlimited);
        }
        if let Some(p) = t.strip_suffix('%') {
            return match p.trim().parse::<u64>() {
                Ok(p) if p <= 100 => Ok(Size::Percent(p)),
                _ => Err(format!("{s:?}: a share of memory is 0% to 100%")),
            };
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("{s:?} is not a size (bytes, \"512 MiB\", \"2G\", \"25%\")"))?;
        let mul: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            u => {
                return Err(format!(
                    "{s:?}: unknown unit {u:?} (use KiB, MiB, GiB, TiB)"
                ));
            }
        };
        n.checked_mul(mul)
            .map(Size::Bytes)
            .ok_or_else(|| format!("{s:?} is too large"))
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    Int(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        match SizeRepr::deserialize(d)? {
            SizeRepr::Int(n) => u64::try_from(n)
                .map(Size::Bytes)
                .map_err(|_| serde::de::Error::custom(format!("{n}: a size cannot be negative"))),
            SizeRepr::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileRepr {
    #[serde(default)]
    pinning: PinningRepr,
    #[serde(default)]
    limits: LimitsRepr,
    #[serde(default, rename = "grant")]
    grants: Vec<GrantRepr>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct PinningRepr {
    per_process: Option<Size>,
    per_user: Option<Size>,
    total: Option<Size>,
    #[serde(default, rename = "user")]
    users: Vec<UserRepr>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct UserRepr {
    uid: u32,
    per_process: Option<Size>,
    per_user: Option<Size>,
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct LimitsRepr {
    max_fds_per_session: Option<usize>,
    max_fds_per_user: Option<usize>,
    max_pending: Option<usize>,
    max_connections: Option<usize>,
    max_queue: Option<usize>,
    hello_timeout_ms: Option<u64>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct GrantRepr {
    client_uid: u32,
    server_uid: u32,
    #[serde(default)]
    discriminator_prefix: String,
}

/// Per-client limits the file may set (`None`: the built-in default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LimitOverrides {
    /// Shared-object fds one session may store.
    pub max_fds_per_session: Option<usize>,
    /// Shared-object fds the sessions of one user may store.
    pub max_fds_per_user: Option<usize>,
    /// Listens, connects and peer requests one session may have waiting.
    pub max_pending: Option<usize>,
    /// Connections of one process.
    pub max_connections: Option<usize>,
    /// Bytes queued for a client that does not read.
    pub max_queue: Option<usize>,
    /// How long a new connection may take to say Hello.
    pub hello_timeout: Option<Duration>,
}

/// The system daemon's configuration, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Pinning quotas and cross-user grants.
    pub policy: SystemPolicy,
    /// Per-client limits.
    pub limits: LimitOverrides,
}

/// A configuration that cannot be used.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// The host's memory (`MemTotal`), for shares of it.
pub fn mem_total() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map(|kb| kb * 1024)
        .unwrap_or(1 << 30)
}

impl Config {
    /// Parses the text of a configuration file (`mem` is the host's
    /// memory, for shares of it).
    pub fn parse(text: &str, mem: u64) -> Result<Config, ConfigError> {
        let f: FileRepr = toml::from_str(text).map_err(|e| ConfigError(e.to_string()))?;
        let bytes = |s: Option<Size>, default: u64| s.map_or(default, |s| s.bytes(mem));
        let quota = Quota {
            per_process: bytes(f.pinning.per_process, DEFAULT_PER_PROCESS),
            per_user: bytes(f.pinning.per_user, DEFAULT_PER_USER),
        };
        let total = bytes(
            f.pinning.total,
            Size::Percent(DEFAULT_TOTAL_PERCENT).bytes(mem),
        );
        let mut users = HashMap::new();
        for u in &f.pinning.users {
            let q = Quota {
                per_process: bytes(u.per_process, quota.per_process),
                per_user: bytes(u.per_user, quota.per_user),
            };
            if users.insert(u.uid, q).is_some() {
                return Err(ConfigError(format!(
                    "pinning.user: uid {} appears twice",
                    u.uid
                )));
            }
        }
        let mut grants = Vec::new();
        for g in &f.grants {
            if g.client_uid == g.server_uid {
                return Err(ConfigError(format!(
                    "grant: client_uid and server_uid are both {}: processes of one user connect without a grant",
                    g.client_uid
                )));
            }
            if g.discriminator_prefix.len() > via_wire::proto::MAX_DISCRIMINATOR {
                return Err(ConfigError(format!(
                    "grant: discriminator_prefix is longer than {} bytes",
                    via_wire::proto::MAX_DISCRIMINATOR
                )));
            }
            grants.push(Grant {
                client_uid: g.client_uid,
                server_uid: g.server_uid,
                prefix: g.discriminator_prefix.as_bytes().to_vec(),
            });
        }
        let l = &f.limits;
        for (name, v) in [
            ("max_fds_per_session", l.max_fds_per_session),
            ("max_fds_per_user", l.max_fds_per_user),
            ("max_connections", l.max_connections),
            ("max_queue", l.max_queue),
        ] {
            if v == Some(0) {
                return Err(ConfigError(format!(
                    "limits.{name} = 0 would refuse every client"
                )));
            }
        }
        if l.hello_timeout_ms == Some(0) {
            return Err(ConfigError(
                "limits.hello_timeout_ms must be positive".into(),
            ));
        }
        Ok(Config {
            policy: SystemPolicy {
                quota,
                users,
                total,
                grants,
            },
            limits: LimitOverrides {
                max_fds_per_session: l.max_fds_per_session,
                max_fds_per_user: l.max_fds_per_user,
                max_pending: l.max_pending,
                max_connections: l.max_connections,
                max_queue: l.max_queue,
                hello_timeout: l.hello_timeout_ms.map(Duration::from_millis),
            },
        })
    }

    /// Reads `path`; `required`: a missing file is an error (else the
    /// defaults apply, and the daemon says so).
    pub fn load(path: &Path, required: bool) -> Result<Config, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(t) => Config::parse(&t, mem_total())
                .map_err(|e| ConfigError(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                log::info!("{} not found: built-in defaults", path.display());
                Config::parse("", mem_total())
            }
            Err(e) => Err(ConfigError(format!("{}: {e}", path.display()))),
        }
    }
}

/// A size for people (`"256 MiB"`), or `unlimited`.
pub fn show(bytes: u64) -> String {
    if bytes == via_wire::proto::UNLIMITED {
        return "unlimited".into();
    }
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{} {unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.policy;
        writeln!(f, "[pinning]")?;
        writeln!(f, "per_process = {:?}", show(p.quota.per_process))?;
        writeln!(f, "per_user = {:?}", show(p.quota.per_user))?;
        writeln!(f, "total = {:?}", show(p.total))?;
        let mut users: Vec<_> = p.users.iter().collect();
        users.sort_by_key(|(u, _)| **u);
        for (uid, q) in users {
            writeln!(f, "\n[[pinning.user]]\nuid = {uid}")?;
            writeln!(f, "per_process = {:?}", show(q.per_process))?;
            writeln!(f, "per_user = {:?}", show(q.per_user))?;
        }
        writeln!(f, "\n[limits]")?;
        let l = &self.limits;
        // A built-in default is printed as a comment: the output is itself
        // a configuration file meaning the same.
        let line = |f: &mut fmt::Formatter<'_>, k: &str, v: Option<u128>| match v {
            Some(v) => writeln!(f, "{k} = {v}"),
            None => writeln!(f, "# {k} = (built-in default)"),
        };
        line(
            f,
            "max_fds_per_session",
            l.max_fds_per_session.map(|v| v as u128),
        )?;
        line(f, "max_fds_per_user", l.max_fds_per_user.map(|v| v as u128))?;
        line(f, "max_pending", l.max_pending.map(|v| v as u128))?;
        line(f, "max_connections", l.max_connections.map(|v| v as u128))?;
        line(f, "max_queue", l.max_queue.map(|v| v as u128))?;
        line(
            f,
            "hello_timeout_ms",
            l.hello_timeout.map(|d| d.as_millis()),
        )?;
        for g in &p.grants {
            writeln!(
                f,
                "\n[[grant]]  # over sockets NICs only\nclient_uid = {}\nserver_uid = {}\ndiscriminator_prefix = {:?}",
                g.client_uid,
                g.server_uid,
                String::from_utf8_lossy(&g.prefix)
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEM: u64 = 8 << 30;

    #[test]
    fn sizes() {
        for (s, b) in [
            ("0", 0),
            ("4096", 4096),
            ("64k", 64 << 10),
            ("512 MiB", 512 << 20),
            ("2G", 2 << 30),
            ("1 TiB", 1 << 40),
            ("3 MB", 3_000_000),
            ("25%", 2 << 30),
        ] {
            assert_eq!(s.parse::<Size>().unwrap().bytes(MEM), b, "{s}");
        }
        assert_eq!("unlimited".parse::<Size>(), Ok(Size::Unlimited));
        for bad in [
            "",
            "MiB",
            "12 parsecs",
            "101%",
            "-1",
            "99999999999 TiB",
            "1.5G",
        ] {
            assert!(bad.parse::<Size>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn empty_file_is_the_defaults() {
        let c = Config::parse("", MEM).unwrap();
        assert_eq!(
            c.policy.quota,
            Quota {
                per_process: DEFAULT_PER_PROCESS,
                per_user: DEFAULT_PER_USER
            }
        );
        assert_eq!(c.policy.total, MEM / 2);
        assert!(c.policy.users.is_empty() && c.policy.grants.is_empty());
        assert_eq!(c.limits, LimitOverrides::default());
    }

    #[test]
    fn a_full_file() {
        let c = Config::parse(
            r#"
            [pinning]
            per_process = "4 MiB"
            per_user = 8388608
            total = "unlimited"
            [[pinning.user]]
            uid = 1000
            per_user = "1G"
            [[pinning.user]]
            uid = 0
            per_process = "unlimited"
            per_user = "unlimited"
            [limits]
            max_connections = 8
            hello_timeout_ms = 250
            [[grant]]
            client_uid = 1001
            server_uid = 1000
            discriminator_prefix = "svc-"
            "#,
            MEM,
        )
        .unwrap();
        let p = &c.policy;
        assert_eq!(p.quota.per_process, 4 << 20);
        assert_eq!(p.quota.per_user, 8 << 20);
        assert_eq!(p.total, via_wire::proto::UNLIMITED);
        assert_eq!(
            p.quota(1000),
            Quota {
                per_process: 4 << 20,
                per_user: 1 << 30
            }
        );
        assert_eq!(p.quota(0).per_process, via_wire::proto::UNLIMITED);
        assert_eq!(p.quota(4242), p.quota);
        assert_eq!(
            p.grants,
            vec![Grant {
                client_uid: 1001,
                server_uid: 1000,
                prefix: b"svc-".to_vec()
            }]
        );
        assert_eq!(c.limits.max_connections, Some(8));
        assert_eq!(c.limits.hello_timeout, Some(Duration::from_millis(250)));
        // What --check-config prints is a file meaning the same.
        let again = Config::parse(&c.to_string(), MEM).unwrap();
        assert_eq!(again, c);
        for mem in [MEM, 1000 * 4096 + 3] {
            let defaults = Config::parse("", mem).unwrap();
            assert_eq!(Config::parse(&defaults.to_string(), mem).unwrap(), defaults);
        }
    }

    #[test]
    fn mistakes_are_errors() {
        for (bad, says) in [
            ("[pinning]\nper_proces = 1", "per_proces"),
            ("[pinning]\nper_process = \"lots\"", "not a size"),
            ("[pinning]\nper_process = -5", "negative"),
            ("colour = 1", "colour"),
            (
                "[[pinning.user]]\nuid = 7\n[[pinning.user]]\nuid = 7",
                "twice",
            ),
            (
                "[[grant]]\nclient_uid = 5\nserver_uid = 5",
                "without a grant",
            ),
            ("[[grant]]\nclient_uid = 5", "server_uid"),
            ("[limits]\nmax_connections = 0", "refuse every client"),
            ("[limits]\nhello_timeout_ms = 0", "positive"),
            ("[pinning", "unclosed table"),
        ] {
            match Config::parse(bad, MEM) {
                Ok(c) => panic!("{bad:?} accepted: {c:?}"),
                Err(e) => assert!(
                    e.0.to_lowercase().contains(&says.to_lowercase()),
                    "{bad:?}: {e}"
                ),
            }
        }
    }

    #[test]
    fn the_example_in_the_repository_parses() {
        let text = include_str!("../../../../pkg/viad.toml");
        let c = Config::parse(text, MEM).unwrap();
        assert_eq!(c.policy.quota.per_process, DEFAULT_PER_PROCESS);
        assert_eq!(c.policy.quota.per_user, DEFAULT_PER_USER);
        assert!(c.policy.grants.is_empty());
    }
}
