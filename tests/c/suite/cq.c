/* cq.c: completion queues over many VIs: VipCQDone, VipCQWait and
 * VipCQNotify (re-armed from the handler) report (VI, queue) pairs in
 * completion order, after which Vip*Done dequeues the descriptor; send
 * and receive CQs; create/resize/destroy and their errors. The parent
 * receives on NVI VIs whose receive queues share one CQ. */
#include "common.h"

#include <pthread.h>

#define NVI 8
#define PER_VI 30 /* messages per VI and phase */
#define PHASES 3  /* CQDone, CQWait, CQNotify */

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;
static VIP_VI_HANDLE vis[NVI];

/* The message on VI v with sequence s carries (v, s) in its first 8 bytes. */
static unsigned char *buf_of(unsigned v, unsigned k) { return r.base + 65536 + ((size_t)v * PER_VI + k) * 64; }
static VIP_DESCRIPTOR *rdesc(unsigned v, unsigned k) { return desc_at(&r, ((size_t)v * PER_VI + k) * 64); }

static int vi_index(VIP_VI_HANDLE vi)
{
    int i;
    for (i = 0; i < NVI; i++)
        if (vis[i] == vi)
            return i;
    return -1;
}

static unsigned next_seq[NVI];
static unsigned total_seen;

/* One CQ completion: VI vi's receive queue; dequeue and check order. */
static void take(VIP_VI_HANDLE vi, VIP_BOOLEAN recv, unsigned phase)
{
    int v = vi_index(vi);
    VIP_DESCRIPTOR *d = NULL;
    uint32_t got[2];
    unsigned k;
    CHECK_MSG(v >= 0, "CQ returned an unknown VI handle %p", vi);
    CHECK_EQ(recv, VIP_TRUE);
    k = next_seq[v] % PER_VI;
    OK(VipRecvDone(vi, &d));
    CHECK_MSG(d == rdesc((unsigned)v, k), "VI %d: dequeued %p, expected %p", v, (void *)d, (void *)rdesc((unsigned)v, k));
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    CHECK_EQ(d->CS.Length, 8);
    memcpy(got, buf_of((unsigned)v, k), 8);
    CHECK_EQ(got[0], (unsigned)v);
    CHECK_EQ(got[1], phase * 1000 + next_seq[v]);
    next_seq[v]++;
    total_seen++;
}

static void post_all(void)
{
    unsigned v, k;
    for (v = 0; v < NVI; v++)
        for (k = 0; k < PER_VI; k++) {
            VIP_DESCRIPTOR *d = rdesc(v, k);
            desc_simple(d, buf_of(v, k), r.mh, 64);
            OK(VipPostRecv(vis[v], d, r.mh));
        }
}

/* CQ notify: the handler takes one completion and re-arms itself. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static unsigned notified;
static pthread_t main_thread;
static VIP_CQ_HANDLE the_cq;

static void on_cq(VIP_PVOID ctx, VIP_NIC_HANDLE n, VIP_VI_HANDLE vi, VIP_BOOLEAN recv)
{
    CHECK(ctx == &notified);
    CHECK(n == nic);
    CHECK(!pthread_equal(pthread_self(), main_thread));
    pthread_mutex_lock(&lock);
    take(vi, recv, 2);
    notified++;
    if (notified < NVI * PER_VI)
        OK(VipCQNotify(the_cq, &notified, on_cq));
    pthread_cond_signal(&cond);
    pthread_mutex_unlock(&lock);
}

static void cq_api_checks(void)
{
    VIP_NIC_ATTRIBUTES na = nic_attrs(nic);
    VIP_CQ_HANDLE cq = (VIP_CQ_HANDLE)&cq;
    VIP_VI_HANDLE vi = (VIP_VI_HANDLE)&vi;
    VIP_BOOLEAN rq = 77;
    double t0, dt;
    region s = region_new(nic, tag, 8192, 0, 0);
    VIP_DESCRIPTOR *d = desc_at(&s, 0);
    unsigned i;

    EXPECT_RC(VipCreateCQ(nic, 0, &cq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateCQ(nic, na.MaxCQEntries + 1, &cq), VIP_ERROR_RESOURCE);
    EXPECT_RC(VipCreateCQ(nic, 16, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCreateCQ(NULL, 16, &cq), VIP_INVALID_PARAMETER);
    CHECK(cq == (VIP_CQ_HANDLE)&cq);
    OK(VipCreateCQ(nic, na.MaxCQEntries, &cq));
    OK(VipDestroyCQ(cq));
    OK(VipCreateCQ(nic, 4, &cq));
    /* Empty: NOT_DONE, TIMEOUT; outputs untouched. */
    EXPECT_RC(VipCQDone(cq, &vi, &rq), VIP_NOT_DONE);
    t0 = now_ms();
    EXPECT_RC(VipCQWait(cq, 200, &vi, &rq), VIP_TIMEOUT);
    dt = now_ms() - t0;
    CHECK_MSG(dt >= 190 && dt < BOUND_MS, "VipCQWait(200 ms) took %.0f ms", dt);
    CHECK(vi == (VIP_VI_HANDLE)&vi && rq == 77);
    EXPECT_RC(VipCQDone(cq, NULL, &rq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQDone(cq, &vi, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQWait(cq, 0, NULL, &rq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQNotify(cq, NULL, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQDone(NULL, &vi, &rq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQDone((VIP_CQ_HANDLE)nic, &vi, &rq), VIP_INVALID_PARAMETER);

    /* A VI whose receive queue uses the CQ. Receives with a segment
     * outside their region complete at once (PROTECTION_ERROR), each with
     * a CQ entry. */
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, cq);
    EXPECT_RC(VipDestroyCQ(cq), VIP_INVALID_STATE);
    for (i = 0; i < 4; i++) {
        d = desc_at(&s, 64 * i);
        desc_simple(d, s.base + 8000, s.mh, 4096);
        OK(VipPostRecv(vi, d, s.mh));
    }
    /* It holds 4: not below that; growing keeps them. */
    EXPECT_RC(VipResizeCQ(cq, 3), VIP_INVALID_STATE);
    OK(VipResizeCQ(cq, 1024));
    EXPECT_RC(VipResizeCQ(cq, 0), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipResizeCQ(cq, na.MaxCQEntries + 1), VIP_ERROR_RESOURCE);
    EXPECT_RC(VipResizeCQ(NULL, 10), VIP_INVALID_PARAMETER);
    for (i = 0; i < 4; i++) {
        VIP_VI_HANDLE got = NULL;
        VIP_DESCRIPTOR *e = NULL;
        if (i % 2)
            OK(VipCQDone(cq, &got, &rq));
        else
            OK(VipCQWait(cq, WAIT_MS, &got, &rq));
        CHECK(got == vi);
        CHECK_EQ(rq, VIP_TRUE);
        OK(VipRecvDone(vi, &e));
        CHECK(e == desc_at(&s, 64 * i));
        CHECK_STATUS(e, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_PROTECTION_ERROR);
    }
    EXPECT_RC(VipCQDone(cq, &vi, &rq), VIP_NOT_DONE);
    OK(VipResizeCQ(cq, 2));
    OK(VipDestroyVi(vi));
    OK(VipDestroyCQ(cq));
    EXPECT_RC(VipDestroyCQ(cq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipResizeCQ(cq, 10), VIP_INVALID_PARAMETER);
    region_free(&s);

    /* A CQ dies with its NIC. */
    OK(VipCreateCQ(nic, 4, &cq));
    OK(VipCloseNic(nic));
    EXPECT_RC(VipDestroyCQ(cq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQDone(cq, &vi, &rq), VIP_INVALID_PARAMETER);
    nic = open_nic();
    tag = new_ptag(nic);
}

static int parent(void)
{
    VIP_CQ_HANDLE rcq, scq;
    VIP_VI_HANDLE vi;
    VIP_BOOLEAN rq;
    VIP_DESCRIPTOR *d;
    unsigned phase, v, i;
    double t0;
    struct timespec ts;

    main_thread = pthread_self();
    nic = open_nic();
    tag = new_ptag(nic);
    cq_api_checks();
    r = region_new(nic, tag, 65536 + NVI * PER_VI * 64 + 65536, 0, 0);
    OK(VipCreateCQ(nic, NVI * PER_VI, &rcq));
    OK(VipCreateCQ(nic, 64, &scq));
    the_cq = rcq;
    for (v = 0; v < NVI; v++)
        vis[v] = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), scq, rcq);
    for (v = 0; v < NVI; v++)
        accept_on(nic, vis[v], disc("cq"));

    for (phase = 0; phase < PHASES; phase++) {
        post_all();
        if (phase == 2)
            OK(VipCQNotify(rcq, &notified, on_cq));
        barrier(10 + (int)phase);
        t0 = now_ms();
        if (phase == 0) {
            while (total_seen < (phase + 1) * NVI * PER_VI) {
                VIP_RETURN rc = VipCQDone(rcq, &vi, &rq);
                if (rc == VIP_NOT_DONE) {
                    CHECK_MSG(now_ms() - t0 < WAIT_MS, "VipCQDone: only %u completions", total_seen);
                    continue;
                }
                OK(rc);
                take(vi, rq, phase);
            }
        } else if (phase == 1) {
            while (total_seen < (phase + 1) * NVI * PER_VI) {
                OK(VipCQWait(rcq, WAIT_MS, &vi, &rq));
                take(vi, rq, phase);
            }
        } else {
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += WAIT_MS / 1000;
            pthread_mutex_lock(&lock);
            while (notified < NVI * PER_VI)
                CHECK_MSG(pthread_cond_timedwait(&cond, &lock, &ts) == 0 || notified == NVI * PER_VI,
                          "CQ notify: %u handler calls", notified);
            pthread_mutex_unlock(&lock);
        }
        for (v = 0; v < NVI; v++)
            CHECK_EQ(next_seq[v], (phase + 1) * PER_VI);
        EXPECT_RC(VipCQDone(rcq, &vi, &rq), VIP_NOT_DONE);
    }

    /* Sends complete into the send CQ (RecvQueue FALSE). */
    barrier(20);
    for (i = 0; i < NVI; i++) {
        d = desc_at(&r, 64 * (size_t)i);
        *(uint32_t *)(void *)(r.base + 65536 + 60000 + 64 * i) = i;
        desc_simple(d, r.base + 65536 + 60000 + 64 * i, r.mh, 4);
        OK(VipPostSend(vis[i], d, r.mh));
    }
    for (i = 0; i < NVI; i++) {
        OK(VipCQWait(scq, WAIT_MS, &vi, &rq));
        CHECK_EQ(rq, VIP_FALSE);
        CHECK(vi_index(vi) >= 0);
        OK(VipSendDone(vi, &d));
        CHECK(d == desc_at(&r, 64 * (size_t)vi_index(vi)));
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    }
    EXPECT_RC(VipCQDone(scq, &vi, &rq), VIP_NOT_DONE);
    barrier(21);

    EXPECT_RC(VipDestroyCQ(rcq), VIP_INVALID_STATE);
    for (v = 0; v < NVI; v++) {
        OK(VipDisconnect(vis[v]));
        OK(VipDestroyVi(vis[v]));
    }
    OK(VipDestroyCQ(rcq));
    OK(VipDestroyCQ(scq));
    EXPECT_RC(VipDestroyCQ(rcq), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipCQDone(scq, &vi, &rq), VIP_INVALID_PARAMETER);
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_VI_HANDLE cv[NVI];
    region s;
    unsigned phase, v, k, n;

    nic = open_nic();
    tag = new_ptag(nic);
    s = region_new(nic, tag, 65536, 0, 0);
    for (v = 0; v < NVI; v++) {
        cv[v] = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
        connect_to(nic, cv[v], disc("cq"));
    }
    for (phase = 0; phase < PHASES; phase++) {
        unsigned sent[NVI] = {0};
        barrier(10 + (int)phase);
        /* Interleave the VIs unevenly. */
        for (n = 0; n < NVI * PER_VI; n++) {
            VIP_DESCRIPTOR *d = desc_at(&s, 0);
            uint32_t msg[2];
            v = (n * 5 + n / 7) % NVI;
            while (sent[v] == PER_VI)
                v = (v + 1) % NVI;
            msg[0] = v;
            msg[1] = phase * 1000 + phase * PER_VI + sent[v];
            memcpy(s.base + 4096, msg, 8);
            desc_simple(d, s.base + 4096, s.mh, 8);
            OK(VipPostSend(cv[v], d, s.mh));
            send_wait(cv[v], d);
            CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
            sent[v]++;
        }
        for (k = 0; k < NVI; k++)
            CHECK_EQ(sent[k], PER_VI);
    }
    /* Receive the send-CQ round. */
    for (v = 0; v < NVI; v++) {
        VIP_DESCRIPTOR *d = desc_at(&s, 64 * (1 + (size_t)v));
        desc_simple(d, s.base + 8192 + 64 * v, s.mh, 64);
        OK(VipPostRecv(cv[v], d, s.mh));
    }
    barrier(20);
    for (v = 0; v < NVI; v++) {
        VIP_DESCRIPTOR *d = recv_wait(cv[v], desc_at(&s, 64 * (1 + (size_t)v)));
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(*(uint32_t *)(void *)(s.base + 8192 + 64 * v), v);
    }
    barrier(21);
    for (v = 0; v < NVI; v++) {
        CHECK(wait_state(cv[v], VIP_STATE_ERROR, BOUND_MS));
        OK(VipDisconnect(cv[v]));
        OK(VipDestroyVi(cv[v]));
    }
    region_free(&s);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("cq", 180, parent, child); }
