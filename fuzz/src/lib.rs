//! Fuzz targets of via-rs.
//!
//! Each target is a plain function of the input bytes, here in the library,
//! so that one piece of code serves three runners:
//!
//! * `cargo fuzz run -s none <target>` (libFuzzer, coverage-guided, on
//!   stable): the thin binaries in `fuzz_targets/` call these functions;
//! * the bounded run in `tools/test.sh` (the same binaries, a few seconds
//!   each, starting from the seed corpus in `seeds/`);
//! * `cargo test` in this directory, which replays `seeds/` and every
//!   crash saved under `regressions/` without libFuzzer.
//!
//! | target | what it drives | what it checks |
//! |---|---|---|
//! | [`viad_request`] | `via::proto::{Request, Reply}::decode` on arbitrary bytes | no panic; allocation bounded by the frame size; `decode(encode(decode(x))) == decode(x)` |
//! | [`viad_broker`] | viad's state machine (`tools/src/bin/viad/broker.rs`, compiled in unchanged) fed by frames of several sessions, deaths and clock ticks | no panic; replies only to live sessions, each one encodable and decodable; at most one reply per request, and one for every request with a finite deadline |
//! | [`viad_socket`] | a real `viad` fed hostile frames (and fds) over its socket | viad never dies and keeps answering a well-behaved client; every frame it sends decodes |
//! | [`descriptor`] | `VipPostSend`/`VipPostRecv` of fuzzed descriptors on connected VIs of a real NIC | post result and completion status as documented; no hang; no byte written outside the receive buffers, RDMA targets and control segments the descriptors name |

pub mod alloc;
pub mod broker;
pub mod descriptor;
pub mod env;
pub mod input;
pub mod request;
pub mod seeds;
pub mod socket;

pub use broker::viad_broker;
pub use descriptor::descriptor;
pub use request::viad_request;
pub use socket::viad_socket;

/// Makes a panic on any thread abort the process, as libFuzzer's own hook
/// does: the C ABI turns panics into `VIP_ERROR_RESOURCE` and the provider
/// thread would otherwise die quietly, hiding the bug from the runner.
pub fn abort_on_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            std::process::abort();
        }));
    });
}
