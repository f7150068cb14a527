//! libvipl (skeleton)
