//! criterion benches live in benches/benches/.
