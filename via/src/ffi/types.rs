//! VIPL structure layouts (skeleton).
