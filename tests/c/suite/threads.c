/* threads.c: a multi-threaded client. Phase 1: NT threads, each with its
 * own VI, do round trips with an echo server at once (posting, waiting
 * and polling concurrently). Phase 2: NT threads post sends on one shared
 * VI at once while NT other threads reap its send queue with
 * VipSendWait; the server receives with two threads calling VipRecvWait
 * on one VI, and checks each sender's messages arrive in its order. */
#include "common.h"

#include <pthread.h>

#define NT 4
#define ROUNDS 200
#define PER_THREAD 100 /* phase 2 messages per sender thread */

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;

/* ---- client (child) ---- */

struct worker {
    int id;
    VIP_VI_HANDLE vi;
};

static void *round_trips(void *arg)
{
    struct worker *w = arg;
    size_t base = 65536 + (size_t)w->id * 65536;
    VIP_DESCRIPTOR *sd = desc_at(&r, 1024 + (size_t)w->id * 256), *rd = desc_at(&r, 1024 + (size_t)w->id * 256 + 64);
    unsigned i;
    for (i = 0; i < ROUNDS; i++) {
        unsigned long n = 1 + (i * 131 + (unsigned)w->id * 17) % 30000;
        uint32_t seed = (uint32_t)(w->id * 100000 + (int)i);
        VIP_DESCRIPTOR *d = NULL;
        long bad;
        desc_simple(rd, r.base + base + 32768, r.mh, 32768);
        OK(VipPostRecv(w->vi, rd, r.mh));
        fill(r.base + base, n, seed);
        desc_simple(sd, r.base + base, r.mh, (uint32_t)n);
        OK(VipPostSend(w->vi, sd, r.mh));
        /* Alternate polling and waiting. */
        if (i % 2) {
            double t0 = now_ms();
            VIP_RETURN rc;
            while ((rc = VipSendDone(w->vi, &d)) == VIP_NOT_DONE)
                CHECK(now_ms() - t0 < WAIT_MS);
            OK(rc);
        } else {
            OK(VipSendWait(w->vi, WAIT_MS, &d));
        }
        CHECK(d == sd);
        CHECK_STATUS(sd, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
        recv_wait(w->vi, rd);
        CHECK_STATUS(rd, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(rd->CS.Length, n);
        bad = check_fill(r.base + base + 32768, n, seed);
        CHECK_MSG(bad == -1, "thread %d round %u: echo byte %ld differs", w->id, i, bad);
    }
    return NULL;
}

static VIP_VI_HANDLE shared_vi;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned reaped;

static void *sender(void *arg)
{
    int id = *(int *)arg;
    unsigned i;
    for (i = 0; i < PER_THREAD; i++) {
        unsigned slot = (unsigned)id * PER_THREAD + i;
        VIP_DESCRIPTOR *d = desc_at(&r, 4096 + (size_t)slot * 64);
        uint32_t *msg = (uint32_t *)(void *)(r.base + 65536 + (size_t)slot * 16);
        VIP_RETURN rc;
        msg[0] = (uint32_t)id;
        msg[1] = i;
        desc_simple(d, msg, r.mh, 8);
        /* The send queue may be full for a moment: retry. */
        while ((rc = VipPostSend(shared_vi, d, r.mh)) == VIP_ERROR_RESOURCE)
            ;
        OK(rc);
    }
    return NULL;
}

static void *reaper(void *arg)
{
    (void)arg;
    for (;;) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN rc;
        pthread_mutex_lock(&lock);
        if (reaped == NT * PER_THREAD) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        pthread_mutex_unlock(&lock);
        rc = VipSendWait(shared_vi, 50, &d);
        if (rc == VIP_TIMEOUT)
            continue;
        OK(rc);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
        pthread_mutex_lock(&lock);
        reaped++;
        pthread_mutex_unlock(&lock);
    }
}

static int child(void)
{
    struct worker w[NT];
    pthread_t t[2 * NT];
    int ids[NT], i;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536 * (NT + 2), 0, 0);
    for (i = 0; i < NT; i++) {
        w[i].id = i;
        w[i].vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, NULL);
        connect_to(nic, w[i].vi, disc("echo"));
    }
    barrier(1);
    for (i = 0; i < NT; i++)
        CHECK(pthread_create(&t[i], NULL, round_trips, &w[i]) == 0);
    for (i = 0; i < NT; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    barrier(2);

    shared_vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, NULL);
    connect_to(nic, shared_vi, disc("shared"));
    barrier(3); /* the server posted all its receives */
    for (i = 0; i < NT; i++) {
        ids[i] = i;
        CHECK(pthread_create(&t[i], NULL, sender, &ids[i]) == 0);
        CHECK(pthread_create(&t[NT + i], NULL, reaper, NULL) == 0);
    }
    for (i = 0; i < 2 * NT; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    CHECK_EQ(reaped, NT * PER_THREAD);
    barrier(4);

    for (i = 0; i < NT; i++) {
        CHECK(wait_state(w[i].vi, VIP_STATE_ERROR, BOUND_MS));
        OK(VipDisconnect(w[i].vi));
        OK(VipDestroyVi(w[i].vi));
    }
    CHECK(wait_state(shared_vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(shared_vi));
    OK(VipDestroyVi(shared_vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

/* ---- server (parent) ---- */

static VIP_VI_HANDLE svi;
static unsigned next_of[NT];
static VIP_DESCRIPTOR *first_desc;
static uint32_t got[NT * PER_THREAD][2]; /* message of the i-th receive descriptor */
static unsigned received;

/* Two of these wait on one receive queue at once. */
static void *receiver(void *arg)
{
    (void)arg;
    for (;;) {
        VIP_DESCRIPTOR *d = NULL;
        VIP_RETURN rc;
        size_t k;
        pthread_mutex_lock(&lock);
        if (received == NT * PER_THREAD) {
            pthread_mutex_unlock(&lock);
            return NULL;
        }
        pthread_mutex_unlock(&lock);
        rc = VipRecvWait(svi, 20, &d);
        if (rc == VIP_TIMEOUT)
            continue;
        OK(rc);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        k = (size_t)((unsigned char *)d - (unsigned char *)first_desc) / 64;
        CHECK(k < NT * PER_THREAD);
        memcpy(got[k], d->DS[0].Local.Data.Address, 8);
        pthread_mutex_lock(&lock);
        received++;
        pthread_mutex_unlock(&lock);
    }
}

static int parent(void)
{
    VIP_VI_HANDLE vis[NT];
    VIP_CQ_HANDLE cq;
    pthread_t t[2];
    unsigned done = 0, i;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536 * (NT + 2) + NT * PER_THREAD * 64, 0, 0);
    OK(VipCreateCQ(nic, 1024, &cq));
    for (i = 0; i < NT; i++) {
        vis[i] = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, cq);
        desc_simple(desc_at(&r, 64 * (size_t)i), r.base + 65536 * (1 + (size_t)i), r.mh, 32768);
        OK(VipPostRecv(vis[i], desc_at(&r, 64 * (size_t)i), r.mh));
        accept_on(nic, vis[i], disc("echo"));
    }
    barrier(1);
    /* Echo: one CQ over all the VIs. */
    while (done < NT * ROUNDS) {
        VIP_VI_HANDLE vi;
        VIP_BOOLEAN rq;
        VIP_DESCRIPTOR *d, *s;
        unsigned k;
        OK(VipCQWait(cq, WAIT_MS, &vi, &rq));
        for (k = 0; k < NT && vis[k] != vi; k++)
            ;
        CHECK(k < NT && rq == VIP_TRUE);
        OK(VipRecvDone(vi, &d));
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        s = desc_at(&r, 64 * (NT + (size_t)k));
        memcpy(r.base + 65536 * (1 + (size_t)k) + 32768, r.base + 65536 * (1 + (size_t)k), d->CS.Length);
        desc_simple(s, r.base + 65536 * (1 + (size_t)k) + 32768, r.mh, d->CS.Length);
        /* Re-post the receive before echoing: the client's next message may follow at once. */
        desc_simple(d, r.base + 65536 * (1 + (size_t)k), r.mh, 32768);
        OK(VipPostRecv(vi, d, r.mh));
        OK(VipPostSend(vi, s, r.mh));
        send_wait(vi, s);
        CHECK_STATUS(s, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
        done++;
    }
    barrier(2);

    svi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 65536, 0, 0), NULL, NULL);
    first_desc = desc_at(&r, 65536 * (NT + 2));
    for (i = 0; i < NT * PER_THREAD; i++) {
        VIP_DESCRIPTOR *d = desc_at(&r, 65536 * (NT + 2) + 64 * (size_t)i);
        desc_simple(d, r.base + 4096 + 16 * (size_t)i, r.mh, 16);
        OK(VipPostRecv(svi, d, r.mh));
    }
    accept_on(nic, svi, disc("shared"));
    barrier(3);
    CHECK(pthread_create(&t[0], NULL, receiver, NULL) == 0);
    CHECK(pthread_create(&t[1], NULL, receiver, NULL) == 0);
    CHECK(pthread_join(t[0], NULL) == 0);
    CHECK(pthread_join(t[1], NULL) == 0);
    /* Receive descriptors complete in posting order, so each sender's
     * messages must appear in its order along them. */
    for (i = 0; i < NT * PER_THREAD; i++) {
        CHECK(got[i][0] < NT);
        CHECK_MSG(got[i][1] == next_of[got[i][0]], "receive %u: message %u of sender %u, expected %u", i,
                  got[i][1], got[i][0], next_of[got[i][0]]);
        next_of[got[i][0]]++;
    }
    for (i = 0; i < NT; i++)
        CHECK_EQ(next_of[i], PER_THREAD);
    barrier(4);

    for (i = 0; i < NT; i++) {
        OK(VipDisconnect(vis[i]));
        recv_wait(vis[i], desc_at(&r, 64 * (size_t)i)); /* the last receive, flushed */
        CHECK_STATUS(desc_at(&r, 64 * (size_t)i),
                     VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR);
        OK(VipDestroyVi(vis[i]));
    }
    OK(VipDisconnect(svi));
    OK(VipDestroyVi(svi));
    OK(VipDestroyCQ(cq));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("threads", 180, parent, child); }
