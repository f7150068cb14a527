//! The hosts file (`$VIA_HOSTS`, default `/etc/via_hosts`: `name
//! hexaddress` per line) and lookups in it: what the library's name service
//! answers from, in each process from that process's own environment.
#![forbid(unsafe_code)]

use crate::proto;

/// The hosts file this process uses: `$VIA_HOSTS`, else `/etc/via_hosts`.
pub fn hosts_path() -> String {
    std::env::var("VIA_HOSTS").unwrap_or_else(|_| "/etc/via_hosts".into())
}

/// Parses a host address written in hex (colons allowed between bytes).
pub fn parse_hex(s: &str) -> Option<Vec<u8>> {
    let s: String = s.chars().filter(|c| *c != ':').collect();
    if s.is_empty() || s.len() % 2 != 0 || s.len() / 2 > proto::MAX_HOST {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The entries of a hosts file's text: `name hexaddress` per line, `#`
/// comments; malformed lines are skipped.
pub fn parse_hosts(text: &str) -> Vec<(String, Vec<u8>)> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?.to_string();
            let addr = parse_hex(it.next()?)?;
            Some((name, addr))
        })
        .collect()
}

/// The entries of this process's hosts file (none if it cannot be read).
pub fn host_table() -> Vec<(String, Vec<u8>)> {
    std::fs::read_to_string(hosts_path())
        .map(|t| parse_hosts(&t))
        .unwrap_or_default()
}

/// Resolves `name` given this host's name and address and a table.
pub fn lookup_name(
    name: &str,
    host_name: &str,
    host: &[u8],
    table: &[(String, Vec<u8>)],
) -> Option<Vec<u8>> {
    let n = name.trim_end_matches('.');
    if n == host_name || n == "localhost" || n.is_empty() {
        return Some(host.to_vec());
    }
    table.iter().find(|(h, _)| h == n).map(|(_, a)| a.clone())
}

/// Resolves `addr` given this host's name and address and a table.
pub fn lookup_addr(
    addr: &[u8],
    host_name: &str,
    host: &[u8],
    table: &[(String, Vec<u8>)],
) -> Option<String> {
    if addr == host {
        return Some(host_name.to_string());
    }
    table
        .iter()
        .find(|(_, a)| a == addr)
        .map(|(n, _)| n.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_file_and_lookups() {
        let t = parse_hosts("# c\nalpha 0a0b0c0d0e0f\nbad zz\nbeta 01:02:03:04:05:06\n\n");
        assert_eq!(
            t,
            vec![
                ("alpha".into(), vec![10, 11, 12, 13, 14, 15]),
                ("beta".into(), vec![1, 2, 3, 4, 5, 6])
            ]
        );
        let me = [9u8, 9, 9, 9, 9, 9];
        assert_eq!(lookup_name("box", "box", &me, &t), Some(me.to_vec()));
        assert_eq!(lookup_name("localhost.", "box", &me, &t), Some(me.to_vec()));
        assert_eq!(
            lookup_name("beta", "box", &me, &t),
            Some(vec![1, 2, 3, 4, 5, 6])
        );
        assert_eq!(lookup_name("gamma", "box", &me, &t), None);
        assert_eq!(lookup_addr(&me, "box", &me, &t), Some("box".into()));
        assert_eq!(
            lookup_addr(&[1, 2, 3, 4, 5, 6], "box", &me, &t),
            Some("beta".into())
        );
        assert_eq!(parse_hex("0g"), None);
        assert_eq!(parse_hex("é1"), None);
    }
}
