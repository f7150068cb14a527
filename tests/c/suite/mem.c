/* mem.c: VipRegisterMem / VipDeregisterMem / VipQueryMem /
 * VipSetMemAttributes on every kind of memory (heap, stack, .bss, .data,
 * anonymous and shared file mappings), bad arguments, and data moved
 * between two processes through each kind. */
#include "common.h"

#include <sys/mman.h>
#include <unistd.h>

#define N 20000 /* bytes per buffer: not page-aligned, crosses pages */

static unsigned char bss_buf[N + 64];
static unsigned char data_buf[N + 64] = {1, 2, 3};

struct kinds {
    unsigned char *p[6];
    const char *name[6];
};

static VIP_MEM_HANDLE reg(VIP_NIC_HANDLE nic, void *p, size_t n, VIP_PROTECTION_HANDLE tag, int w, int r)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 0;
    ma.Ptag = tag;
    ma.EnableRdmaWrite = w;
    ma.EnableRdmaRead = r;
    OK(VipRegisterMem(nic, p, n, &ma, &mh));
    return mh;
}

static void attrs_are(VIP_NIC_HANDLE nic, void *p, VIP_MEM_HANDLE mh, VIP_PROTECTION_HANDLE tag, int w, int r)
{
    VIP_MEM_ATTRIBUTES ma;
    memset(&ma, 0x55, sizeof ma);
    OK(VipQueryMem(nic, p, mh, &ma));
    CHECK(ma.Ptag == tag);
    CHECK_EQ(ma.EnableRdmaWrite, w);
    CHECK_EQ(ma.EnableRdmaRead, r);
}

static void api_checks(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE tag)
{
    VIP_NIC_HANDLE other = open_nic();
    VIP_PROTECTION_HANDLE otag = new_ptag(other), tag2 = new_ptag(nic);
    unsigned char *heap = malloc(N), *hole;
    VIP_MEM_HANDLE mh, mh2, omh;
    VIP_MEM_ATTRIBUTES ma, keep;
    long page = sysconf(_SC_PAGESIZE);

    CHECK(heap != NULL);
    fill(heap, N, 7);
    mh = reg(nic, heap + 3, N - 3, tag, 0, 0);
    /* Registration keeps the contents and the memory stays usable. */
    CHECK(check_fill(heap, N, 7) == -1);
    heap[5] ^= 0xff;
    heap[5] ^= 0xff;
    CHECK(check_fill(heap, N, 7) == -1);

    /* Query anywhere inside the region; outside is refused. */
    attrs_are(nic, heap + 3, mh, tag, 0, 0);
    attrs_are(nic, heap + 3 + 100, mh, tag, 0, 0);
    attrs_are(nic, heap + N - 1, mh, tag, 0, 0);
    memset(&keep, 0x5a, sizeof keep);
    ma = keep;
    EXPECT_RC(VipQueryMem(nic, heap + 2, mh, &ma), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQueryMem(nic, heap + N, mh, &ma), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQueryMem(nic, heap + 3, mh + 1, &ma), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQueryMem(nic, heap + 3, mh, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQueryMem(NULL, heap + 3, mh, &ma), VIP_INVALID_PARAMETER);
    CHECK(memcmp(&ma, &keep, sizeof ma) == 0);

    /* Set attributes: RDMA bits and tag. */
    ma.Ptag = tag2;
    ma.EnableRdmaWrite = VIP_TRUE;
    ma.EnableRdmaRead = VIP_TRUE;
    OK(VipSetMemAttributes(nic, heap + 3, mh, &ma));
    attrs_are(nic, heap + 10, mh, tag2, 1, 1);
    ma.Ptag = tag;
    ma.EnableRdmaRead = VIP_FALSE;
    OK(VipSetMemAttributes(nic, heap + 100, mh, &ma));
    attrs_are(nic, heap + 3, mh, tag, 1, 0);
    EXPECT_RC(VipSetMemAttributes(nic, heap + 3, mh, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSetMemAttributes(nic, heap, mh, &ma), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSetMemAttributes(nic, heap + 3, 0, &ma), VIP_INVALID_PARAMETER);
    ma.Ptag = otag;
    EXPECT_RC(VipSetMemAttributes(nic, heap + 3, mh, &ma), VIP_INVALID_PTAG);
    attrs_are(nic, heap + 3, mh, tag, 1, 0);

    /* Overlapping registrations are separate regions. */
    mh2 = reg(nic, heap, N, tag, 0, 0);
    CHECK(mh2 != mh);
    attrs_are(nic, heap, mh2, tag, 0, 0);
    attrs_are(nic, heap + 3, mh, tag, 1, 0);

    /* A handle of another NIC is not a region of this one. */
    omh = reg(other, heap, N, otag, 0, 0);
    EXPECT_RC(VipQueryMem(nic, heap, omh, &ma), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipDeregisterMem(nic, heap, omh), VIP_INVALID_PARAMETER);
    attrs_are(other, heap, omh, otag, 0, 0);
    OK(VipDeregisterMem(other, heap, omh));

    /* Deregistration: only at the start address, only once. */
    EXPECT_RC(VipDeregisterMem(nic, heap + 4, mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipDeregisterMem(nic, heap, mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipDeregisterMem(NULL, heap + 3, mh), VIP_INVALID_PARAMETER);
    OK(VipDeregisterMem(nic, heap + 3, mh));
    EXPECT_RC(VipDeregisterMem(nic, heap + 3, mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipQueryMem(nic, heap + 3, mh, &ma), VIP_INVALID_PARAMETER);
    OK(VipDeregisterMem(nic, heap, mh2));
    /* The memory stays usable after deregistration. */
    CHECK(check_fill(heap, N, 7) == -1);
    memset(heap, 1, N);
    free(heap);

    /* Bad arguments. */
    ma.Ptag = tag;
    ma.EnableRdmaWrite = ma.EnableRdmaRead = VIP_FALSE;
    mh = 12345;
    EXPECT_RC(VipRegisterMem(nic, bss_buf, 0, &ma, &mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRegisterMem(nic, NULL, 4096, &ma, &mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRegisterMem(nic, bss_buf, 4096, NULL, &mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRegisterMem(nic, bss_buf, 4096, &ma, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRegisterMem(NULL, bss_buf, 4096, &ma, &mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRegisterMem(nic, (void *)(uintptr_t)-4096, 8192, &ma, &mh), VIP_INVALID_PARAMETER);
    CHECK_EQ(mh, 12345);
    /* A range that is not mapped. */
    hole = mmap(NULL, (size_t)page * 3, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(hole != MAP_FAILED);
    CHECK(munmap(hole + page, (size_t)page) == 0);
    EXPECT_RC(VipRegisterMem(nic, hole, (size_t)page * 3, &ma, &mh), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRegisterMem(nic, hole + page, 10, &ma, &mh), VIP_INVALID_PARAMETER);
    CHECK_EQ(mh, 12345);
    munmap(hole, (size_t)page);
    munmap(hole + 2 * page, (size_t)page);

    OK(VipDestroyPtag(nic, tag2));
    OK(VipCloseNic(other));
}

/* Six kinds of memory, each with N + 64 bytes. */
static void kinds_init(struct kinds *k, unsigned char *stack_buf, int shm_fd)
{
    unsigned char *anon = mmap(NULL, N + 64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    unsigned char *shared = mmap(NULL, N + 64, PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
    CHECK(anon != MAP_FAILED && shared != MAP_FAILED);
    k->p[0] = malloc(N + 64);
    k->name[0] = "heap";
    k->p[1] = stack_buf;
    k->name[1] = "stack";
    k->p[2] = bss_buf;
    k->name[2] = ".bss";
    k->p[3] = data_buf;
    k->name[3] = ".data";
    k->p[4] = anon;
    k->name[4] = "anonymous mmap";
    k->p[5] = shared;
    k->name[5] = "shared file mmap";
    CHECK(k->p[0] != NULL);
}

static int shm_file(void)
{
    char path[] = "/tmp/vipl-mem-XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    unlink(path);
    CHECK(ftruncate(fd, N + 64) == 0);
    return fd;
}

/* Parent: receives into each kind of memory, then sends from each. */
static int parent(void)
{
    unsigned char stack_buf[N + 64];
    struct kinds k;
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi;
    VIP_MEM_HANDLE mh[6];
    region dr;
    int i;

    api_checks(nic, tag);
    kinds_init(&k, stack_buf, shm_file());
    dr = region_new(nic, tag, 4096, 0, 0);
    for (i = 0; i < 6; i++) {
        fill(k.p[i], N + 64, 100 + i);
        mh[i] = reg(nic, k.p[i] + 1, N, tag, 0, 0);
        CHECK_MSG(check_fill(k.p[i], N + 64, 100 + i) == -1, "%s: registration changed the contents", k.name[i]);
        memset(k.p[i] + 1, 0, N);
    }
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, NULL);
    for (i = 0; i < 6; i++) {
        VIP_DESCRIPTOR *d = desc_at(&dr, 64 * (size_t)i);
        desc_simple(d, k.p[i] + 1, mh[i], N);
        OK(VipPostRecv(vi, d, dr.mh));
    }
    accept_on(nic, vi, disc("conn"));
    barrier(1);
    for (i = 0; i < 6; i++) {
        VIP_DESCRIPTOR *d = recv_wait(vi, desc_at(&dr, 64 * (size_t)i));
        long bad;
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(d->CS.Length, N);
        bad = check_fill(k.p[i] + 1, N, 200 + i);
        CHECK_MSG(bad == -1, "received into %s: byte %ld differs", k.name[i], bad);
    }
    /* Now send from each kind. */
    barrier(2);
    for (i = 0; i < 6; i++) {
        VIP_DESCRIPTOR *d = desc_at(&dr, 64 * (size_t)i);
        fill(k.p[i] + 1, N, 300 + i);
        desc_simple(d, k.p[i] + 1, mh[i], N);
        OK(VipPostSend(vi, d, dr.mh));
        send_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    }
    barrier(3);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    for (i = 0; i < 6; i++)
        OK(VipDeregisterMem(nic, k.p[i] + 1, mh[i]));
    region_free(&dr);
    OK(VipCloseNic(nic));
    return 0;
}

/* Child: sends from each kind of memory, then receives into each. */
static int child(void)
{
    unsigned char stack_buf[N + 64];
    struct kinds k;
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi;
    VIP_MEM_HANDLE mh[6];
    region dr;
    int i;

    api_checks(nic, tag);
    kinds_init(&k, stack_buf, shm_file());
    dr = region_new(nic, tag, 4096, 0, 0);
    for (i = 0; i < 6; i++) {
        fill(k.p[i] + 1, N, 200 + i);
        mh[i] = reg(nic, k.p[i] + 1, N, tag, 0, 0);
        CHECK_MSG(check_fill(k.p[i] + 1, N, 200 + i) == -1, "%s: registration changed the contents", k.name[i]);
    }
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("conn"));
    barrier(1);
    for (i = 0; i < 6; i++) {
        VIP_DESCRIPTOR *d = desc_at(&dr, 64 * (size_t)i);
        desc_simple(d, k.p[i] + 1, mh[i], N);
        OK(VipPostSend(vi, d, dr.mh));
        send_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    }
    for (i = 0; i < 6; i++) {
        VIP_DESCRIPTOR *d = desc_at(&dr, 64 * (size_t)(6 + i));
        memset(k.p[i] + 1, 0, N);
        desc_simple(d, k.p[i] + 1, mh[i], N);
        OK(VipPostRecv(vi, d, dr.mh));
    }
    barrier(2);
    for (i = 0; i < 6; i++) {
        VIP_DESCRIPTOR *d = recv_wait(vi, desc_at(&dr, 64 * (size_t)(6 + i)));
        long bad;
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(d->CS.Length, N);
        bad = check_fill(k.p[i] + 1, N, 300 + i);
        CHECK_MSG(bad == -1, "received into %s: byte %ld differs", k.name[i], bad);
    }
    barrier(3);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    for (i = 0; i < 6; i++)
        OK(VipDeregisterMem(nic, k.p[i] + 1, mh[i]));
    region_free(&dr);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("mem", 120, parent, child); }
