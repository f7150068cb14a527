//! cq (skeleton)
