/*
 * layout_c89.c: the layout table of layout.c, checked by a C89 compiler.
 *
 * tools/check-header.sh builds it as C89 and C99, each with <stdint.h> and
 * with the header's C89 fallback (-DVIPL_NO_STDINT_H). A failed check is a
 * negative array size, so the build fails.
 */
#include <vipl.h>

#include <stddef.h>
#include <stdint.h>

#define VIPL_CAT2(a, b) a##b
#define VIPL_CAT(a, b) VIPL_CAT2(a, b)
#define VIPL_ASSERT(cond) \
    typedef char VIPL_CAT(vipl_check_, __LINE__)[(cond) ? 1 : -1];

#define VIPL_CHECK_SIZE(type, n) VIPL_ASSERT(sizeof(type) == (n))
#define VIPL_CHECK_OFFSET(type, member, n) \
    VIPL_ASSERT(offsetof(type, member) == (n))
#define VIPL_CHECK_CONST(name, value) VIPL_ASSERT((name) == (value))
/* Alignment without _Alignof: where a member of that type lands after a char. */
#define VIPL_CHECK_ALIGN(type, n)                                    \
    struct VIPL_CAT(vipl_align_, __LINE__) { char c; type t; };      \
    VIPL_ASSERT(offsetof(struct VIPL_CAT(vipl_align_, __LINE__), t) == (n))
#include "layout_table.h"

/*
 * The fixed-width types are the very types of <stdint.h>, whichever branch
 * of vipl.h defined them: redeclaring a function with an incompatible
 * parameter type is an error.
 */
void vipl_same_u8(uint8_t *p);
void vipl_same_u8(VIP_UINT8 *p);
void vipl_same_u16(uint16_t *p);
void vipl_same_u16(VIP_UINT16 *p);
void vipl_same_u32(uint32_t *p);
void vipl_same_u32(VIP_UINT32 *p);
void vipl_same_u64(uint64_t *p);
void vipl_same_u64(VIP_UINT64 *p);

int main(void)
{
    return 0;
}
