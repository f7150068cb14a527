/* reuse.c: memory that goes away under a registration, as legacy
 * programs do it: registered memory is unmapped, trimmed, discarded,
 * moved or freed (without deregistering it first), and new memory appears
 * at the same address and is registered again. The new registration must
 * reach the new pages (data never lands in the old ones), and the old
 * handle must be dead (RDMA_PROT_ERROR at the initiator, nothing written).
 * Every way memory can go away: munmap, mmap(MAP_FIXED) over it, brk
 * shrink (glibc's heap trim), madvise(MADV_DONTNEED), mremap, and free of
 * a large malloc block. Each way twice: with the registration live when
 * the memory goes away, and with it deregistered first (the provider may
 * keep a deregistered registration cached, or parked whole, for the same
 * bytes: the new memory must not find it). Parent: owner of the memory;
 * child: initiator of RDMA writes over an unreliable VI (a refused write
 * keeps the connection). */
#include "common.h"

#include <errno.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#define L (256 * 1024)

enum way { W_MUNMAP, W_FIXED, W_BRK, W_DONTNEED, W_MREMAP, W_FREE, W_COUNT };
static const char *way_name[W_COUNT] = {
    "munmap", "mmap(MAP_FIXED) over it", "brk shrink (heap trim)",
    "madvise(MADV_DONTNEED)", "mremap", "free of a large malloc block",
};

static unsigned char *map_at(void *at)
{
    void *p = mmap(at, L, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0), -1, 0);
    CHECK_MSG(p != MAP_FAILED, "mmap: %s", strerror(errno));
    CHECK_MSG(!at || p == at, "mmap at %p gave %p", at, p);
    return p;
}

/* The first memory, for `way`. */
static unsigned char *first(enum way w)
{
    switch (w) {
    case W_BRK: {
        /* From the top of glibc's heap: freeing it trims the heap (brk shrink). */
        unsigned char *p;
        mallopt(M_MMAP_THRESHOLD, 64 << 20);
        mallopt(M_TRIM_THRESHOLD, 64 * 1024);
        mallopt(M_TOP_PAD, 0);
        p = malloc(L);
        CHECK(p != NULL);
        return p;
    }
    case W_FREE: {
        unsigned char *p;
        mallopt(M_MMAP_THRESHOLD, 128 * 1024);
        p = malloc(L);
        CHECK(p != NULL);
        return p;
    }
    default:
        return map_at(NULL);
    }
}

/* Makes the memory at p go away; returns new memory of L bytes, at p when
 * the way allows it (and says so in *same). */
static unsigned char *replace(enum way w, unsigned char *p, int *same)
{
    unsigned char *q = NULL;
    void *moved;
    switch (w) {
    case W_MUNMAP:
        CHECK(munmap(p, L) == 0);
        q = map_at(p);
        break;
    case W_FIXED:
        q = mmap(p, L, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        CHECK(q == p);
        break;
    case W_DONTNEED:
        CHECK(madvise(p, L, MADV_DONTNEED) == 0);
        q = p;
        break;
    case W_MREMAP:
        /* Moved away (the old address is free), then new memory there. */
        moved = mremap(p, L, L, MREMAP_MAYMOVE | MREMAP_FIXED, map_at(NULL));
        CHECK_MSG(moved != MAP_FAILED, "mremap: %s", strerror(errno));
        q = map_at(p);
        CHECK(munmap(moved, L) == 0);
        break;
    case W_BRK:
    case W_FREE: {
        void *before = sbrk(0);
        free(p);
        if (w == W_BRK && sbrk(0) >= before) {
            /* Something of the library lies above it on the heap: trim what
             * can be trimmed (brk shrink, or madvise of the free pages). */
            malloc_trim(0);
            printf("note: %s: heap top %s after malloc_trim\n", way_name[w],
                   sbrk(0) < before ? "shrank" : "kept; pages discarded");
        }
        q = malloc(L);
        CHECK(q != NULL);
        break;
    }
    default:
        CHECK(0);
    }
    *same = q == p;
    return q;
}

/* The parent owns the memory. */
static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 1 << 20, 1, 0), NULL, NULL);
    int i;
    accept_on(nic, vi, disc("reuse"));
    for (i = 0; i < 2 * W_COUNT; i++) {
        enum way w = (enum way)(i % W_COUNT);
        int deregistered_first = i >= W_COUNT;
        unsigned char *m1 = first(w), *m2;
        VIP_MEM_HANDLE h1, h2;
        VIP_MEM_ATTRIBUTES ma;
        int same;
        long bad;

        fill(m1, L, 1000 + w);
        h1 = reg_mem(nic, m1, L, tag, 1, 0);
        if (deregistered_first) {
            /* Twice: the second is served by what the first left cached. */
            OK(VipDeregisterMem(nic, m1, h1));
            h1 = reg_mem(nic, m1, L, tag, 1, 0);
            OK(VipDeregisterMem(nic, m1, h1));
        }
        m2 = replace(w, m1, &same);
        if (!same)
            printf("note: %s: the new memory is at %p, not %p\n", way_name[w], (void *)m2, (void *)m1);
        fill(m2, L, 2000 + w);
        h2 = reg_mem(nic, m2, L, tag, 1, 0);
        CHECK_MSG(h2 != h1, "%s: the new registration got the old handle", way_name[w]);
        /* The old handle is dead for queries too. */
        EXPECT_RC(VipQueryMem(nic, m1, h1, &ma), VIP_INVALID_PARAMETER);

        say_u64((uint64_t)(uintptr_t)m1);
        say_u64(h1);
        say_u64((uint64_t)(uintptr_t)m2);
        say_u64(h2);
        barrier(1); /* the child's writes are done */
        bad = check_fill(m2, L, 3000 + w);
        CHECK_MSG(bad == -1, "%s: the write through the new handle did not reach the new pages "
                  "(byte %ld differs)", way_name[w], bad);
        /* Deregistering the dead handle still works (and only once). */
        if (!deregistered_first)
            OK(VipDeregisterMem(nic, m1, h1));
        EXPECT_RC(VipDeregisterMem(nic, m1, h1), VIP_INVALID_PARAMETER);
        OK(VipDeregisterMem(nic, m2, h2));
        if (w == W_BRK || w == W_FREE)
            free(m2);
        else
            CHECK(munmap(m2, L) == 0);
        printf("ok: %s%s\n", way_name[w], deregistered_first ? " (deregistered first)" : "");
    }
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

/* The child writes through both handles. */
static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 1 << 20, 1, 0), NULL, NULL);
    region r = region_new(nic, tag, L + 4096, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&r, 0);
    unsigned char *src = r.base + 4096;
    int i;
    connect_to(nic, vi, disc("reuse"));
    for (i = 0; i < 2 * W_COUNT; i++) {
        int w = i % W_COUNT;
        uint64_t a1 = hear_u64(), h1 = hear_u64(), a2 = hear_u64(), h2 = hear_u64();
        /* Through the old handle: refused, nothing written. */
        fill(src, L, 4000 + w);
        rdma_write_wait(vi, d, src, r.mh, r.mh, a1, (VIP_MEM_HANDLE)h1, L);
        CHECK_MSG(d->CS.Status & VIP_STATUS_RDMA_PROT_ERROR,
                  "%s: a write through the dead handle completed with status 0x%x",
                  way_name[w], (unsigned)d->CS.Status);
        /* Through the new one: lands in the new memory. */
        fill(src, L, 3000 + w);
        rdma_write_wait(vi, d, src, r.mh, r.mh, a2, (VIP_MEM_HANDLE)h2, L);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE);
        barrier(1);
    }
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("reuse", 120, parent, child); }
