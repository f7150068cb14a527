//! regcache (skeleton)
