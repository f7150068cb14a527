/* rdma.c: RDMA write, write with immediate data (consumes a receive,
 * status OP_REMOTE_RDMA_WRITE|IMMEDIATE), read, and every protection
 * violation: wrong ptag, a handle of another NIC, a bogus or deregistered
 * handle, out of bounds, RDMA disabled on the VI or on the region (also
 * after VipSetMemAttributes). For each, a fresh connection: the target
 * checks its memory (changed exactly where allowed, else untouched) and
 * the error it is told of; the initiator checks its descriptor's status
 * (VIP_STATUS_RDMA_PROT_ERROR) and its VI state. Then the descriptor
 * errors of RDMA posts. Parent: initiator; child: target. */
#include "common.h"

#include <pthread.h>

enum op { W, WI, R };
enum handle_kind { H_OK, H_FOREIGN, H_BOGUS, H_DEREGISTERED };

struct rcase {
    const char *name;
    enum op op;
    VIP_RELIABILITY_LEVEL level;
    int vi_w, vi_r;   /* target VI: EnableRdmaWrite / Read */
    int mem_w, mem_r; /* target region: EnableRdmaWrite / Read */
    int wrong_ptag;   /* target region registered with another tag than its VI */
    enum handle_kind handle;
    long off;         /* remote address = region start + off */
    unsigned len;
    int disable_later; /* enabled at registration, disabled by VipSetMemAttributes */
    int ok;            /* expected to succeed */
};

#define RD VIP_SERVICE_RELIABLE_DELIVERY
#define RR VIP_SERVICE_RELIABLE_RECEPTION
#define UR VIP_SERVICE_UNRELIABLE
#define TLEN 65536

static const struct rcase cases[] = {
    {"write", W, RD, 1, 0, 1, 0, 0, H_OK, 100, 5000, 0, 1},
    {"write whole region", W, RR, 1, 0, 1, 0, 0, H_OK, 0, TLEN, 0, 1},
    {"write unreliable", W, UR, 1, 0, 1, 0, 0, H_OK, 7, 3000, 0, 1},
    {"write with immediate", WI, RD, 1, 0, 1, 0, 0, H_OK, 4096, 1000, 0, 1},
    {"write with immediate, 0 bytes", WI, RR, 1, 0, 1, 0, 0, H_OK, 0, 0, 0, 1},
    {"read", R, RD, 0, 1, 0, 1, 0, H_OK, 333, 7000, 0, 1},
    {"read reliable reception", R, RR, 0, 1, 0, 1, 0, H_OK, 0, TLEN, 0, 1},
    {"write: wrong ptag", W, RD, 1, 0, 1, 0, 1, H_OK, 0, 100, 0, 0},
    {"write: handle of another NIC", W, RD, 1, 0, 1, 0, 0, H_FOREIGN, 0, 100, 0, 0},
    {"write: bogus handle", W, RD, 1, 0, 1, 0, 0, H_BOGUS, 0, 100, 0, 0},
    {"write: deregistered region", W, RD, 1, 0, 1, 0, 0, H_DEREGISTERED, 0, 100, 0, 0},
    {"write: past the end", W, RD, 1, 0, 1, 0, 0, H_OK, TLEN - 50, 100, 0, 0},
    {"write: before the start", W, RD, 1, 0, 1, 0, 0, H_OK, -8, 100, 0, 0},
    {"write: disabled on the VI", W, RD, 0, 1, 1, 1, 0, H_OK, 0, 100, 0, 0},
    {"write: disabled on the region", W, RD, 1, 1, 0, 1, 0, H_OK, 0, 100, 0, 0},
    {"write: disabled by VipSetMemAttributes", W, RD, 1, 0, 1, 0, 0, H_OK, 0, 100, 1, 0},
    {"write: disabled on the region, unreliable", W, UR, 1, 0, 0, 0, 0, H_OK, 0, 100, 0, 0},
    {"write with immediate: disabled on the VI", WI, RD, 0, 0, 1, 0, 0, H_OK, 0, 100, 0, 0},
    {"read: wrong ptag", R, RD, 0, 1, 0, 1, 1, H_OK, 0, 100, 0, 0},
    {"read: handle of another NIC", R, RD, 0, 1, 0, 1, 0, H_FOREIGN, 0, 100, 0, 0},
    {"read: past the end", R, RD, 0, 1, 0, 1, 0, H_OK, TLEN - 10, 100, 0, 0},
    {"read: disabled on the VI", R, RD, 1, 0, 1, 1, 0, H_OK, 0, 100, 0, 0},
    {"read: disabled on the region", R, RD, 1, 1, 1, 0, 0, H_OK, 0, 100, 0, 0},
    {"read: disabled by VipSetMemAttributes", R, RR, 0, 1, 0, 1, 0, H_OK, 0, 100, 1, 0},
};
#define NCASES (sizeof cases / sizeof cases[0])

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;

/* Asynchronous errors seen by the error callback for the VI under test.
 * Errors of earlier VIs (an orderly disconnect by the peer of the previous
 * case, reported as CONN_LOST) may still arrive: they are not counted. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int n_errors;
static VIP_ERROR_DESCRIPTOR last_error;
static VIP_VI_HANDLE watched;

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    CHECK(ctx == &lock);
    pthread_mutex_lock(&lock);
    if (e->ResourceCode != VIP_RESOURCE_VI || e->ViHandle == watched) {
        last_error = *e;
        n_errors++;
    }
    pthread_mutex_unlock(&lock);
}

static void reset_errors(VIP_VI_HANDLE vi)
{
    pthread_mutex_lock(&lock);
    n_errors = 0;
    watched = vi;
    pthread_mutex_unlock(&lock);
}

static int got_error(void *want)
{
    int r;
    pthread_mutex_lock(&lock);
    r = n_errors > 0 && last_error.ErrorCode == *(VIP_ERROR_CODE *)want;
    pthread_mutex_unlock(&lock);
    return r;
}

static void expect_error(VIP_ERROR_CODE code, VIP_VI_HANDLE vi, const char *name)
{
    int n;
    VIP_ERROR_DESCRIPTOR e;
    CHECK_MSG(poll_until(got_error, &code, BOUND_MS), "%s: no error callback with code %d (%d calls, last code %d)",
              name, (int)code, n_errors, (int)last_error.ErrorCode);
    pthread_mutex_lock(&lock);
    e = last_error;
    n = n_errors;
    pthread_mutex_unlock(&lock);
    CHECK_MSG(n == 1, "%s: %d error callbacks", name, n);
    CHECK(e.NicHandle == nic);
    CHECK(e.ViHandle == vi);
    CHECK_EQ(e.ResourceCode, VIP_RESOURCE_VI);
}

static uint32_t target_seed(unsigned i) { return 100 + i; }
static uint32_t local_seed(unsigned i) { return 1000 + i; }

/* ---- initiator ---- */

static void initiate(unsigned i)
{
    const struct rcase *c = &cases[i];
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, c->level, TLEN, 0, 0), NULL, NULL);
    region l = region_new(nic, tag, 4096 + TLEN, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&l, 0);
    unsigned char *buf = l.base + 4096;
    uint64_t addr, handle;
    unsigned want;
    int outcome;
    long bad;

    reset_errors(vi);
    fill(buf, TLEN, local_seed(i));
    connect_to(nic, vi, disc(c->name));
    addr = hear_u64();
    handle = hear_u64();
    desc_init(d, c->op == R ? VIP_CONTROL_OP_RDMAREAD : VIP_CONTROL_OP_RDMAWRITE, 2);
    if (c->op == WI) {
        d->CS.Control |= VIP_CONTROL_IMMEDIATE;
        d->CS.ImmediateData = 0xabc000u + i;
    }
    desc_remote(d, addr + (uint64_t)c->off, (VIP_MEM_HANDLE)handle);
    desc_local(d, 1, buf, l.mh, c->len);
    d->CS.Length = c->len;
    OK(VipPostSend(vi, d, l.mh));
    send_wait(vi, d);
    want = VIP_STATUS_DONE | (c->op == R ? VIP_STATUS_OP_RDMA_READ : VIP_STATUS_OP_RDMA_WRITE) |
           (c->ok ? 0 : VIP_STATUS_RDMA_PROT_ERROR);
    CHECK_MSG((d->CS.Status & ~(unsigned)VIP_STATUS_IMMEDIATE) == want, "%s: initiator status 0x%x, expected 0x%x",
              c->name, (unsigned)d->CS.Status, want);
    if (c->op == R) {
        if (c->ok) {
            unsigned char *t = malloc(TLEN);
            CHECK(t != NULL);
            fill(t, TLEN, target_seed(i));
            CHECK_MSG(memcmp(buf, t + c->off, c->len) == 0, "%s: data read differ", c->name);
            free(t);
        } else {
            bad = check_fill(buf, TLEN, local_seed(i));
            CHECK_MSG(bad == -1, "%s: the failed read wrote local byte %ld", c->name, bad);
        }
    }
    /* A violation breaks a reliable connection; the initiator hears CONN_LOST. */
    if (!c->ok && c->level != UR) {
        CHECK_MSG(wait_state(vi, VIP_STATE_ERROR, BOUND_MS), "%s: initiator VI not in the error state", c->name);
        expect_error(VIP_ERROR_CONN_LOST, vi, c->name);
    } else {
        CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    }
    outcome = 1;
    say(&outcome, sizeof outcome);
    barrier(1000 + (int)i);
    if (vi_state(vi) != VIP_STATE_IDLE)
        OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&l);
}

/* Posts that are refused: RDMA read on an unreliable VI, read with
 * immediate data, RDMA without address segment. */
static void descriptor_errors(void)
{
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, UR, TLEN, 0, 0), NULL, NULL);
    VIP_VI_HANDLE rvi = new_vi(nic, vi_attrs(tag, RD, TLEN, 0, 0), NULL, NULL);
    region l = region_new(nic, tag, 8192, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&l, 0);
    connect_to(nic, vi, disc("desc-ur"));
    connect_to(nic, rvi, disc("desc-rd"));
    desc_init(d, VIP_CONTROL_OP_RDMAREAD, 2);
    desc_remote(d, 0x10000, 1);
    desc_local(d, 1, l.base + 4096, l.mh, 10);
    d->CS.Length = 10;
    EXPECT_RC(VipPostSend(vi, d, l.mh), VIP_DESCRIPTOR_ERROR);
    d->CS.Control |= VIP_CONTROL_IMMEDIATE;
    EXPECT_RC(VipPostSend(rvi, d, l.mh), VIP_DESCRIPTOR_ERROR);
    desc_init(d, VIP_CONTROL_OP_RDMAWRITE, 0);
    EXPECT_RC(VipPostSend(rvi, d, l.mh), VIP_DESCRIPTOR_ERROR);
    desc_init(d, VIP_CONTROL_OP_RDMAREAD, 0);
    EXPECT_RC(VipPostSend(rvi, d, l.mh), VIP_DESCRIPTOR_ERROR);
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    CHECK_EQ(vi_state(rvi), VIP_STATE_CONNECTED);
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDisconnect(rvi));
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(rvi));
    region_free(&l);
}

/* Write with immediate data when the target has no receive posted: the
 * connection breaks (RECVQ_EMPTY at the target) and no data lands. */
static void no_receive_initiator(void)
{
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, RD, TLEN, 0, 0), NULL, NULL);
    region l = region_new(nic, tag, 8192, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&l, 0);
    uint64_t addr, handle;
    connect_to(nic, vi, disc("no-receive"));
    addr = hear_u64();
    handle = hear_u64();
    fill(l.base + 4096, 100, 1);
    desc_init(d, VIP_CONTROL_OP_RDMAWRITE | VIP_CONTROL_IMMEDIATE, 2);
    desc_remote(d, addr, (VIP_MEM_HANDLE)handle);
    desc_local(d, 1, l.base + 4096, l.mh, 100);
    d->CS.Length = 100;
    OK(VipPostSend(vi, d, l.mh));
    send_wait(vi, d);
    CHECK(d->CS.Status & VIP_STATUS_DONE);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    barrier(3);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&l);
}

static int parent(void)
{
    unsigned i;
    nic = open_nic();
    tag = new_ptag(nic);
    OK(VipErrorCallback(nic, &lock, on_error));
    for (i = 0; i < NCASES; i++)
        initiate(i);
    descriptor_errors();
    no_receive_initiator();
    OK(VipCloseNic(nic));
    return 0;
}

/* ---- target ---- */

static void target(unsigned i, VIP_NIC_HANDLE nic2, VIP_PROTECTION_HANDLE tag2)
{
    const struct rcase *c = &cases[i];
    VIP_PROTECTION_HANDLE other = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, c->level, TLEN, c->vi_w, c->vi_r), NULL, NULL);
    region t = region_new(nic, c->wrong_ptag ? other : tag, TLEN, c->mem_w, c->mem_r);
    region dr = region_new(nic, tag, 4096, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&dr, 0);
    VIP_MEM_HANDLE h = t.mh, foreign = 0;
    VIP_MEM_ATTRIBUTES ma;
    unsigned char *expect = malloc(TLEN);
    int outcome;
    long bad;

    CHECK(expect != NULL);
    reset_errors(vi);
    fill(t.base, TLEN, target_seed(i));
    fill(expect, TLEN, target_seed(i));
    if (c->disable_later) {
        OK(VipQueryMem(nic, t.base, t.mh, &ma));
        ma.EnableRdmaWrite = ma.EnableRdmaRead = VIP_FALSE;
        OK(VipSetMemAttributes(nic, t.base, t.mh, &ma));
    }
    if (c->handle == H_FOREIGN) {
        ma.Ptag = tag2;
        ma.EnableRdmaWrite = ma.EnableRdmaRead = VIP_TRUE;
        OK(VipRegisterMem(nic2, t.base, TLEN, &ma, &foreign));
        h = foreign;
    } else if (c->handle == H_BOGUS) {
        h = 0x7fff1234;
    }
    if (c->op == WI) {
        desc_init(d, VIP_CONTROL_OP_SENDRECV, 0);
        OK(VipPostRecv(vi, d, dr.mh));
    }
    accept_on(nic, vi, disc(c->name));
    if (c->handle == H_DEREGISTERED)
        OK(VipDeregisterMem(nic, t.base, t.mh));
    say_u64((uint64_t)(uintptr_t)t.base);
    say_u64(h);
    hear(&outcome, sizeof outcome); /* the initiator's descriptor completed */

    if (c->ok && c->op != R)
        fill(expect + c->off, c->len, local_seed(i));
    bad = -1;
    for (outcome = 0; outcome < TLEN; outcome++)
        if (t.base[outcome] != expect[outcome]) {
            bad = outcome;
            break;
        }
    CHECK_MSG(bad == -1, "%s: target byte %ld is 0x%02x, expected 0x%02x", c->name, bad,
              bad >= 0 ? t.base[bad] : 0, bad >= 0 ? expect[bad] : 0);
    if (c->op == WI && c->ok) {
        recv_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_REMOTE_RDMA_WRITE | VIP_STATUS_IMMEDIATE);
        CHECK_EQ(d->CS.ImmediateData, 0xabc000u + i);
        CHECK_EQ(d->CS.Length, c->len);
    }
    if (c->ok) {
        CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
        CHECK_EQ(n_errors, 0);
    } else {
        expect_error(c->op == R ? VIP_ERROR_RDMAR_PROT : VIP_ERROR_RDMAW_PROT, vi, c->name);
        if (c->level == UR) {
            CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
        } else {
            CHECK_MSG(wait_state(vi, VIP_STATE_ERROR, BOUND_MS), "%s: target VI not in the error state", c->name);
        }
    }
    barrier(1000 + (int)i);
    if (vi_state(vi) != VIP_STATE_IDLE)
        OK(VipDisconnect(vi));
    if (c->op == WI && !c->ok) {
        recv_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR);
    }
    OK(VipDestroyVi(vi));
    if (foreign)
        OK(VipDeregisterMem(nic2, t.base, foreign));
    if (c->handle == H_DEREGISTERED)
        free(t.base);
    else
        region_free(&t);
    region_free(&dr);
    OK(VipDestroyPtag(nic, other));
    free(expect);
}

static int child(void)
{
    VIP_NIC_HANDLE nic2;
    VIP_PROTECTION_HANDLE tag2;
    VIP_VI_HANDLE vi, rvi;
    region t;
    unsigned i;

    nic = open_nic();
    tag = new_ptag(nic);
    nic2 = open_nic();
    tag2 = new_ptag(nic2);
    OK(VipErrorCallback(nic, &lock, on_error));
    for (i = 0; i < NCASES; i++)
        target(i, nic2, tag2);

    vi = new_vi(nic, vi_attrs(tag, UR, TLEN, 1, 0), NULL, NULL);
    rvi = new_vi(nic, vi_attrs(tag, RD, TLEN, 1, 1), NULL, NULL);
    accept_on(nic, vi, disc("desc-ur"));
    accept_on(nic, rvi, disc("desc-rd"));
    barrier(2);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    CHECK(wait_state(rvi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDisconnect(rvi));
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(rvi));

    /* No receive for a write with immediate data. */
    vi = new_vi(nic, vi_attrs(tag, RD, TLEN, 1, 0), NULL, NULL);
    reset_errors(vi);
    t = region_new(nic, tag, 4096, 1, 0);
    fill(t.base, 4096, 5);
    accept_on(nic, vi, disc("no-receive"));
    say_u64((uint64_t)(uintptr_t)t.base);
    say_u64(t.mh);
    expect_error(VIP_ERROR_RECVQ_EMPTY, vi, "write with immediate, no receive");
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    CHECK_MSG(check_fill(t.base, 4096, 5) == -1, "write with immediate without a receive changed the target");
    barrier(3);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&t);
    OK(VipCloseNic(nic2));
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("rdma", 180, parent, child); }
