//! [`DeviceRef`]: the NIC's device, called without the address arithmetic
//! of an `Arc<dyn Device>`.
//!
//! Why: a call through `Arc<dyn Device>` first finds the device inside the
//! `Arc`'s allocation, whose offset depends on the device type's alignment,
//! read from the vtable (five instructions before every call). Every post
//! and every poll makes such calls. A reference taken once, when the NIC
//! opens, holds the device's address itself.

use std::ptr::NonNull;
use std::sync::Arc;

use super::Device;

/// An owned device (the `Arc` a kind's `open` returned) and a pointer to it.
pub(crate) struct DeviceRef {
    /// Keeps the device alive as long as `raw` is used.
    arc: Arc<dyn Device>,
    /// `&*arc`, computed once.
    raw: NonNull<dyn Device>,
}

// SAFETY: `raw` points into `arc`'s allocation, which `DeviceRef` owns a
// reference count of; sharing or sending a `DeviceRef` shares or sends what
// an `Arc<dyn Device>` would, and `Device: Send + Sync`.
unsafe impl Send for DeviceRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for DeviceRef {}

impl DeviceRef {
    pub fn new(arc: Arc<dyn Device>) -> DeviceRef {
        let raw = NonNull::from(&*arc);
        DeviceRef { arc, raw }
    }

    /// The owning `Arc` (for a holder that outlives the NIC).
    pub fn arc(&self) -> &Arc<dyn Device> {
        &self.arc
    }
}

impl std::ops::Deref for DeviceRef {
    type Target = dyn Device;

    #[inline(always)]
    fn deref(&self) -> &(dyn Device + 'static) {
        // SAFETY: `raw` was made from `&*self.arc`, and `self.arc` (never
        // replaced: the field is private and set only in `new`) keeps the
        // device alive at that address for as long as `self`, which the
        // returned reference cannot outlive. The device is only shared.
        unsafe { self.raw.as_ref() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::Process;

    #[test]
    fn the_reference_is_the_owned_device_and_lives_as_long_as_it() {
        let p = Process::without_daemon();
        let arc = crate::backend::loopback::open(&p, 0, "loopback").unwrap();
        let weak = Arc::downgrade(&arc);
        let r = DeviceRef::new(arc);
        // The same device, at the same address, through either.
        assert!(std::ptr::addr_eq(
            &*r as *const dyn Device,
            Arc::as_ptr(r.arc())
        ));
        assert_eq!(r.polls(), r.arc().polls());
        // A holder of the Arc keeps the device after the reference goes.
        let held = r.arc().clone();
        drop(r);
        assert!(weak.upgrade().is_some());
        drop(held);
        assert!(
            weak.upgrade().is_none(),
            "the last owner dropped the device"
        );
    }
}
