//! via (skeleton)
