fn main() {
    // A versioned soname, as a C library is expected to carry.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvmpi.so.0");
}
