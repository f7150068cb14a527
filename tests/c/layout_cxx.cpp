/*
 * layout_cxx.cpp: the layout table of layout.c, checked by a C++ compiler
 * (C++98 and later). static_assert from C++11, a negative array size
 * before. Also checks that the typedefs name the expected C++ types and
 * that the header's declarations have C linkage.
 *
 * Built and run by tools/check-header.sh as C++98 and C++17.
 */
#include <vipl.h>

#include <cstddef>
#include <cstdio>

#define VIPL_CAT2(a, b) a##b
#define VIPL_CAT(a, b) VIPL_CAT2(a, b)

#if __cplusplus >= 201103L
#define VIPL_ASSERT(cond, what) static_assert(cond, what);
#else
#define VIPL_ASSERT(cond, what) \
    typedef char VIPL_CAT(vipl_check_, __LINE__)[(cond) ? 1 : -1];
#endif

#define VIPL_CHECK_SIZE(type, n) \
    VIPL_ASSERT(sizeof(type) == (n), "sizeof(" #type ") == " #n)
#define VIPL_CHECK_OFFSET(type, member, n)      \
    VIPL_ASSERT(offsetof(type, member) == (n), \
                "offsetof(" #type ", " #member ") == " #n)
#define VIPL_CHECK_CONST(name, value) \
    VIPL_ASSERT((name) == (value), #name " == " #value)
/* Alignment without alignof: where a member of that type lands after a char. */
#define VIPL_CHECK_ALIGN(type, n)                                              \
    struct VIPL_CAT(vipl_align_, __LINE__) { char c; type t; };                \
    VIPL_ASSERT(offsetof(struct VIPL_CAT(vipl_align_, __LINE__), t) == (n),    \
                "alignment of " #type " == " #n)
#include "layout_table.h"

namespace {

template <class A, class B> struct same { enum { value = 0 }; };
template <class A> struct same<A, A> { enum { value = 1 }; };

#define EXPECT_TYPE(A, B) VIPL_ASSERT((same<A, B>::value), #A " is " #B)

EXPECT_TYPE(VIP_UINT8, unsigned char)
EXPECT_TYPE(VIP_UINT16, unsigned short)
EXPECT_TYPE(VIP_UINT32, unsigned int)
EXPECT_TYPE(VIP_UINT64, unsigned long)
EXPECT_TYPE(VIP_PVOID, void *)
EXPECT_TYPE(VIP_BOOLEAN, int)
EXPECT_TYPE(VIP_CHAR, char)
EXPECT_TYPE(VIP_UCHAR, unsigned char)
EXPECT_TYPE(VIP_USHORT, unsigned short)
EXPECT_TYPE(VIP_ULONG, unsigned long)
EXPECT_TYPE(VIP_MEM_HANDLE, unsigned int)
EXPECT_TYPE(VIP_RELIABILITY_LEVEL, unsigned short)
EXPECT_TYPE(VIP_NIC_HANDLE, void *)
EXPECT_TYPE(VIP_VI_HANDLE, void *)
EXPECT_TYPE(VIP_CQ_HANDLE, void *)
EXPECT_TYPE(VIP_PROTECTION_HANDLE, void *)
EXPECT_TYPE(VIP_CONN_HANDLE, void *)
EXPECT_TYPE(VIP_QOS, void *)

/* An application's handlers, declared the way C++ programs write them. */
void on_error(VIP_PVOID, VIP_ERROR_DESCRIPTOR *) {}
void on_desc(VIP_PVOID, VIP_NIC_HANDLE, VIP_VI_HANDLE, VIP_DESCRIPTOR *) {}
void on_cq(VIP_PVOID, VIP_NIC_HANDLE, VIP_VI_HANDLE, VIP_BOOLEAN) {}

} // namespace

/* If the header had declared VipPostSend with C++ linkage, this extern "C"
 * redeclaration would be an error. (tools/check-header.sh checks the
 * linkage of every function through the symbols a C++ object references.) */
extern "C" VIP_RETURN VipPostSend(VIP_VI_HANDLE, VIP_DESCRIPTOR *,
                                  VIP_MEM_HANDLE);

int main()
{
    VIP_ERROR_HANDLER e = on_error;
    VIP_NOTIFY_HANDLER d = on_desc;
    VIP_CQ_NOTIFY_HANDLER q = on_cq;
    VIP_DESCRIPTOR desc;
    desc.CS.Status = VIP_STATUS_DONE;
    desc.DS[0].Local.Data.Address = &desc;
    if (e == 0 || d == 0 || q == 0 ||
        desc.DS[0].Local.Data.Address != static_cast<void *>(&desc) ||
        (desc.CS.Status & VIP_STATUS_ERROR_MASK) != 0) {
        std::puts("layout_cxx: FAIL");
        return 1;
    }
    std::printf("layout_cxx: ok (C++ %ld)\n", static_cast<long>(__cplusplus));
    return 0;
}
