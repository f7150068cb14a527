#!/usr/bin/env bash
# check-header.sh: check include/vipl.h as C and C++, and against libvipl.so.
#
# Usage: tools/check-header.sh [path/to/libvipl.so]
#
# 1. Compiles the header with -Wall -Wextra -Werror -pedantic as C89 and C99
#    (tests/c/layout_c89.c, with <stdint.h> and with the C89 fallback),
#    C11 (tests/c/layout.c, compiled and run; again under ASan+UBSan when
#    the toolchain has them), C++98 and C++17 (tests/c/layout_cxx.cpp,
#    compiled and run).
# 2. Checks that a C++ object calling every declared Vip* function
#    references it by its plain C name (the extern "C" guard).
# 3. With a library argument, compares the Vip* functions the header
#    declares with the Vip* symbols `nm -D --defined-only` finds in the
#    library, both ways; without one, prints the declared list.
#
# Exits non-zero if anything fails. CC and CXX select the compilers.
set -u

root=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
header="$root/include/vipl.h"
tests="$root/tests/c"
CC=${CC:-cc}
CXX=${CXX:-c++}
warn=(-Wall -Wextra -Werror -pedantic -Wundef -Wshadow)
cwarn=("${warn[@]}" -Wstrict-prototypes)
inc=(-I"$root/include")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/check-header.XXXXXX") || exit 1
trap 'rm -rf -- "$tmp"' EXIT

passed=0
skipped=0
failed=()

# step NAME COMMAND...: run COMMAND, report it, show its output on failure.
step() {
    local name=$1
    shift
    if "$@" >"$tmp/out" 2>&1; then
        echo "ok    $name"
        passed=$((passed + 1))
    else
        echo "FAIL  $name"
        sed 's/^/      /' "$tmp/out"
        failed+=("$name")
    fi
}

# build_run OUT COMPILER ARGS...: compile to $tmp/OUT, then run it.
build_run() {
    local out=$tmp/$1
    shift
    "$@" -o "$out" && "$out"
}

if [[ ! -r $header ]]; then
    echo "FAIL  $header is missing"
    exit 1
fi

# --- 1. The header in every language mode -------------------------------

for std in c89 c99; do
    step "$std -pedantic, <stdint.h>" \
        build_run "$std" "$CC" -std="$std" "${cwarn[@]}" "${inc[@]}" \
        "$tests/layout_c89.c"
    step "$std -pedantic, C89 fallback types" \
        build_run "$std-fallback" "$CC" -std="$std" "${cwarn[@]}" "${inc[@]}" \
        -DVIPL_NO_STDINT_H "$tests/layout_c89.c"
done

step "c11 layout.c (compile and run)" \
    build_run c11 "$CC" -std=c11 "${cwarn[@]}" "${inc[@]}" "$tests/layout.c"

san=(-fsanitize=address,undefined -fno-sanitize-recover=all)
if echo 'int main(void){return 0;}' |
    "$CC" -x c "${san[@]}" -o "$tmp/san-probe" - >/dev/null 2>&1; then
    step "c11 layout.c under ASan+UBSan" \
        build_run c11-san "$CC" -std=c11 -g "${san[@]}" "${cwarn[@]}" \
        "${inc[@]}" "$tests/layout.c"
else
    echo "SKIP  c11 layout.c under ASan+UBSan: $CC cannot link -fsanitize=address,undefined"
    skipped=$((skipped + 1))
fi

for std in c++98 c++17; do
    step "$std layout_cxx.cpp (compile and run)" \
        build_run "$std" "$CXX" -std="$std" "${warn[@]}" "${inc[@]}" \
        "$tests/layout_cxx.cpp"
done

# --- 2. The declared functions -------------------------------------------

# Preprocessing drops the comments, so only declarations remain; Vip*
# (mixed case) names nothing but the functions.
declared=$("$CC" -E -P -x c "${inc[@]}" "$header" 2>"$tmp/cpp.err" |
    grep -oE '\bVip[A-Za-z0-9_]*[[:space:]]*\(' |
    sed -E 's/[[:space:]]*\($//' | LC_ALL=C sort -u)
if [[ -z $declared ]]; then
    echo "FAIL  no Vip* function found in $header"
    sed 's/^/      /' "$tmp/cpp.err"
    failed+=("function list")
else
    count=$(wc -l <<<"$declared")
    # A C++ object that uses every function must reference each by its
    # unmangled name; a declaration outside the extern "C" guard would
    # show up mangled (_Z...).
    {
        echo '#include <vipl.h>'
        echo 'typedef void (*fn)();'
        echo 'fn all[] = {'
        sed -E 's/.*/    reinterpret_cast<fn>(\&&),/' <<<"$declared"
        echo '};'
    } >"$tmp/linkage.cpp"
    check_linkage() {
        "$CXX" -std=c++98 "${warn[@]}" "${inc[@]}" -c "$tmp/linkage.cpp" \
            -o "$tmp/linkage.o" || return 1
        local referenced
        referenced=$(nm -u "$tmp/linkage.o" | awk '{print $NF}' |
            grep -E '^(_Z.*)?Vip' | LC_ALL=C sort -u)
        if [[ $referenced != "$declared" ]]; then
            echo "C++ references differ from the declared names:"
            diff <(echo "$declared") <(echo "$referenced")
            return 1
        fi
    }
    step "C linkage of all $count functions from C++" check_linkage
fi

# --- 3. The library -------------------------------------------------------

if [[ $# -ge 1 && -n $declared ]]; then
    lib=$1
    compare_library() {
        if [[ ! -r $lib ]]; then
            echo "cannot read $lib"
            return 1
        fi
        local exported
        # Dynamic symbols may carry a version suffix (VipOpenNic@@VIPL_1.0).
        exported=$(nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' |
            sed 's/@.*//' | grep -E '^Vip' | LC_ALL=C sort -u)
        local missing extra
        missing=$(LC_ALL=C comm -23 <(echo "$declared") <(echo "$exported"))
        extra=$(LC_ALL=C comm -13 <(echo "$declared") <(echo "$exported"))
        if [[ -n $missing ]]; then
            echo "declared in vipl.h but not defined by $lib:"
            sed 's/^/  /' <<<"$missing"
        fi
        if [[ -n $extra ]]; then
            echo "defined by $lib but not declared in vipl.h:"
            sed 's/^/  /' <<<"$extra"
        fi
        [[ -z $missing && -z $extra ]]
    }
    step "vipl.h functions == Vip* symbols of $lib" compare_library
elif [[ -n $declared ]]; then
    echo "functions declared in vipl.h ($count):"
    sed 's/^/  /' <<<"$declared"
    echo "(pass the path of libvipl.so to compare them with its symbols)"
fi

# --- Summary --------------------------------------------------------------

if [[ ${#failed[@]} -ne 0 ]]; then
    echo "check-header: ${#failed[@]} failed, $passed passed, $skipped skipped:"
    printf '  %s\n' "${failed[@]}"
    exit 1
fi
echo "check-header: $passed passed, $skipped skipped"
