//! Multi-process jobs of the Rust API under `via-run` (the scenarios of
//! `vmpi-check`): point-to-point across the eager/rendezvous boundary,
//! randomised ANY_SOURCE/ANY_TAG matching, every collective against a
//! serial reference with each algorithm forced, offloaded collectives;
//! 2 to 16 processes on this 2-core machine (waits block, see docs/vmpi.md).

mod common;

use common::check;

#[test]
fn point_to_point() {
    check("p2p2", 2, &[("VMPI_RING", "on")], &["p2p"]);
    check("p2p2-send", 2, &[("VMPI_RING", "off")], &["p2p"]);
    check("p2p3", 3, &[], &["p2p"]);
    // A tiny eager limit: most messages take the rendezvous path (two
    // processes: one peer, no CQ, reads waited for on the send queue).
    check("p2p-rndv", 3, &[("VMPI_EAGER_LIMIT", "64")], &["p2p"]);
    for ring in ["on", "off"] {
        check(
            &format!("p2p2-rndv-{ring}"),
            2,
            &[("VMPI_EAGER_LIMIT", "64"), ("VMPI_RING", ring)],
            &["p2p"],
        );
    }
}

#[test]
fn short_cuts_of_the_common_case_and_their_fallbacks() {
    // Two processes: messages through the write ring (on even where
    // processes would outnumber cores), then through sends into posted
    // receives, without the poll of the receive's status before the wait
    // (as when processes outnumber cores) and with a long one.
    let ring = [("VMPI_RING", "on"), ("VMPI_CHECK_RINGS", "1")];
    check("fast2", 2, &ring, &["fastpath"]);
    let send = [("VMPI_RING", "off"), ("VMPI_CHECK_RINGS", "0")];
    check("fast2-send", 2, &send, &["fastpath"]);
    check(
        "fast2-nopoll",
        2,
        &[send[0], send[1], ("VMPI_POLL", "0")],
        &["fastpath"],
    );
    check(
        "fast2-longpoll",
        2,
        &[send[0], send[1], ("VMPI_POLL", "100000")],
        &["fastpath"],
    );
    // Two slots: send descriptor slots cycle through messages, credit
    // returns and rendezvous reads; senders wait for credits.
    check(
        "fast2-slots",
        2,
        &[("VMPI_SLOTS", "2"), ("VMPI_EAGER_LIMIT", "4096")],
        &["fastpath"],
    );
    check(
        "fast2-slots-send",
        2,
        &[
            ("VMPI_SLOTS", "2"),
            ("VMPI_EAGER_LIMIT", "4096"),
            ("VMPI_RING", "off"),
        ],
        &["fastpath"],
    );
    // More peers: receives through the CQ (no ring).
    check(
        "fast3",
        3,
        &[
            ("VMPI_SLOTS", "4"),
            ("VMPI_RING", "on"),
            ("VMPI_CHECK_RINGS", "0"),
        ],
        &["fastpath"],
    );
    // The two-process allreduce straight on the engine, and its fallback
    // when a send cannot go at once (two slots: often no credit).
    check("coll2-slots", 2, &[("VMPI_SLOTS", "2")], &["coll", "quick"]);
}

#[test]
fn bad_input_gives_the_expected_error_classes() {
    check("errors2", 2, &[], &["errors"]);
    check("errors3", 3, &[], &["errors"]);
}

#[test]
fn randomised_matching_with_wildcards() {
    check("match2", 2, &[("VMPI_RING", "on")], &["matching", "1"]);
    check("match4", 4, &[], &["matching", "2"]);
    check("match8", 8, &[], &["matching", "3"]);
    // Two receive slots per channel: senders wait for credits all the time.
    check(
        "match-credits",
        4,
        &[("VMPI_SLOTS", "2"), ("VMPI_EAGER_LIMIT", "256")],
        &["matching", "4"],
    );
    // The same with one peer: direct receives, their deferred re-posts
    // and credit waits, through the write ring and through sends.
    for ring in ["on", "off"] {
        check(
            &format!("match2-credits-{ring}"),
            2,
            &[
                ("VMPI_SLOTS", "2"),
                ("VMPI_EAGER_LIMIT", "256"),
                ("VMPI_RING", ring),
            ],
            &["matching", "5"],
        );
    }
}

#[test]
fn collectives_against_serial_references() {
    for n in [2, 3, 5] {
        check(&format!("coll{n}"), n, &[], &["coll"]);
    }
    check("coll16", 16, &[], &["coll", "quick"]);
}

#[test]
fn each_algorithm_forced() {
    let small_seg = ("VMPI_SEGMENT", "256");
    let rndv = ("VMPI_EAGER_LIMIT", "128");
    let cases: &[&[(&str, &str)]] = &[
        &[
            ("VMPI_ALLREDUCE", "recursive_doubling"),
            ("VMPI_BARRIER", "tree"),
        ],
        &[("VMPI_ALLREDUCE", "rabenseifner"), rndv],
        &[("VMPI_ALLREDUCE", "ring"), ("VMPI_ALLGATHER", "ring")],
        &[("VMPI_ALLREDUCE", "reduce_bcast"), ("VMPI_K", "3")],
        &[
            ("VMPI_REDUCE", "pipeline"),
            small_seg,
            ("VMPI_SCAN", "pipeline"),
        ],
        &[
            ("VMPI_REDUCE", "rabenseifner"),
            ("VMPI_BCAST", "scatter_allgather"),
            rndv,
        ],
        &[
            ("VMPI_REDUCE", "knomial"),
            ("VMPI_BCAST", "knomial"),
            ("VMPI_K", "4"),
            ("VMPI_BARRIER", "tree"),
        ],
        &[
            ("VMPI_ALLGATHER", "recursive_doubling"),
            ("VMPI_SCAN", "recursive_doubling"),
        ],
    ];
    for (i, env) in cases.iter().enumerate() {
        for n in [4, 7] {
            check(&format!("algo{i}-{n}"), n, env, &["coll", "quick"]);
        }
    }
}

#[test]
fn offloaded_barrier_and_bcast() {
    for n in [2, 5, 8] {
        check(
            &format!("off{n}"),
            n,
            &[("VMPI_COLL", "offload")],
            &["offload"],
        );
    }
    // The other collectives still run host-based beside the offload context.
    check(
        "off-coll",
        4,
        &[("VMPI_COLL", "offload")],
        &["coll", "quick"],
    );
}

/// Finalize right after the last messages: the provider delivers a posted
/// send later than the post when its engine thread runs it
/// (`VIA_PROGRESS=thread`), and a disconnect flushes what is still on the
/// send queue. Finalize must wait for its sends to complete: before it did,
/// rank 0's last barrier release was flushed and a child waited for ever
/// in 7 of 8 such jobs (their `finish` time limit then fails the test).
/// The offload context's progress thread closed the context's NIC as it
/// ended, flushing what its engine thread had not run yet.
#[test]
fn finalize_waits_for_the_last_sends() {
    let thread = ("VIA_PROGRESS", "thread");
    for i in 0..4 {
        check(
            &format!("fin{i}"),
            4,
            &[thread, ("VMPI_BARRIER", "tree"), ("VMPI_K", "4")],
            &["fastpath"],
        );
    }
    // The offload context's last releases: lost in about 1 job of 40
    // before its NIC stayed open until they were out (below 1 in 200 now).
    for i in 0..3 {
        check(
            &format!("fin-off{i}"),
            4,
            &[thread, ("VMPI_COLL", "offload")],
            &["offload"],
        );
    }
}

/// The same layer, unchanged, on another kind of NIC: the sockets NIC
/// (TCP through a veth interface in a network namespace; needs root,
/// skipped loudly otherwise), point-to-point and every collective.
#[test]
fn on_the_sockets_nic() {
    let Some(ns) = common::Netns::new("sock") else {
        return;
    };
    common::build(false);
    let dev = format!("via_{}", ns.ifname);
    // Two processes: the sockets NIC does not store a write's last word
    // last, so no write ring even though one is asked for; messages go by
    // send into posted receives.
    for (name, n, args, rings) in [
        ("sock-fast2", 2, &["fastpath"][..], Some("0")),
        ("sock-p2p", 3, &["p2p"][..], None),
        ("sock-coll", 4, &["coll", "quick"], None),
    ] {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &ns.name, env!("CARGO_BIN_EXE_via-run")])
            .arg("-n")
            .arg(n.to_string())
            .arg(env!("CARGO_BIN_EXE_vmpi-check"))
            .args(args)
            .env("VIA_DEVICE", &dev)
            // One instance for both jobs: one viad per host serves the
            // sockets NIC's TCP port.
            .env("VIA_INSTANCE", format!("vmpi-{}-sock", std::process::id()))
            .env_remove("VMPI_COLL")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        if let Some(r) = rings {
            c.env("VMPI_RING", "on").env("VMPI_CHECK_RINGS", r);
        }
        let o = common::finish(c.spawn().expect("ip netns exec via-run"));
        assert!(
            o.code == Some(0) && o.output.contains("PASS"),
            "{name} on {dev} failed (exit {:?} after {:?}):\n{}",
            o.code,
            o.elapsed,
            o.output
        );
    }
}
