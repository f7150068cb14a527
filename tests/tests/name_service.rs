//! The name service of each process honours that process's own
//! environment: two programs with different `VIA_HOSTS` files, sharing one
//! viad (started by the first, with the first's environment), each resolve
//! the names of their own file.

use via_tests::*;

const PEER: &str = env!("CARGO_BIN_EXE_via-peer");

#[test]
fn each_process_reads_its_own_hosts_file() {
    let inst = format!("via-ns-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("via-ns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (fa, fb) = (dir.join("hosts-a"), dir.join("hosts-b"));
    std::fs::write(&fa, "# A's hosts\nalpha 0a0b0c0d0e0f\n").unwrap();
    std::fs::write(&fb, "beta 010203040506\n").unwrap();
    let sock = via::agent::place::user_socket_for(&inst).unwrap();
    assert!(listener_pid(&sock).is_none());

    let env_a = [
        ("VIA_INSTANCE", inst.as_str()),
        ("VIA_HOSTS", fa.to_str().unwrap()),
    ];
    let mut a = Peer::spawn_env(PEER, &["serve"], &env_a);
    a.cmd_expect("open u 4096 0 0", "MEM");
    let viad = listener_pid(&sock).expect("A started viad");
    let env_b = [
        ("VIA_INSTANCE", inst.as_str()),
        ("VIA_HOSTS", fb.to_str().unwrap()),
    ];
    let mut b = Peer::spawn_env(PEER, &["serve"], &env_b);
    b.cmd_expect("open u 4096 0 0", "MEM");
    assert_eq!(listener_pid(&sock), Some(viad), "B has a viad of its own");

    assert_eq!(a.cmd("resolve alpha"), "ADDR 0a0b0c0d0e0f");
    assert_eq!(a.cmd("resolve beta"), "NSERR NameService");
    assert_eq!(b.cmd("resolve beta"), "ADDR 010203040506");
    assert_eq!(b.cmd("resolve alpha"), "NSERR NameService");
    // This host's names come from the shared daemon and agree.
    let la = a.cmd_expect("resolve localhost", "ADDR");
    assert_eq!(b.cmd_expect("resolve localhost", "ADDR"), la);
    let host = via::sys::hostname();
    assert_eq!(a.cmd_expect(&format!("resolve {host}"), "ADDR"), la);
    a.exit();
    b.exit();
    let _ = std::fs::remove_dir_all(&dir);
}
