fn main() {
    // A versioned soname, as a C library is expected to carry.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvipl.so.1");
}
