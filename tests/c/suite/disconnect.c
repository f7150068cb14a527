/* disconnect.c: VipDisconnect flushes: outstanding receives of both sides
 * complete with VIP_STATUS_DESC_FLUSHED_ERROR in posting order (the
 * peer's VI enters the error state and its error callback hears
 * CONN_LOST); posting in the error state completes at once as flushed;
 * the VIs can be reconnected and used again. */
#include "common.h"

#include <pthread.h>

#define K 5
#define FLUSHED_RECV (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR)

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int n_errors;
static VIP_ERROR_DESCRIPTOR last;

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    (void)ctx;
    pthread_mutex_lock(&lock);
    last = *e;
    n_errors++;
    pthread_mutex_unlock(&lock);
}

static int have_error(void *p)
{
    int v;
    (void)p;
    pthread_mutex_lock(&lock);
    v = n_errors > 0;
    pthread_mutex_unlock(&lock);
    return v;
}

static void post_k(VIP_VI_HANDLE vi)
{
    int i;
    for (i = 0; i < K; i++) {
        VIP_DESCRIPTOR *d = desc_at(&r, 64 * (size_t)i);
        desc_simple(d, r.base + 4096 + 1024 * (size_t)i, r.mh, 1024);
        OK(VipPostRecv(vi, d, r.mh));
    }
}

static void expect_flushed(VIP_VI_HANDLE vi)
{
    VIP_VI_STATE st;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se, re;
    int i;
    for (i = 0; i < K; i++) {
        VIP_DESCRIPTOR *d = recv_wait(vi, desc_at(&r, 64 * (size_t)i));
        CHECK_STATUS(d, FLUSHED_RECV);
    }
    OK(VipQueryVi(vi, &st, &a, &se, &re));
    CHECK_EQ(re, VIP_TRUE);
}

static void exchange(VIP_VI_HANDLE vi, int sender)
{
    exchange_message(vi, desc_at(&r, 64 * 10), r.base + 32768, r.mh, 1024, sender, 777, 3);
}

static void setup(void)
{
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    OK(VipErrorCallback(nic, NULL, on_error));
}

/* The parent's VI is disconnected by the child. */
static int parent(void)
{
    VIP_VI_HANDLE vi = NULL;
    VIP_DESCRIPTOR *d;
    VIP_ERROR_DESCRIPTOR e;

    setup();
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    post_k(vi);
    accept_on(nic, vi, disc("d"));
    barrier(1);
    /* The child disconnects: error state, receives flushed, CONN_LOST. */
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    expect_flushed(vi);
    CHECK(poll_until(have_error, NULL, BOUND_MS));
    pthread_mutex_lock(&lock);
    e = last;
    CHECK_EQ(n_errors, 1);
    pthread_mutex_unlock(&lock);
    CHECK_EQ(e.ErrorCode, VIP_ERROR_CONN_LOST);
    CHECK_EQ(e.ResourceCode, VIP_RESOURCE_VI);
    CHECK(e.ViHandle == vi);
    CHECK(e.NicHandle == nic);
    /* In the error state: a receive completes at once, flushed; so does a send. */
    d = desc_at(&r, 64 * 8);
    desc_simple(d, r.base + 4096, r.mh, 100);
    OK(VipPostRecv(vi, d, r.mh));
    recv_wait(vi, d);
    CHECK_STATUS(d, FLUSHED_RECV);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_DESC_FLUSHED_ERROR);
    /* Leaving the error state. */
    OK(VipDisconnect(vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    EXPECT_RC(VipPostSend(vi, d, r.mh), VIP_INVALID_STATE);
    EXPECT_RC(VipDisconnect(vi), VIP_INVALID_STATE);
    barrier(2);

    /* Reconnect the same VI and use it; then we disconnect. */
    accept_on(nic, vi, disc("d2"));
    exchange(vi, 1);
    exchange(vi, 0);
    post_k(vi);
    barrier(3);
    OK(VipDisconnect(vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    expect_flushed(vi);
    barrier(4);
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_VI_HANDLE vi;
    setup();
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("d"));
    post_k(vi);
    barrier(1);
    /* Our own receives are flushed by our disconnect. */
    OK(VipDisconnect(vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    expect_flushed(vi);
    CHECK_EQ(n_errors, 0);
    barrier(2);
    connect_to(nic, vi, disc("d2"));
    exchange(vi, 0);
    exchange(vi, 1);
    barrier(3);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    CHECK(poll_until(have_error, NULL, BOUND_MS));
    CHECK_EQ(last.ErrorCode, VIP_ERROR_CONN_LOST);
    barrier(4);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("disconnect", 120, parent, child); }
