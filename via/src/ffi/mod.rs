//! The VIPL 1.0 C ABI (`include/vipl.h`).
#![allow(non_snake_case, non_camel_case_types)]

pub mod types;
