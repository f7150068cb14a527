//! The baseline of the verbs kind's post cost: a bare `ibv_post_send` on an
//! RC QP connected to itself, measured the way `tests/tests/verbs.rs`
//! measures `Vi::post_send` (the path of `VipPostSend`) in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ibv::{self, Context, Cq, Pd, Qp, Remote, SendOp, SendReq, Sge, Transport, Wc};
use super::{PORT, pick_gid};

/// Posts in flight at once (then their completions are taken, untimed).
pub(crate) const BATCH: u32 = 32;

/// Mean time of one `ibv_post_send` call (an 8-byte RDMA write, signalled)
/// over `iters` posts on device `name`, in batches of [`BATCH`]; the
/// completions are taken outside the timed calls.
///
/// # Errors
/// The device's, if it cannot be opened or set up.
pub(crate) fn bare_post(name: &str, iters: u32) -> std::io::Result<Duration> {
    let ctx = Arc::new(Context::open(Some(name))?);
    let port = ctx.port(PORT)?;
    let (gid_index, gid) = pick_gid(&ctx);
    let pd = Pd::new(&ctx)?;
    let cq = Cq::new(&ctx, 1024)?;
    let buf = vec![0u8; 4096].into_boxed_slice();
    let va = buf.as_ptr() as u64;
    let access = ibv::ACCESS_LOCAL_WRITE | ibv::ACCESS_REMOTE_WRITE;
    // SAFETY: `buf` lives until the end of the function, after `mr` (dropped
    // first: declared later).
    #[allow(unsafe_code)]
    let mr = unsafe { pd.register(va, 4096, access)? };
    let qp = Qp::new(&pd, &cq, Transport::Rc, 64, 1)?;
    qp.init(PORT, access)?;
    let psn = super::new_psn();
    let me = Remote {
        qpn: qp.qpn,
        psn,
        lid: port.lid,
        gid,
        global: port.ethernet,
    };
    qp.connect(&me, psn, port.active_mtu, PORT, gid_index)?;
    let sge = [Sge {
        addr: va,
        len: 8,
        lkey: mr.lkey,
    }];
    let req = SendReq {
        wr_id: 1,
        op: SendOp::Write {
            remote_va: va + 2048,
            rkey: mr.rkey,
        },
        imm: None,
        sges: &sge,
    };
    let mut total = Duration::ZERO;
    let mut wc = [Wc::default(); 16];
    let mut done = 0;
    while done < iters {
        // A batch of posts, timed one by one; then its completions.
        let n = BATCH.min(iters - done);
        for _ in 0..n {
            let t = Instant::now();
            qp.post_send(&[req]).map_err(|e| e.1)?;
            total += t.elapsed();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = 0;
        while got < n {
            let k = cq.poll(&mut wc);
            if let Some(w) = wc[..k].iter().find(|w| w.status != ibv::WC_SUCCESS) {
                return Err(std::io::Error::other(ibv::status_str(w.status)));
            }
            got += k as u32;
            if k == 0 {
                if Instant::now() > deadline {
                    return Err(std::io::Error::other("no completion in 10 s"));
                }
                std::thread::yield_now();
            }
        }
        done += n;
    }
    drop(qp);
    drop(mr);
    drop(buf);
    Ok(total / iters.max(1))
}
