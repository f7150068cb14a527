#!/usr/bin/env bash
# install.sh: build libvipl and viad, and install them under a prefix.
#
# Usage: tools/install.sh [--debug] [PREFIX]
#
# PREFIX defaults to /usr/local. DESTDIR is honoured (staged installs):
# files go to $DESTDIR$PREFIX, and vipl.pc names $PREFIX. The build is
# `cargo build --release` (--debug: the dev profile) in $CARGO_TARGET_DIR,
# or target/ of the source tree when that is not set; VIA_FEATURES adds
# cargo features (VIA_FEATURES=via/verbs: the verbs kind of NIC).
#
# Installs:
#   PREFIX/include/vipl.h
#   PREFIX/lib/libvipl.so.1.0.0, libvipl.so.1 -> it, libvipl.so -> libvipl.so.1
#   PREFIX/lib/libvipl.a
#   PREFIX/lib/pkgconfig/vipl.pc
#   PREFIX/libexec/via-rs/viad   (the library finds it relative to itself)
#   PREFIX/lib/systemd/system/via-rs-viad.service   (the system daemon's unit,
#       with PREFIX's paths; not enabled: `systemctl enable --now via-rs-viad`)
#   PREFIX/share/via-rs/viad.toml   (its configuration, commented; copy it to
#       /etc/via-rs/viad.toml to change the defaults)
#
# Afterwards a legacy VIA program builds with
#   cc app.c -I$PREFIX/include -L$PREFIX/lib -lvipl [-Wl,-rpath,$PREFIX/lib]
# or with `pkg-config --cflags --libs vipl` (PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
# for a prefix pkg-config does not search). Static linking:
#   cc app.c $(pkg-config --static --cflags --libs vipl) -static-libgcc ...
# needs viad in PATH or VIA_VIAD (a static program cannot locate the library).
set -euo pipefail

profile=release
prefix=
for a in "$@"; do
    case $a in
    --debug) profile=debug ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
    -*)
        echo "install.sh: unknown option $a" >&2
        exit 2
        ;;
    *)
        if [[ -n $prefix ]]; then
            echo "install.sh: more than one PREFIX" >&2
            exit 2
        fi
        prefix=$a
        ;;
    esac
done
prefix=${prefix:-/usr/local}
case $prefix in
/*) ;;
*) prefix=$(cd -- "$(dirname -- "$prefix")" && pwd)/$(basename -- "$prefix") ;;
esac

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
cargo=${CARGO:-cargo}

# ABI version of the library file (soname libvipl.so.1 is set by
# via/capi/build.rs); the VIPL interface is 1.0.
abi=1.0.0
major=${abi%%.*}
# What a static link of libvipl.a needs besides it
# (`cargo rustc -p vipl --crate-type staticlib -- --print native-static-libs`).
private_libs="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"

flags=()
[[ $profile == release ]] && flags+=(--release)
# Cargo features of the build, e.g. VIA_FEATURES=via/verbs (the verbs kind).
[[ -n ${VIA_FEATURES:-} ]] && flags+=(--features "$VIA_FEATURES")
(
    cd "$root"
    CARGO_TARGET_DIR=$target "$cargo" build "${flags[@]}" -p vipl --lib
    CARGO_TARGET_DIR=$target "$cargo" build "${flags[@]}" -p via-tools --bin viad
)
out=$target/$profile
for f in libvipl.so libvipl.a viad; do
    if [[ ! -f $out/$f ]]; then
        echo "install.sh: $out/$f was not built" >&2
        exit 1
    fi
done

dest=${DESTDIR:-}$prefix
install -d "$dest/include" "$dest/lib/pkgconfig" "$dest/libexec/via-rs" \
    "$dest/lib/systemd/system" "$dest/share/via-rs"
install -m 0644 "$root/include/vipl.h" "$dest/include/vipl.h"
install -m 0755 "$out/libvipl.so" "$dest/lib/libvipl.so.$abi"
ln -sfn "libvipl.so.$abi" "$dest/lib/libvipl.so.$major"
ln -sfn "libvipl.so.$major" "$dest/lib/libvipl.so"
install -m 0644 "$out/libvipl.a" "$dest/lib/libvipl.a"
install -m 0755 "$out/viad" "$dest/libexec/via-rs/viad"
sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$abi|g" -e "s|@PRIVATE_LIBS@|$private_libs|g" \
    "$root/pkg/vipl.pc.in" >"$dest/lib/pkgconfig/vipl.pc"
chmod 0644 "$dest/lib/pkgconfig/vipl.pc"
sed -e "s|/usr/local/|$prefix/|g" "$root/pkg/systemd/via-rs-viad.service" \
    >"$dest/lib/systemd/system/via-rs-viad.service"
chmod 0644 "$dest/lib/systemd/system/via-rs-viad.service"
install -m 0644 "$root/pkg/viad.toml" "$dest/share/via-rs/viad.toml"

echo "installed libvipl $abi ($profile) under ${DESTDIR:+$DESTDIR}$prefix"
