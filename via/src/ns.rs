//! The name service (`VipNS*`): host names to VIA host addresses and back,
//! answered in the calling process from its own environment: this host's
//! name and `localhost` (the address viad gave in its Welcome), plus the
//! lines of `$VIA_HOSTS` (default `/etc/via_hosts`: `name hexaddress`),
//! read at each call. (Resolving in the daemon made a program that started
//! while another program's viad ran see that program's host file.)
//!
//! A sockets NIC (`via_<ifname>`) has IPv4 host addresses: this host is its
//! interface's address, and names the table lacks go to the system resolver
//! (`getaddrinfo`, first IPv4 address); addresses the table lacks are looked
//! up in `/etc/hosts`.
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
    let me = nic.host_address();
    if let Some(a) = lookup_name(name, &p.host_name, &me, &host_table()) {
        return Ok(a);
    }
    if nic.dev.local_address().is_none() {
        return Err(Error::NameService);
    }
    use std::net::ToSocketAddrs;
    (name, 0u16)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| {
            it.find_map(|a| match a.ip() {
                std::net::IpAddr::V4(v4) => Some(v4.octets().to_vec()),
                std::net::IpAddr::V6(_) => None,
            })
        })
        .ok_or(Error::NameService)
}

/// The first name of IPv4 address `host` in an `/etc/hosts` text.
fn etc_hosts_name(text: &str, host: &[u8]) -> Option<String> {
    let want: [u8; 4] = host.try_into().ok()?;
    let want = std::net::Ipv4Addr::from(want);
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let ip: std::net::Ipv4Addr = w.next()?.parse().ok()?;
            (ip == want).then(|| w.next().map(str::to_string)).flatten()
        })
}

/// Host name of `host`.
pub(crate) fn by_addr(nic: &NicInner, host: &[u8]) -> Result<String> {
    if host.len() > proto::MAX_HOST {
        return Err(Error::InvalidParameter);
    }
    let p = &nic.process;
    if let Some(n) = lookup_addr(host, &p.host_name, &nic.host_address(), &host_table()) {
        return Ok(n);
    }
    if nic.dev.local_address().is_none() {
        return Err(Error::NameService);
    }
    std::fs::read_to_string("/etc/hosts")
        .ok()
        .and_then(|t| etc_hosts_name(&t, host))
        .ok_or(Error::NameService)
}

#[cfg(test)]
mod tests {
    #[test]
    fn etc_hosts_reverse() {
        let t = "127.0.0.1 localhost\n# 10.0.0.9 commented\n10.0.0.2\tnodeb nodeb.example # x\n";
        assert_eq!(
            super::etc_hosts_name(t, &[10, 0, 0, 2]).as_deref(),
            Some("nodeb")
        );
        assert_eq!(super::etc_hosts_name(t, &[10, 0, 0, 9]), None);
        assert_eq!(super::etc_hosts_name(t, &[10, 0, 0]), None);
    }
}
