//! Calls the `Vip*` exports directly, as C would, with NULL, garbage,
//! wrong-kind, stale and foreign handles and NULL pointers (the
//! rustls-ffi style). The C suite (`tests/c/suite`, run by
//! `tests/tests/c_suite.rs`) covers the same paths through the installed
//! library, and everything else.
//!
//! Tests that open a NIC need `viad` (built by `cargo build -p via-tools`
//! into the same target directory, or named by `VIA_VIAD`); without it they
//! fail and say so (`tools/test.sh` builds the binaries first).

use core::ffi::c_void;
use core::ptr::null_mut;

use super::boundary::{Status, ffi_boundary, timeout};
use super::types::*;
use super::*;
use crate::error::Error;

/// A non-NULL value that is not a handle of ours.
const GARBAGE: [u64; 5] = [
    1,
    0xdead_beef,
    u64::MAX,
    0x1000_0000_0000_0000,
    0x2fff_0001_0000_ffff,
];

fn h(v: u64) -> *mut c_void {
    super::boundary::opaque(v)
}

/// Checks that the library will find `viad` (the places `agent::spawn`
/// looks in that a test binary can use: `$VIA_VIAD`, beside the test binary
/// or one directory up, `$PATH`), and fails the test with instructions if not.
fn viad_available() -> bool {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("VIA_VIAD") {
        if std::path::Path::new(&p).is_file() {
            return true;
        }
    }
    if let Some(d) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.to_path_buf()))
    {
        dirs.extend(d.parent().map(|u| u.to_path_buf()));
        dirs.push(d);
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    if dirs.iter().any(|d| d.join("viad").is_file()) {
        return true;
    }
    panic!(
        "viad not found: run `cargo build -p via-tools` first (tools/test.sh does), or set VIA_VIAD"
    );
}

fn open() -> VIP_NIC_HANDLE {
    let mut nic = null_mut();
    // SAFETY: a NUL-terminated name and a valid out-pointer.
    let r = unsafe { VipOpenNic(c"via_lo".as_ptr(), &mut nic) };
    assert_eq!(r, VIP_SUCCESS);
    assert!(!nic.is_null());
    nic
}

fn ptag(nic: VIP_NIC_HANDLE) -> VIP_PROTECTION_HANDLE {
    let mut p = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { VipCreatePtag(nic, &mut p) }, VIP_SUCCESS);
    p
}

fn attrs(p: VIP_PROTECTION_HANDLE) -> VIP_VI_ATTRIBUTES {
    VIP_VI_ATTRIBUTES {
        ReliabilityLevel: VIP_SERVICE_RELIABLE_DELIVERY,
        MaxTransferSize: 4096,
        QoS: null_mut(),
        Ptag: p,
        EnableRdmaWrite: VIP_FALSE,
        EnableRdmaRead: VIP_FALSE,
    }
}

fn vi(nic: VIP_NIC_HANDLE, p: VIP_PROTECTION_HANDLE, cq: VIP_CQ_HANDLE) -> VIP_VI_HANDLE {
    let mut a = attrs(p);
    let mut v = null_mut();
    // SAFETY: valid pointers.
    let r = unsafe { VipCreateVi(nic, &mut a, cq, cq, &mut v) };
    assert_eq!(r, VIP_SUCCESS);
    v
}

fn cq(nic: VIP_NIC_HANDLE) -> VIP_CQ_HANDLE {
    let mut c = null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { VipCreateCQ(nic, 16, &mut c) }, VIP_SUCCESS);
    c
}

/// Every function taking a NIC handle refuses `nic`.
fn refuses_nic(nic: VIP_NIC_HANDLE) {
    let mut out = h(0x55);
    let mut na = core::mem::MaybeUninit::<VIP_NIC_ATTRIBUTES>::zeroed();
    let mut ma = VIP_MEM_ATTRIBUTES {
        Ptag: null_mut(),
        EnableRdmaWrite: 0,
        EnableRdmaRead: 0,
    };
    let mut va = attrs(null_mut());
    let mut mh = 7u32;
    let mut buf = [0u8; 64];
    let b = buf.as_mut_ptr().cast::<c_void>();
    let mut addr = [0u8; 64];
    let a = addr.as_mut_ptr().cast::<VIP_NET_ADDRESS>();
    let mut len: VIP_ULONG = 10;
    let mut name = [0 as VIP_CHAR; 10];
    let mut list = VIP_AUTODISCOVERY_LIST {
        NumberOfHops: 0,
        ADAddrArray: null_mut(),
        NumAdAddrs: 0,
    };
    // SAFETY: every pointer is valid; the handle is what is checked.
    let codes = unsafe {
        [
            VipCloseNic(nic),
            VipQueryNic(nic, na.as_mut_ptr()),
            VipRegisterMem(nic, b, 64, &mut ma, &mut mh),
            VipDeregisterMem(nic, b, 1),
            VipQueryMem(nic, b, 1, &mut ma),
            VipSetMemAttributes(nic, b, 1, &mut ma),
            VipErrorCallback(nic, null_mut(), None),
            VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, (&raw mut list).cast()),
            VipCreatePtag(nic, &mut out),
            VipDestroyPtag(nic, out),
            VipCreateVi(nic, &mut va, null_mut(), null_mut(), &mut out),
            VipCreateCQ(nic, 16, &mut out),
            VipConnectWait(nic, a, 0, a, &mut va, &mut out),
            VipNSInit(nic, null_mut()),
            VipNSGetHostByName(nic, c"localhost".as_ptr().cast_mut(), a, 0),
            VipNSGetHostByAddr(nic, a, name.as_mut_ptr(), &mut len),
            VipNSShutdown(nic),
        ]
    };
    for (i, c) in codes.iter().enumerate() {
        assert_eq!(
            *c, VIP_INVALID_PARAMETER,
            "NIC call #{i} with handle {nic:p}"
        );
    }
    assert_eq!(out, h(0x55), "an out-parameter was written on failure");
    assert_eq!((mh, len), (7, 10));
}

/// Every function taking a VI handle refuses `v`.
fn refuses_vi(v: VIP_VI_HANDLE) {
    let mut st: VIP_VI_STATE = 77;
    let mut va = attrs(null_mut());
    let (mut se, mut re) = (77, 77);
    let mut d: *mut VIP_DESCRIPTOR = h(0x40).cast();
    let mut desc = VIP_DESCRIPTOR::default();
    let mut addr = [0u8; 64];
    let a = addr.as_mut_ptr().cast::<VIP_NET_ADDRESS>();
    unsafe extern "C" fn n(
        _: VIP_PVOID,
        _: VIP_NIC_HANDLE,
        _: VIP_VI_HANDLE,
        _: *mut VIP_DESCRIPTOR,
    ) {
    }
    // SAFETY: every pointer is valid; the handle is what is checked.
    let codes = unsafe {
        [
            VipDestroyVi(v),
            VipQueryVi(v, &mut st, &mut va, &mut se, &mut re),
            VipSetViAttributes(v, &mut va),
            VipPostSend(v, &mut desc, 1),
            VipSendDone(v, &mut d),
            VipSendWait(v, 0, &mut d),
            VipSendNotify(v, null_mut(), Some(n)),
            VipPostRecv(v, &mut desc, 1),
            VipRecvDone(v, &mut d),
            VipRecvWait(v, 0, &mut d),
            VipRecvNotify(v, null_mut(), Some(n)),
            VipConnectRequest(v, a, a, 0, &mut va),
            VipDisconnect(v),
            VipConnectPeerRequest(v, a, a, 0),
            VipConnectPeerDone(v, &mut va),
            VipConnectPeerWait(v, &mut va),
        ]
    };
    for (i, c) in codes.iter().enumerate() {
        assert_eq!(*c, VIP_INVALID_PARAMETER, "VI call #{i} with handle {v:p}");
    }
    assert_eq!((st, se, re), (77, 77, 77));
    assert_eq!(d, h(0x40).cast());
}

/// Every function taking a CQ handle refuses `c`.
fn refuses_cq(c: VIP_CQ_HANDLE) {
    let mut v = h(0x55);
    let mut rq = 77;
    unsafe extern "C" fn n(_: VIP_PVOID, _: VIP_NIC_HANDLE, _: VIP_VI_HANDLE, _: VIP_BOOLEAN) {}
    // SAFETY: every pointer is valid; the handle is what is checked.
    let codes = unsafe {
        [
            VipDestroyCQ(c),
            VipResizeCQ(c, 32),
            VipCQDone(c, &mut v, &mut rq),
            VipCQWait(c, 0, &mut v, &mut rq),
            VipCQNotify(c, null_mut(), Some(n)),
        ]
    };
    for (i, code) in codes.iter().enumerate() {
        assert_eq!(
            *code, VIP_INVALID_PARAMETER,
            "CQ call #{i} with handle {c:p}"
        );
    }
    assert_eq!((v, rq), (h(0x55), 77));
}

fn refuses_conn(c: VIP_CONN_HANDLE) {
    // SAFETY: handles are checked values.
    unsafe {
        assert_eq!(VipConnectAccept(c, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipConnectReject(c), VIP_INVALID_PARAMETER);
    }
}

#[test]
fn null_and_garbage_handles_are_refused_without_a_nic() {
    for v in std::iter::once(0).chain(GARBAGE) {
        refuses_nic(h(v));
        refuses_vi(h(v));
        refuses_cq(h(v));
        refuses_conn(h(v));
    }
}

#[test]
fn open_nic_checks_its_arguments() {
    let mut nic = h(0x55);
    // SAFETY: valid pointers and NUL-terminated names.
    unsafe {
        assert_eq!(
            VipOpenNic(c"via_lo".as_ptr(), null_mut()),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipOpenNic(c"/dev/via_nonexistent0".as_ptr(), &mut nic),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipOpenNic(c"eth0".as_ptr(), &mut nic),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipOpenNic(c"/dev/via_\xff".as_ptr(), &mut nic),
            VIP_INVALID_PARAMETER
        );
    }
    assert_eq!(nic, h(0x55));
}

#[test]
fn panics_become_error_resource() {
    fn exported(fail: bool) -> VIP_RETURN {
        ffi_boundary!("test", {
            if fail {
                panic!("boom");
            }
            Status::Err(Error::NotDone)
        })
    }
    assert_eq!(exported(false), VIP_NOT_DONE);
    assert_eq!(exported(true), VIP_ERROR_RESOURCE);
    let string_panic: VIP_RETURN = ffi_boundary!("test", { panic!("{}", String::from("owned")) });
    assert_eq!(string_panic, VIP_ERROR_RESOURCE);
    let ok: VIP_RETURN = ffi_boundary!("test", { Ok(()) });
    assert_eq!(ok, VIP_SUCCESS);
}

#[test]
fn timeouts() {
    assert_eq!(timeout(VIP_INFINITE), None);
    assert_eq!(timeout(VIP_ULONG::MAX), None);
    assert_eq!(timeout(0), Some(std::time::Duration::ZERO));
    assert_eq!(timeout(1500), Some(std::time::Duration::from_millis(1500)));
}

#[test]
fn stale_wrong_kind_and_foreign_handles() {
    if !viad_available() {
        return;
    }
    let a = open();
    let b = open();
    let (pa, pb) = (ptag(a), ptag(b));
    let (ca, cb) = (cq(a), cq(b));
    let va = vi(a, pa, ca);

    // Wrong kinds.
    refuses_nic(va);
    refuses_nic(ca);
    refuses_nic(pa);
    refuses_vi(a);
    refuses_vi(ca);
    refuses_vi(pa);
    refuses_cq(a);
    refuses_cq(va);
    refuses_conn(va);
    refuses_conn(ca);

    // Foreign: B's CQ and ptag used with A.
    let mut at = attrs(pa);
    let mut out = null_mut();
    // SAFETY: valid pointers.
    unsafe {
        assert_eq!(
            VipCreateVi(a, &mut at, cb, null_mut(), &mut out),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipCreateVi(a, &mut at, null_mut(), cb, &mut out),
            VIP_INVALID_PARAMETER
        );
        at.Ptag = pb;
        assert_eq!(
            VipCreateVi(a, &mut at, null_mut(), null_mut(), &mut out),
            VIP_INVALID_PTAG
        );
        at.Ptag = null_mut();
        assert_eq!(
            VipCreateVi(a, &mut at, null_mut(), null_mut(), &mut out),
            VIP_INVALID_PTAG
        );
        assert_eq!(VipDestroyPtag(a, pb), VIP_INVALID_PARAMETER);
        assert_eq!(VipDestroyPtag(b, pa), VIP_INVALID_PARAMETER);
        let mut buf = vec![0u8; 8192];
        let mut ma = VIP_MEM_ATTRIBUTES {
            Ptag: pb,
            EnableRdmaWrite: 0,
            EnableRdmaRead: 0,
        };
        let mut mh = 0;
        assert_eq!(
            VipRegisterMem(a, buf.as_mut_ptr().cast(), 8192, &mut ma, &mut mh),
            VIP_INVALID_PTAG
        );
        assert!(out.is_null());
    }

    // Stale: destroyed VI and CQ.
    // SAFETY: handles are checked values.
    unsafe {
        assert_eq!(VipDestroyCQ(ca), VIP_INVALID_STATE, "a VI uses it");
        assert_eq!(VipDestroyVi(va), VIP_SUCCESS);
        assert_eq!(VipDestroyCQ(ca), VIP_SUCCESS);
    }
    refuses_vi(va);
    refuses_cq(ca);
    // SAFETY: as above.
    unsafe {
        assert_eq!(VipDestroyPtag(a, pa), VIP_SUCCESS);
        assert_eq!(VipDestroyPtag(a, pa), VIP_INVALID_PARAMETER);
    }

    // Stale: a closed NIC and everything of it, also once its slot is reused.
    let vb = vi(b, pb, cb);
    // SAFETY: as above.
    unsafe { assert_eq!(VipCloseNic(b), VIP_SUCCESS) };
    refuses_nic(b);
    refuses_vi(vb);
    refuses_cq(cb);
    let c = open();
    refuses_nic(b);
    refuses_vi(vb);
    // SAFETY: as above.
    unsafe {
        assert_eq!(VipDestroyPtag(c, pb), VIP_INVALID_PARAMETER);
        assert_eq!(VipCloseNic(c), VIP_SUCCESS);
        assert_eq!(VipCloseNic(a), VIP_SUCCESS);
    }
    refuses_nic(a);
}

#[test]
fn null_pointers_are_refused_and_outputs_untouched() {
    if !viad_available() {
        return;
    }
    let nic = open();
    let p = ptag(nic);
    let c = cq(nic);
    let v = vi(nic, p, null_mut());
    let mut at = attrs(p);
    let mut st: VIP_VI_STATE = 0;
    let (mut se, mut re) = (0, 0);
    let mut d: *mut VIP_DESCRIPTOR = h(0x40).cast();
    let mut vh = h(0x55);
    let mut rq = 77;
    // SAFETY: the handles are live; the NULL pointers are what is checked,
    // and the other pointers are valid.
    unsafe {
        assert_eq!(VipQueryNic(nic, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipCreatePtag(nic, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipCreateCQ(nic, 16, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipCreateCQ(nic, 0, &mut vh), VIP_INVALID_PARAMETER);
        assert_eq!(
            VipCreateCQ(nic, VIP_ULONG::MAX, &mut vh),
            VIP_ERROR_RESOURCE
        );
        assert_eq!(
            VipCreateVi(nic, null_mut(), null_mut(), null_mut(), &mut vh),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipCreateVi(nic, &mut at, null_mut(), null_mut(), null_mut()),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipQueryVi(v, null_mut(), &mut at, &mut se, &mut re),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipQueryVi(v, &mut st, null_mut(), &mut se, &mut re),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipQueryVi(v, &mut st, &mut at, null_mut(), &mut re),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipQueryVi(v, &mut st, &mut at, &mut se, null_mut()),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(VipSetViAttributes(v, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipPostSend(v, null_mut(), 1), VIP_INVALID_PARAMETER);
        assert_eq!(VipPostRecv(v, null_mut(), 1), VIP_INVALID_PARAMETER);
        // Misaligned: refused before anything reads it.
        assert_eq!(VipPostRecv(v, h(0x1008).cast(), 1), VIP_DESCRIPTOR_ERROR);
        assert_eq!(VipSendDone(v, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipRecvWait(v, 0, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipRecvDone(v, &mut d), VIP_NOT_DONE);
        assert_eq!(VipRecvWait(v, 1, &mut d), VIP_TIMEOUT);
        assert_eq!(d, h(0x40).cast());
        assert_eq!(VipSendNotify(v, null_mut(), None), VIP_INVALID_PARAMETER);
        assert_eq!(VipCQDone(c, null_mut(), &mut rq), VIP_INVALID_PARAMETER);
        assert_eq!(VipCQDone(c, &mut vh, null_mut()), VIP_INVALID_PARAMETER);
        assert_eq!(VipCQDone(c, &mut vh, &mut rq), VIP_NOT_DONE);
        assert_eq!(VipCQNotify(c, null_mut(), None), VIP_INVALID_PARAMETER);
        assert_eq!((vh, rq), (h(0x55), 77));
        assert_eq!(
            VipConnectRequest(v, null_mut(), null_mut(), 0, &mut at),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipConnectPeerRequest(v, null_mut(), null_mut(), 0),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipConnectWait(nic, null_mut(), 0, null_mut(), &mut at, &mut vh),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipNSGetHostByName(nic, null_mut(), null_mut(), 0),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipNSGetHostByAddr(nic, null_mut(), null_mut(), null_mut()),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipQuerySystemManagementInfo(nic, VIP_SMI_AUTODISCOVERY, null_mut()),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipQuerySystemManagementInfo(nic, 2, null_mut()),
            VIP_INVALID_PARAMETER
        );
        let mut ma = VIP_MEM_ATTRIBUTES {
            Ptag: p,
            EnableRdmaWrite: 0,
            EnableRdmaRead: 0,
        };
        let mut mh = 9;
        assert_eq!(
            VipRegisterMem(nic, null_mut(), 64, &mut ma, &mut mh),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipRegisterMem(nic, h(0x1000), 0, &mut ma, &mut mh),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipRegisterMem(nic, h(0x1000), 64, null_mut(), &mut mh),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(
            VipRegisterMem(nic, h(0x1000), 64, &mut ma, null_mut()),
            VIP_INVALID_PARAMETER
        );
        assert_eq!(mh, 9);
        assert_eq!(VipDestroyVi(v), VIP_SUCCESS);
        assert_eq!(VipCloseNic(nic), VIP_SUCCESS);
    }
}

#[test]
fn handles_name_their_nic() {
    if !viad_available() {
        return;
    }
    let a = open();
    let p = ptag(a);
    let v = vi(a, p, null_mut());
    let (nic, core) = handles::vi_from(v).expect("live VI");
    assert_eq!(handles::vi_handle(&nic, core.slot, core.generation), v);
    assert_eq!(handles::nic_handle(&nic), a);
    let q = handles::ptag_of(&nic, p).expect("live ptag");
    assert_eq!(handles::ptag_handle(&nic, q), p);
    drop((nic, core));
    // SAFETY: handles are checked values.
    unsafe {
        assert_eq!(VipDestroyVi(v), VIP_SUCCESS);
        assert_eq!(VipCloseNic(a), VIP_SUCCESS);
    }
}

/// The posting and polling calls find a VI through this thread's recent
/// handles once it has been used (`handles::with_vi`), and through the NIC's
/// table the first time: both give the same answers, and a VI destroyed
/// while cached is refused.
#[test]
fn cached_vi_handles_give_the_same_answers() {
    if !viad_available() {
        return;
    }
    let nic = open();
    let p = ptag(nic);
    let v = vi(nic, p, null_mut());
    // An idle VI: the first call of each kind misses the cache (a fresh
    // VI), the second hits it.
    let mut desc = VIP_DESCRIPTOR::default();
    let misaligned = (&raw mut desc)
        .cast::<u8>()
        .wrapping_add(8)
        .cast::<VIP_DESCRIPTOR>();
    for round in 0..2 {
        let mut d: *mut VIP_DESCRIPTOR = h(0x40).cast();
        // SAFETY: valid pointers (the misaligned one is refused unread).
        let codes = unsafe {
            [
                VipPostSend(v, &mut desc, 1),
                VipPostRecv(v, misaligned, 1),
                VipPostSend(v, null_mut(), 1),
                VipSendDone(v, &mut d),
                VipRecvDone(v, &mut d),
                VipRecvDone(v, null_mut()),
            ]
        };
        assert_eq!(
            codes,
            [
                VIP_INVALID_STATE,
                VIP_DESCRIPTOR_ERROR,
                VIP_INVALID_PARAMETER,
                VIP_NOT_DONE,
                VIP_NOT_DONE,
                VIP_INVALID_PARAMETER,
            ],
            "round {round}"
        );
        assert_eq!(d, h(0x40).cast(), "round {round}: output written");
    }
    // SAFETY: a checked handle.
    unsafe { assert_eq!(VipDestroyVi(v), VIP_SUCCESS) };
    refuses_vi(v);
    // SAFETY: as above.
    unsafe { assert_eq!(VipCloseNic(nic), VIP_SUCCESS) };
}

/// More VIs than a thread caches, used in turn, give the same answers as
/// one; a lookup inside a running call (found through `last_vi`'s cells)
/// replaces no cache entry, so the VI the call runs on stays owned; a VI
/// destroyed while cached is refused, and the others still answer.
#[test]
fn more_vis_than_cached_and_nested_lookups() {
    if !viad_available() {
        return;
    }
    let nic = open();
    let p = ptag(nic);
    let vs: Vec<_> = (0..6).map(|_| vi(nic, p, null_mut())).collect();
    let done = |v| {
        let mut d: *mut VIP_DESCRIPTOR = null_mut();
        // SAFETY: a checked handle and a valid out-pointer.
        unsafe { VipSendDone(v, &mut d) }
    };
    for _ in 0..3 {
        for &v in &vs {
            assert_eq!(done(v), VIP_NOT_DONE);
        }
    }
    // Cached now (the last used), so the call below runs through a cell.
    assert_eq!(done(vs[0]), VIP_NOT_DONE);
    let before = handles::cached_vi_bits();
    let slot = handles::with_vi(vs[0], |_, v0| {
        assert!(super::last_vi::busy());
        for &v in &vs[1..] {
            handles::with_vi(v, |_, _| Ok(())).unwrap();
        }
        assert_eq!(
            handles::cached_vi_bits(),
            before,
            "nothing replaced while a call runs"
        );
        Ok(v0.slot)
    })
    .unwrap();
    assert!(!super::last_vi::busy());
    let (_, v0) = handles::vi_from(vs[0]).unwrap();
    assert_eq!(slot, v0.slot);
    drop(v0);
    // SAFETY: a checked handle.
    unsafe { assert_eq!(VipDestroyVi(vs[0]), VIP_SUCCESS) };
    refuses_vi(vs[0]);
    for _ in 0..2 {
        for &v in &vs[1..] {
            assert_eq!(done(v), VIP_NOT_DONE);
        }
        assert_eq!(done(vs[0]), VIP_INVALID_PARAMETER);
    }
    for &v in &vs[1..] {
        // SAFETY: as above.
        unsafe { assert_eq!(VipDestroyVi(v), VIP_SUCCESS) };
        refuses_vi(v);
    }
    // SAFETY: as above.
    unsafe { assert_eq!(VipCloseNic(nic), VIP_SUCCESS) };
}

/// `VipRegisterMem` and `VipDeregisterMem` find their NIC through this
/// thread's cells: with more NICs in use than cells, each registers and
/// deregisters right, a closed one is refused while its cell still names it,
/// and the others go on.
#[test]
fn more_nics_than_cached_register_through_cells() {
    if !viad_available() {
        return;
    }
    let nics: Vec<_> = (0..6).map(|_| open()).collect();
    let tags: Vec<_> = nics.iter().map(|&n| ptag(n)).collect();
    let mut buf = vec![0u8; 3 * 4096];
    let addr = buf
        .as_mut_ptr()
        .wrapping_add(4096 - buf.as_ptr().addr() % 4096);
    let addr = addr.cast::<c_void>();
    let round = |i: usize| {
        let mut a = VIP_MEM_ATTRIBUTES {
            Ptag: tags[i],
            EnableRdmaWrite: 0,
            EnableRdmaRead: 0,
        };
        let mut mh = 0;
        // SAFETY: `addr` is 8 KiB inside `buf`, which outlives every
        // registration; the other arguments are checked values.
        unsafe {
            let r = VipRegisterMem(nics[i], addr, 4096, &mut a, &mut mh);
            if r != VIP_SUCCESS {
                return r;
            }
            // Another NIC's handle does not name this region.
            let other = nics[(i + 1) % nics.len()];
            assert_eq!(VipDeregisterMem(other, addr, mh), VIP_INVALID_PARAMETER);
            VipDeregisterMem(nics[i], addr, mh)
        }
    };
    for _ in 0..3 {
        for i in 0..nics.len() {
            assert_eq!(round(i), VIP_SUCCESS, "NIC {i}");
        }
    }
    // The last one used sits in a cell now: closed, it is refused there.
    assert_eq!(round(5), VIP_SUCCESS);
    // SAFETY: a checked handle.
    unsafe { assert_eq!(VipCloseNic(nics[5]), VIP_SUCCESS) };
    assert_eq!(round(5), VIP_INVALID_PARAMETER);
    refuses_nic(nics[5]);
    for (i, &n) in nics[..5].iter().enumerate() {
        assert_eq!(round(i), VIP_SUCCESS, "NIC {i} after another closed");
        // SAFETY: as above.
        unsafe { assert_eq!(VipCloseNic(n), VIP_SUCCESS) };
        assert_eq!(round(i), VIP_INVALID_PARAMETER);
    }
    drop(buf);
}

/// `VipRegisterMem` checks the tag in the registration, not at the C
/// boundary: a destroyed tag is refused whether or not a registration of
/// it was parked before, and a parked one comes back only for its own tag.
#[test]
fn registrations_check_their_tag_parked_or_not() {
    if !viad_available() {
        return;
    }
    let a = open();
    let (p, q) = (ptag(a), ptag(a));
    let mut buf = vec![0u8; 3 * 4096];
    let at = (4096 - buf.as_ptr() as usize % 4096) % 4096;
    let addr: *mut c_void = buf[at..].as_mut_ptr().cast();
    let ma = |t| VIP_MEM_ATTRIBUTES {
        Ptag: t,
        EnableRdmaWrite: 0,
        EnableRdmaRead: 0,
    };
    let mut h = 0;
    // SAFETY: `addr` is 8 KiB of `buf`, which outlives every registration;
    // the other arguments are checked values.
    unsafe {
        for _ in 0..3 {
            assert_eq!(
                VipRegisterMem(a, addr, 8192, &mut ma(p), &mut h),
                VIP_SUCCESS
            );
            assert_eq!(VipDeregisterMem(a, addr, h), VIP_SUCCESS);
        }
        let nic = handles::nic_from(a).unwrap();
        assert!(
            nic.parked_hits() >= 2 || nic.process.monitor.is_none(),
            "repeated registrations come back parked"
        );
        drop(nic);
        // Parked under `p`: `q` gets its own registration.
        assert_eq!(
            VipRegisterMem(a, addr, 8192, &mut ma(q), &mut h),
            VIP_SUCCESS
        );
        let mut got = std::mem::zeroed::<VIP_MEM_ATTRIBUTES>();
        assert_eq!(VipQueryMem(a, addr, h, &mut got), VIP_SUCCESS);
        assert_eq!(got.Ptag, q);
        assert_eq!(VipDeregisterMem(a, addr, h), VIP_SUCCESS);
        assert_eq!(
            VipDestroyPtag(a, p),
            VIP_SUCCESS,
            "parked ones do not hold it"
        );
        assert_eq!(
            VipRegisterMem(a, addr, 8192, &mut ma(p), &mut h),
            VIP_INVALID_PTAG
        );
        assert_eq!(
            VipRegisterMem(a, addr, 8192, &mut ma(q), &mut h),
            VIP_SUCCESS
        );
        assert_eq!(VipDeregisterMem(a, addr, h), VIP_SUCCESS);
        assert_eq!(VipDestroyPtag(a, q), VIP_SUCCESS);
        assert_eq!(
            VipRegisterMem(a, addr, 8192, &mut ma(q), &mut h),
            VIP_INVALID_PTAG
        );
        assert_eq!(VipCloseNic(a), VIP_SUCCESS);
    }
}

/// Handles do not survive `fork`: in the child, the VI cells of the
/// forking thread are empty (the fork handler of `last_vi`), so a handle
/// the parent used goes through the checked lookup, which refuses it.
/// The child only looks at its cells (thread-local, no lock another test
/// thread could have held at the fork) and leaves with `_exit`.
#[test]
fn a_forked_child_finds_no_vi_in_its_cells() {
    if !viad_available() {
        return;
    }
    let nic = open();
    let p = ptag(nic);
    let v = vi(nic, p, null_mut());
    let bits = super::boundary::opaque_value(v);
    let mut d: *mut VIP_DESCRIPTOR = null_mut();
    // SAFETY: valid pointers. The lookup puts the VI in one of this
    // thread's cells.
    assert_eq!(unsafe { VipSendDone(v, &mut d) }, VIP_NOT_DONE);
    assert!(super::last_vi::with(bits, |_, _| ()).is_ok(), "in a cell");
    // A registration puts the NIC in one of this thread's NIC cells.
    let nic_bits = super::boundary::opaque_value(nic);
    let mut buf = vec![0u8; 2 * 4096];
    let addr = buf.as_mut_ptr().cast::<c_void>();
    let mut ma = VIP_MEM_ATTRIBUTES {
        Ptag: p,
        EnableRdmaWrite: 0,
        EnableRdmaRead: 0,
    };
    let mut mh = 0;
    // SAFETY: `buf` outlives the registration; checked values.
    unsafe {
        assert_eq!(
            VipRegisterMem(nic, addr, 4096, &mut ma, &mut mh),
            VIP_SUCCESS
        );
        assert_eq!(VipDeregisterMem(nic, addr, mh), VIP_SUCCESS);
    }
    assert!(
        super::last_vi::enter_nic(nic_bits).is_some(),
        "NIC in a cell"
    );
    // SAFETY: the child runs thread-local code only, then `_exit` (no
    // destructors, no harness).
    let child = unsafe { libc::fork() };
    assert!(child >= 0);
    if child == 0 {
        let vi_found = super::last_vi::with(bits, |_, _| ()).is_ok();
        let nic_found = super::last_vi::enter_nic(nic_bits).is_some();
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(i32::from(vi_found) + 2 * i32::from(nic_found)) };
    }
    let mut st = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        // SAFETY: our child, a valid status pointer.
        let r = unsafe { libc::waitpid(child, &mut st, libc::WNOHANG) };
        if r == child {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the child hangs");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(
        libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
        "the child found its parent's VI (exit 1) or NIC (exit 2) in a cell (status {st:#x})"
    );
    // The parent's cells still answer.
    assert!(super::last_vi::with(bits, |_, _| ()).is_ok());
    assert!(super::last_vi::enter_nic(nic_bits).is_some());
    drop(buf);
    // SAFETY: checked handles.
    unsafe {
        assert_eq!(VipDestroyVi(v), VIP_SUCCESS);
        assert_eq!(VipCloseNic(nic), VIP_SUCCESS);
    }
}
