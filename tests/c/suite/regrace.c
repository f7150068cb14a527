/* regrace.c: registration against concurrent activity.
 *
 * 1. VipDeregisterMem while the peer's RDMA write or read of 64 MiB (or the
 *    NIC's MaxTransferSize, if smaller) into
 *    or out of the region is in flight. Once VipDeregisterMem returns, no
 *    byte of the region is written or read by the peer: the target fills
 *    the region with a sentinel right after it returns, and the sentinel
 *    must survive; an RDMA read that completes DONE must hold only the
 *    contents from before the deregistration. The transfer ends DONE (it
 *    finished first) or with an error status (cut short), never DONE with
 *    data from after.
 * 2. A thread writes into a buffer while another thread registers it
 *    (pages move into shared memory): every write survives.
 *
 * Parent: owner of the region; child: initiator. */
#include "common.h"

#include <pthread.h>
#include <sys/mman.h>

#define BIG (64u << 20)
#define ROUNDS 8
/* Bytes of each transfer: BIG, or the NIC's MaxTransferSize if smaller
 * (a verbs device's largest message: 8 MiB on Soft-RoCE). */
static size_t xfer;
static const double delay_us[ROUNDS / 2] = {0, 3000, 12000, 400000};

static unsigned char *map_big(void)
{
    void *p = mmap(NULL, BIG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED);
    return p;
}

static VIP_MEM_HANDLE reg(VIP_NIC_HANDLE nic, void *p, size_t n, VIP_PROTECTION_HANDLE tag)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 0;
    ma.Ptag = tag;
    ma.EnableRdmaWrite = VIP_TRUE;
    ma.EnableRdmaRead = VIP_TRUE;
    OK(VipRegisterMem(nic, p, n, &ma, &mh));
    return mh;
}

static void spin_us(double us)
{
    double end = now_ms() + us / 1000.0;
    while (now_ms() < end)
        ;
}

/* ---- part 2: a writer during registration ---------------------------- */

#define WBYTES (32u << 20)
static volatile uint64_t *words;
static volatile int writer_started;

static void *writer(void *arg)
{
    size_t slots = WBYTES / 64, k;
    (void)arg;
    for (k = 0; k < slots; k++) {
        size_t i = (k * 40503u) % slots;
        words[i * 8] = i + 1;
        if (k == slots / 100)
            writer_started = 1;
    }
    return NULL;
}

static void writer_during_registration(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE tag)
{
    pthread_t t;
    size_t i, slots = WBYTES / 64, lost = 0;
    VIP_MEM_HANDLE mh;
    words = mmap(NULL, WBYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(words != MAP_FAILED);
    CHECK(pthread_create(&t, NULL, writer, NULL) == 0);
    while (!writer_started)
        ;
    mh = reg(nic, (void *)words, WBYTES, tag);
    CHECK(pthread_join(t, NULL) == 0);
    for (i = 0; i < slots; i++)
        lost += words[i * 8] != i + 1;
    CHECK_MSG(lost == 0, "%zu of %zu writes made during the registration were lost", lost, slots);
    OK(VipDeregisterMem(nic, (void *)words, mh));
    CHECK(munmap((void *)words, WBYTES) == 0);
}

/* ---- part 1: deregistration during a transfer ------------------------ */

/* The error statuses of a transfer cut short by the deregistration. On
 * Soft-RoCE (SUITE_DEVICE=rxe...) a read cut in the middle of its response
 * stream ends in a transport error instead: the target's QP goes to ERROR
 * without a word to the initiator, whose retries then run out. */
static unsigned cut_short(int read)
{
    const char *d = getenv("SUITE_DEVICE");
    unsigned st = VIP_STATUS_RDMA_PROT_ERROR | VIP_STATUS_PROTECTION_ERROR;
    if (read && d != NULL && strncmp(d, "rxe", 3) == 0)
        st |= VIP_STATUS_TRANSPORT_ERROR;
    return st;
}

static size_t transfer_size(VIP_NIC_HANDLE nic)
{
    size_t max = nic_attrs(nic).MaxTransferSize;
    return max < BIG ? max : BIG;
}

static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    unsigned char *t = map_big();
    int k, cut = 0, done = 0;
    char notes[512] = "";
    xfer = transfer_size(nic);
    for (k = 0; k < ROUNDS; k++) {
        int read = k & 1;
        VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, xfer, 1, 1), NULL, NULL);
        VIP_MEM_HANDLE mh;
        uint64_t st;
        size_t i, hit = 0;
        char d[32];
        snprintf(d, sizeof d, "race%d", k);
        accept_on(nic, vi, disc(d));
        if (read)
            fill(t, xfer, 500 + k);
        else
            memset(t, 0, xfer);
        mh = reg(nic, t, xfer, tag);
        say_u64((uint64_t)(uintptr_t)t);
        say_u64(mh);
        barrier(10);
        /* Let the transfer run for a while (none, part, all of it), then
         * pull the region. */
        spin_us(delay_us[k / 2]);
        OK(VipDeregisterMem(nic, t, mh));
        if (!read) {
            size_t in = 0;
            for (i = 0; i < xfer; i += 4096)
                in += t[i + 4095] != 0;
            snprintf(notes + strlen(notes), sizeof notes - strlen(notes), " %zu/%zu",
                     in, xfer / 4096);
        }
        memset(t, 0xEE, xfer);
        barrier(11); /* the child's descriptor completed */
        st = hear_u64();
        for (i = 0; i < xfer; i++)
            hit += t[i] != 0xEE;
        CHECK_MSG(hit == 0, "round %d (%s): %zu bytes written after VipDeregisterMem returned (status 0x%llx)",
                  k, read ? "read" : "write", hit, (unsigned long long)st);
        if (st & VIP_STATUS_ERROR_MASK)
            cut++;
        else
            done++;
        OK(VipDisconnect(vi));
        OK(VipDestroyVi(vi));
    }
    printf("note: %d transfers finished before the deregistration, %d were cut short or refused; "
           "pages written before it, per write round:%s\n", done, cut, notes);
    writer_during_registration(nic, tag);
    barrier(12);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    unsigned char *l = map_big();
    region r = region_new(nic, tag, 4096, 0, 0);
    VIP_MEM_HANDLE lh = reg(nic, l, BIG, tag);
    int k;
    xfer = transfer_size(nic);
    for (k = 0; k < ROUNDS; k++) {
        int read = k & 1;
        VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, xfer, 1, 1), NULL, NULL);
        VIP_DESCRIPTOR *d = desc_at(&r, 0);
        uint64_t ta, th;
        char dn[32];
        unsigned st;
        snprintf(dn, sizeof dn, "race%d", k);
        connect_to(nic, vi, disc(dn));
        ta = hear_u64();
        th = hear_u64();
        if (read)
            memset(l, 0, xfer);
        else
            fill(l, xfer, 900 + k);
        desc_init(d, read ? VIP_CONTROL_OP_RDMAREAD : VIP_CONTROL_OP_RDMAWRITE, 2);
        desc_remote(d, ta, (VIP_MEM_HANDLE)th);
        desc_local(d, 1, l, lh, xfer);
        d->CS.Length = xfer;
        barrier(10);
        OK(VipPostSend(vi, d, r.mh));
        send_wait(vi, d);
        st = (unsigned)d->CS.Status;
        if (read && !(st & VIP_STATUS_ERROR_MASK)) {
            long bad = check_fill(l, xfer, 500 + k);
            CHECK_MSG(bad == -1, "round %d: a read completed DONE with data from after the "
                      "deregistration (byte %ld)", k, bad);
        }
        CHECK_MSG((st & VIP_STATUS_DONE) && ((st & VIP_STATUS_ERROR_MASK) == 0 ||
                                            (st & cut_short(read))),
                  "round %d: status 0x%x", k, st);
        barrier(11);
        say_u64(st);
        OK(VipDisconnect(vi));
        OK(VipDestroyVi(vi));
    }
    barrier(12);
    OK(VipDeregisterMem(nic, l, lh));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("regrace", 240, parent, child); }
