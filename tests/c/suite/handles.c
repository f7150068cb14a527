/* handles.c: memory handles never alias. A handle names one registration
 * (the same bytes, tag and RDMA enables) and nothing else, ever. The
 * parent registers a buffer, hands the handle to the child and deregisters
 * it: the child's RDMA writes through that stale handle are refused while
 * the deregistered registration is only parked (the provider keeps it
 * whole, for the same registration again). The parent then makes other
 * registrations of the same buffer (other lengths, more of them than are
 * parked, so none is taken back) far beyond 65,536 times: no registration
 * gets a handle seen before (the stale one included). Meanwhile the child
 * keeps RDMA-writing through the stale handle (an unreliable VI, so a
 * refused write keeps the connection): every write completes with
 * RDMA_PROT_ERROR and the buffer never changes. Only the same registration
 * taken back while parked may come back under its handle (the pin-down
 * cache, tested in tests/tests/registration.rs). */
#include "common.h"

#include <sys/mman.h>

#define LEN 8192
#define REGS 140000
#define WRITES 20000
/* Writes while the stale registration is only parked. */
#define PARKED_WRITES 1000
/* Lengths the parent cycles through: more than the registrations a NIC
 * keeps parked (64), so each comes back evicted, as a new registration. */
#define LENGTHS 100

static VIP_MEM_HANDLE reg(VIP_NIC_HANDLE nic, void *p, size_t len, VIP_PROTECTION_HANDLE tag)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 0;
    ma.Ptag = tag;
    ma.EnableRdmaWrite = VIP_TRUE;
    ma.EnableRdmaRead = VIP_FALSE;
    OK(VipRegisterMem(nic, p, len, &ma, &mh));
    return mh;
}

/* A set of handles: open addressing, 2^18 slots. */
static uint32_t seen[1 << 18];

static int insert(uint32_t h)
{
    uint32_t i = (h * 2654435761u) >> 14;
    for (;; i = (i + 1) & ((1 << 18) - 1)) {
        if (seen[i] == h)
            return 0;
        if (seen[i] == 0) {
            seen[i] = h;
            return 1;
        }
    }
}

static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, LEN, 1, 0), NULL, NULL);
    unsigned char *buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    VIP_MEM_HANDLE stale;
    long i, bad;
    CHECK(buf != MAP_FAILED);
    fill(buf, LEN, 5);
    accept_on(nic, vi, disc("handles"));
    stale = reg(nic, buf, LEN, tag);
    CHECK(insert(stale));
    OK(VipDeregisterMem(nic, buf, stale));
    say_u64((uint64_t)(uintptr_t)buf);
    say_u64(stale);
    /* The child writes through the stale handle while it is parked. */
    barrier(1);
    for (i = 0; i < REGS; i++) {
        size_t len = LEN - 64 * (size_t)(1 + i % LENGTHS);
        VIP_MEM_HANDLE h = reg(nic, buf, len, tag);
        CHECK_MSG(insert(h), "registration %ld got handle 0x%x again", i + 1, (unsigned)h);
        OK(VipDeregisterMem(nic, buf, h));
    }
    /* End on a live registration of the same bytes (the stale one was
     * evicted from the parked long ago: a new registration): the child's
     * last writes through the stale handle meet it. */
    {
        VIP_MEM_HANDLE h = reg(nic, buf, LEN, tag);
        CHECK(insert(h));
        barrier(2);
        barrier(3);
        OK(VipDeregisterMem(nic, buf, h));
    }
    bad = check_fill(buf, LEN, 5);
    CHECK_MSG(bad == -1, "the buffer changed at byte %ld", bad);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, LEN, 1, 0), NULL, NULL);
    region r = region_new(nic, tag, LEN + 4096, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&r, 0);
    uint64_t addr, stale;
    long i;
    connect_to(nic, vi, disc("handles"));
    addr = hear_u64();
    stale = hear_u64();
    fill(r.base + 4096, LEN, 77);
    for (i = 0; i < PARKED_WRITES + WRITES + 100; i++) {
        if (i == PARKED_WRITES)
            barrier(1);
        if (i == PARKED_WRITES + WRITES)
            barrier(2);
        desc_init(d, VIP_CONTROL_OP_RDMAWRITE, 2);
        desc_remote(d, addr, (VIP_MEM_HANDLE)stale);
        desc_local(d, 1, r.base + 4096, r.mh, LEN);
        d->CS.Length = LEN;
        OK(VipPostSend(vi, d, r.mh));
        send_wait(vi, d);
        CHECK_MSG(d->CS.Status == (VIP_STATUS_DONE | VIP_STATUS_OP_RDMA_WRITE | VIP_STATUS_RDMA_PROT_ERROR),
                  "write %ld through the stale handle: status 0x%x", i, (unsigned)d->CS.Status);
    }
    barrier(3);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("handles", 240, parent, child); }
