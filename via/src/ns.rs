//! The name service (`VipNS*`): host names to VIA host addresses and back,
//! answered in the calling process from its own environment: this host's
//! name and `localhost` (the address viad gave in its Welcome), plus the
//! lines of `$VIA_HOSTS` (default `/etc/via_hosts`: `name hexaddress`),
//! read at each call. (Resolving in the daemon made a program that started
//! while another program's viad ran see that program's host file.)
#![forbid(unsafe_code)]

pub use via_wire::hosts::{host_table, hosts_path, parse_hex, parse_hosts};

use crate::error::{Error, Result};
use crate::nic::NicInner;
use via_wire::hosts::{lookup_addr, lookup_name};
use via_wire::proto;

/// Host address of `name`.
pub(crate) fn by_name(nic: &NicInner, name: &str) -> Result<Vec<u8>> {
    if name.len() > proto::MAX_NAME {
        return Err(Error::InvalidParameter);
    }
    let p = &nic.process;
    lookup_name(name, &p.host_name, &p.host, &host_table()).ok_or(Error::NameService)
}

/// Host name of `host`.
pub(crate) fn by_addr(nic: &NicInner, host: &[u8]) -> Result<String> {
    if host.len() > proto::MAX_HOST {
        return Err(Error::InvalidParameter);
    }
    let p = &nic.process;
    lookup_addr(host, &p.host_name, &p.host, &host_table()).ok_or(Error::NameService)
}
