//! `viad_request`: the viad wire decoder on arbitrary bytes.
//!
//! The same bytes go to `Request::decode` (what viad runs on every frame a
//! client sends) and to `Reply::decode` (what the library runs on every
//! frame viad sends). Checked:
//!
//! * no panic;
//! * decoding allocates at most [`ALLOC_BOUND`] bytes at once, whatever
//!   lengths the frame claims;
//! * a frame that decodes re-encodes to exactly the same bytes (the
//!   encoding is canonical), so `decode(encode(decode(x))) == decode(x)`.

use via::proto::{MAX_FRAME, Reply, Request};

use crate::alloc::Measure;

/// Most bytes decoding one frame may have live at once.
pub const ALLOC_BOUND: usize = 2 * MAX_FRAME;

pub fn viad_request(data: &[u8]) {
    let m = Measure::start();
    let req = Request::decode(data);
    let rep = Reply::decode(data);
    let u = m.finish();
    assert!(
        u.peak <= ALLOC_BOUND,
        "decoding {} bytes allocated {u:?} (bound {ALLOC_BOUND})",
        data.len()
    );
    if let Ok((id, r)) = req {
        let again = r.encode(id);
        assert!(
            again.len() <= MAX_FRAME,
            "{r:?} encodes to {} bytes",
            again.len()
        );
        assert_eq!(again, data, "request {r:?} id {id} re-encodes differently");
        assert_eq!(Request::decode(&again), Ok((id, r)));
    }
    if let Ok((id, r)) = rep {
        let again = r.encode(id);
        assert!(
            again.len() <= MAX_FRAME,
            "{r:?} encodes to {} bytes",
            again.len()
        );
        assert_eq!(again, data, "reply {r:?} id {id} re-encodes differently");
        assert_eq!(Reply::decode(&again), Ok((id, r)));
    }
}
