/* notify.c: VipRecvNotify / VipSendNotify: the handler runs once, on a
 * provider thread, with the context, NIC, VI and the dequeued descriptor;
 * handlers armed twice run for two completions in order; a handler may
 * re-arm itself and post from inside; arming after the completion runs
 * the handler for it. */
#include "common.h"

#include <pthread.h>

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static VIP_VI_HANDLE vi;
static region r;
static pthread_t main_thread;

struct call {
    VIP_PVOID ctx;
    VIP_NIC_HANDLE nic;
    VIP_VI_HANDLE vi;
    VIP_DESCRIPTOR *desc;
    unsigned status;
    int on_main;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct call calls[64];
static int n_calls;
static int rearm_left; /* re-arming handler: calls still wanted */

/* Records a call; `status` is the descriptor's status when the handler started. */
static void record(VIP_PVOID ctx, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_DESCRIPTOR *d, unsigned status)
{
    pthread_mutex_lock(&lock);
    CHECK(n_calls < 64);
    calls[n_calls].ctx = ctx;
    calls[n_calls].nic = n;
    calls[n_calls].vi = v;
    calls[n_calls].desc = d;
    calls[n_calls].status = status;
    calls[n_calls].on_main = pthread_equal(pthread_self(), main_thread);
    n_calls++;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

static void handler_a(VIP_PVOID ctx, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_DESCRIPTOR *d)
{
    record(ctx, n, v, d, d ? d->CS.Status : 0);
}

static void handler_b(VIP_PVOID ctx, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_DESCRIPTOR *d)
{
    record(ctx, n, v, d, d ? d->CS.Status : 0);
}

/* Re-arms itself and re-posts the descriptor it got, from the handler. */
static void handler_rearm(VIP_PVOID ctx, VIP_NIC_HANDLE n, VIP_VI_HANDLE v, VIP_DESCRIPTOR *d)
{
    unsigned status = d->CS.Status;
    pthread_mutex_lock(&lock);
    rearm_left--;
    if (rearm_left > 0) {
        desc_simple(d, r.base + 8192, r.mh, 4096);
        OK(VipPostRecv(v, d, r.mh));
        OK(VipRecvNotify(v, ctx, handler_rearm));
    }
    pthread_mutex_unlock(&lock);
    /* Recorded last: once the main thread sees the call, the receive is posted. */
    record(ctx, n, v, d, status);
}

static void wait_calls(int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += WAIT_MS / 1000;
    pthread_mutex_lock(&lock);
    while (n_calls < n)
        if (pthread_cond_timedwait(&cond, &lock, &ts) != 0)
            break;
    CHECK_MSG(n_calls >= n, "%d handler calls, expected %d", n_calls, n);
    pthread_mutex_unlock(&lock);
}

static void check_call(int i, VIP_PVOID ctx, VIP_DESCRIPTOR *d, unsigned status)
{
    CHECK_MSG(calls[i].ctx == ctx, "call %d: context %p", i, calls[i].ctx);
    CHECK(calls[i].nic == nic);
    CHECK(calls[i].vi == vi);
    CHECK_MSG(calls[i].desc == d, "call %d: descriptor %p, expected %p", i, (void *)calls[i].desc, (void *)d);
    CHECK_MSG(calls[i].status == status, "call %d: status 0x%x, expected 0x%x", i, calls[i].status, status);
    CHECK_MSG(!calls[i].on_main, "call %d ran on the main thread", i);
}

static int ctx_a, ctx_b, ctx_c;
#define RECV_OK (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE)
#define SEND_OK (VIP_STATUS_DONE | VIP_STATUS_OP_SEND)

/* The parent receives (and sends in the last step). */
static int parent(void)
{
    VIP_DESCRIPTOR *d0, *d1, *d2, *got;
    int i;

    main_thread = pthread_self();
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    d0 = desc_at(&r, 0);
    d1 = desc_at(&r, 64);
    d2 = desc_at(&r, 128);
    EXPECT_RC(VipRecvNotify(vi, &ctx_a, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSendNotify(vi, &ctx_a, NULL), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipRecvNotify(NULL, &ctx_a, handler_a), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipSendNotify((VIP_VI_HANDLE)nic, &ctx_a, handler_a), VIP_INVALID_PARAMETER);
    accept_on(nic, vi, disc("n"));

    /* 1. One handler, one message: it runs once with the dequeued descriptor. */
    desc_simple(d0, r.base + 4096, r.mh, 4096);
    OK(VipPostRecv(vi, d0, r.mh));
    desc_simple(d1, r.base + 8192, r.mh, 4096);
    OK(VipPostRecv(vi, d1, r.mh));
    OK(VipRecvNotify(vi, &ctx_a, handler_a));
    barrier(1);
    wait_calls(1);
    check_call(0, &ctx_a, d0, RECV_OK);
    EXPECT_RC(VipRecvDone(vi, &got), VIP_NOT_DONE); /* d0 went to the handler; d1 not yet done */
    /* One-shot: the second message is not handed to a handler. */
    barrier(2);
    recv_wait(vi, d1);
    CHECK_STATUS(d1, RECV_OK);
    CHECK_EQ(n_calls, 1);

    /* 2. Two handlers armed: two completions, in order. */
    desc_simple(d0, r.base + 4096, r.mh, 4096);
    OK(VipPostRecv(vi, d0, r.mh));
    desc_simple(d1, r.base + 8192, r.mh, 4096);
    OK(VipPostRecv(vi, d1, r.mh));
    OK(VipRecvNotify(vi, &ctx_a, handler_a));
    OK(VipRecvNotify(vi, &ctx_b, handler_b));
    barrier(3);
    wait_calls(3);
    check_call(1, &ctx_a, d0, RECV_OK);
    check_call(2, &ctx_b, d1, RECV_OK);
    EXPECT_RC(VipRecvDone(vi, &got), VIP_NOT_DONE);

    /* 3. A handler re-arming itself and re-posting from inside, 5 times. */
    rearm_left = 5;
    desc_simple(d2, r.base + 8192, r.mh, 4096);
    OK(VipPostRecv(vi, d2, r.mh));
    OK(VipRecvNotify(vi, &ctx_c, handler_rearm));
    barrier(4);
    for (i = 3; i < 8; i++) {
        wait_calls(i + 1);
        check_call(i, &ctx_c, d2, RECV_OK);
        barrier(40 + i); /* one message at a time: the handler re-posted */
    }
    barrier(5);

    /* 4. Armed after the completion: runs for it. */
    desc_simple(d0, r.base + 4096, r.mh, 4096);
    OK(VipPostRecv(vi, d0, r.mh));
    barrier(6);
    barrier(7); /* the child's send completed: d0 is done */
    OK(VipRecvNotify(vi, &ctx_a, handler_a));
    wait_calls(9);
    check_call(8, &ctx_a, d0, RECV_OK);

    /* 5. Send notify. */
    fill(r.base + 4096, 100, 9);
    desc_simple(d0, r.base + 4096, r.mh, 100);
    OK(VipSendNotify(vi, &ctx_b, handler_b));
    barrier(8); /* the child posted its receive */
    OK(VipPostSend(vi, d0, r.mh));
    wait_calls(10);
    check_call(9, &ctx_b, d0, SEND_OK);
    EXPECT_RC(VipSendDone(vi, &got), VIP_NOT_DONE);
    barrier(9);
    CHECK_EQ(n_calls, 10);

    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static void send_one(VIP_VI_HANDLE v, uint32_t seed)
{
    VIP_DESCRIPTOR *d = desc_at(&r, 0);
    fill(r.base + 4096, 500, seed);
    desc_simple(d, r.base + 4096, r.mh, 500);
    OK(VipPostSend(v, d, r.mh));
    send_wait(v, d);
    CHECK_STATUS(d, SEND_OK);
}

static int child(void)
{
    VIP_VI_HANDLE v;
    VIP_DESCRIPTOR *d;
    int i;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    v = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    connect_to(nic, v, disc("n"));
    barrier(1);
    send_one(v, 1);
    barrier(2);
    send_one(v, 2);
    barrier(3);
    send_one(v, 3);
    send_one(v, 4);
    barrier(4);
    for (i = 3; i < 8; i++) {
        send_one(v, 10 + (uint32_t)i);
        barrier(40 + i);
    }
    barrier(5);
    barrier(6);
    send_one(v, 20);
    barrier(7);
    d = desc_at(&r, 64);
    desc_simple(d, r.base + 8192, r.mh, 4096);
    OK(VipPostRecv(v, d, r.mh));
    barrier(8);
    recv_wait(v, d);
    CHECK_STATUS(d, RECV_OK);
    CHECK(check_fill(r.base + 8192, 100, 9) == -1);
    barrier(9);
    CHECK(wait_state(v, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(v));
    OK(VipDestroyVi(v));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("notify", 120, parent, child); }
