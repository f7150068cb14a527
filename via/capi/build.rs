fn main() {
    // A versioned soname, as a C library is expected to carry.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libvipl.so.1");
    // Never unloaded: once the unmap hooks are in place (`via::mem::
    // unmap_hook`), libc's `munmap` jumps into this library.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
