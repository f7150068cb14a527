/* regreuse.c: another thread frees or unmaps a buffer that was registered
 * and deregistered (so the provider keeps it cached or parked), and this
 * thread maps new memory at the same address the instant it is free and
 * registers it, as a multithreaded message layer does with its buffers.
 * The new registration must reach the new pages: a peer's RDMA write
 * through it lands in the new memory, every round. (The kernel frees the
 * address before it reports the unmap, so a provider that learns of unmaps
 * only from the kernel would hand out the old memory's registration here;
 * docs/registration.md §2.) Parent: owner of the memory; child: writer. */
#include "common.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define L (256 * 1024)
#define ROUNDS 200

static atomic_int go;

struct block {
    unsigned char *bytes; /* what is registered */
    unsigned char *start; /* the mapping */
    size_t len;
    int freed; /* by free(), else munmap */
};

static void *goes_away(void *arg)
{
    struct block *b = arg;
    while (!atomic_load(&go))
        ;
    if (b->freed)
        free(b->bytes);
    else
        CHECK(munmap(b->start, b->len) == 0);
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 1 << 20, 1, 0), NULL, NULL);
    int i, reused = 0;
    /* Large blocks mapped alone, whatever was freed before. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    accept_on(nic, vi, disc("regreuse"));
    for (i = 0; i < ROUNDS; i++) {
        struct block b;
        pthread_t t;
        unsigned char *m;
        VIP_MEM_HANDLE h;
        size_t off;
        double deadline;
        long bad;

        b.freed = i % 2;
        if (b.freed) {
            b.bytes = malloc(L);
            CHECK(b.bytes != NULL);
            /* glibc's block mapped alone: the header's IS_MMAPPED bit. */
            CHECK(((size_t *)b.bytes)[-1] & 2);
            b.start = (unsigned char *)((uintptr_t)b.bytes & ~(uintptr_t)4095);
            b.len = (((uintptr_t)b.bytes + L + 4095) & ~(uintptr_t)4095) - (uintptr_t)b.start;
        } else {
            b.start = b.bytes = mmap(NULL, L, PROT_READ | PROT_WRITE,
                                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            CHECK(b.bytes != MAP_FAILED);
            b.len = L;
        }
        off = (size_t)(b.bytes - b.start);
        fill(b.bytes, L, 1000 + i);
        /* Registered and deregistered: kept cached or parked. */
        h = reg_mem(nic, b.bytes, L, tag, 1, 0);
        OK(VipDeregisterMem(nic, b.bytes, h));

        atomic_store(&go, 0);
        CHECK(pthread_create(&t, NULL, goes_away, &b) == 0);
        atomic_store(&go, 1);
        /* The same address the moment it is free. */
        deadline = now() + 30;
        for (;;) {
            m = mmap(b.start, b.len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
            if (m != MAP_FAILED)
                break;
            CHECK_MSG(errno == EEXIST, "mmap: %s", strerror(errno));
            CHECK_MSG(now() < deadline, "round %d: the old address never came free", i);
        }
        CHECK(m == b.start);
        reused++;
        fill(m + off, L, 2000 + i);
        h = reg_mem(nic, m + off, L, tag, 1, 0);
        CHECK(pthread_join(t, NULL) == 0);

        say_u64((uint64_t)(uintptr_t)(m + off));
        say_u64(h);
        barrier(1); /* the child's write is done */
        bad = check_fill(m + off, L, 3000 + i);
        CHECK_MSG(bad == -1, "round %d (%s by another thread): the write through the new "
                  "registration did not reach the new pages (byte %ld differs)",
                  i, b.freed ? "freed" : "unmapped", bad);
        OK(VipDeregisterMem(nic, m + off, h));
        CHECK(munmap(m, b.len) == 0);
    }
    printf("ok: %d rounds, every new registration reached the new pages\n", reused);
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 1 << 20, 1, 0), NULL, NULL);
    region r = region_new(nic, tag, L + 4096, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&r, 0);
    unsigned char *src = r.base + 4096;
    int i;
    connect_to(nic, vi, disc("regreuse"));
    for (i = 0; i < ROUNDS; i++) {
        uint64_t a = hear_u64(), h = hear_u64();
        fill(src, L, 3000 + i);
        rdma_write_wait(vi, d, src, r.mh, r.mh, a, (VIP_MEM_HANDLE)h, L);
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

int main(void) { return run_pair("regreuse", 120, parent, child); }
