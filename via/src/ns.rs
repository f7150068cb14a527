//! The name service (`VipNS*`), answered by viad: host names to VIA host
//! addresses and back. Entries: this host's name and `localhost`, plus the
//! lines of `$VIA_HOSTS` (default `/etc/via_hosts`: `name hexaddress`).
#![forbid(unsafe_code)]

use crate::error::{Error, Result};
use crate::nic::NicInner;
use crate::proto::{Reply, Request};

/// Host address of `name`.
pub fn by_name(nic: &NicInner, name: &str) -> Result<Vec<u8>> {
    if name.len() > crate::proto::MAX_NAME {
        return Err(Error::InvalidParameter);
    }
    let r = nic
        .process
        .agent
        .call(&Request::ResolveName { name: name.into() }, None)
        .map_err(|_| Error::NameService)?;
    match r.0 {
        Reply::Address { host } => Ok(host),
        _ => Err(Error::NameService),
    }
}

/// Host name of `host`.
pub fn by_addr(nic: &NicInner, host: &[u8]) -> Result<String> {
    if host.len() > crate::proto::MAX_HOST {
        return Err(Error::InvalidParameter);
    }
    let r = nic
        .process
        .agent
        .call(
            &Request::ResolveAddr {
                host: host.to_vec(),
            },
            None,
        )
        .map_err(|_| Error::NameService)?;
    match r.0 {
        Reply::Name { name } => Ok(name),
        _ => Err(Error::NameService),
    }
}
