//! How the crates fit together, checked on the built binaries.

use std::process::Command;

use via_tests::ensure_viad;

/// viad speaks the wire protocol (`via-wire`) and makes system calls
/// (`via-sys`); it must not carry the provider (`via`): a daemon that
/// linked the object model and the soft NIC would run their code with the
/// daemon's privileges.
#[test]
fn viad_does_not_link_the_provider() {
    ensure_viad();
    let viad = via::agent::find_viad().expect("viad");
    let out = Command::new("nm")
        .args(["-C", "--defined-only"])
        .arg(&viad)
        .output()
        .expect("nm (binutils) runs");
    assert!(out.status.success(), "nm failed on {}", viad.display());
    let syms = String::from_utf8_lossy(&out.stdout);
    let name = |l: &str| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" ");
    // The check itself works: the wire protocol's code is there.
    assert!(
        syms.lines().any(|l| name(l).starts_with("via_wire::")),
        "no via_wire symbol in {}: is it stripped?",
        viad.display()
    );
    let provider: Vec<String> = syms
        .lines()
        .map(name)
        .filter(|n| n.starts_with("via::") || n.starts_with("<via::"))
        .take(5)
        .collect();
    assert!(provider.is_empty(), "viad links the provider: {provider:?}");
}
