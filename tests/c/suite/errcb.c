/* errcb.c: the error callback. A message that finds no receive on a
 * reliable VI: the receiver's callback gets VIP_ERROR_RECVQ_EMPTY (with
 * its NIC and VI handles and the context, on a provider thread), the
 * sender's gets VIP_ERROR_CONN_LOST, both VIs enter the error state. On
 * an unreliable VI the message is dropped silently and the connection
 * stays. A handler may call VIPL; handlers can be replaced and removed. */
#include "common.h"

#include <pthread.h>

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;
static pthread_t main_thread;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int calls_a, calls_b;
static VIP_ERROR_DESCRIPTOR last;
static VIP_VI_STATE state_in_handler;
static int on_main;

static void handler_a(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    VIP_VI_STATE st = (VIP_VI_STATE)99;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se, re;
    CHECK(ctx == &calls_a);
    /* VIPL calls from the handler. */
    if (e->ViHandle)
        OK(VipQueryVi(e->ViHandle, &st, &a, &se, &re));
    pthread_mutex_lock(&lock);
    last = *e;
    state_in_handler = st;
    on_main = pthread_equal(pthread_self(), main_thread);
    calls_a++;
    pthread_mutex_unlock(&lock);
}

static void handler_b(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    CHECK(ctx == &calls_b);
    pthread_mutex_lock(&lock);
    last = *e;
    calls_b++;
    pthread_mutex_unlock(&lock);
}

static int a_called(void *p)
{
    int v;
    pthread_mutex_lock(&lock);
    v = calls_a >= *(int *)p;
    pthread_mutex_unlock(&lock);
    return v;
}

static int b_called(void *p)
{
    int v;
    pthread_mutex_lock(&lock);
    v = calls_b >= *(int *)p;
    pthread_mutex_unlock(&lock);
    return v;
}

static void send_one(VIP_VI_HANDLE vi, size_t off, uint32_t seed)
{
    VIP_DESCRIPTOR *d = desc_at(&r, off);
    fill(r.base + 8192, 256, seed);
    desc_simple(d, r.base + 8192, r.mh, 256);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
}

static void setup(void)
{
    main_thread = pthread_self();
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
}

/* The parent receives without having posted a receive. */
static int parent(void)
{
    VIP_VI_HANDLE vi, uvi;
    VIP_DESCRIPTOR *d;
    int one = 1, two = 2;

    setup();
    EXPECT_RC(VipErrorCallback(NULL, &calls_a, handler_a), VIP_INVALID_PARAMETER);
    EXPECT_RC(VipErrorCallback((VIP_NIC_HANDLE)tag, &calls_a, handler_a), VIP_INVALID_PARAMETER);
    OK(VipErrorCallback(nic, &calls_a, handler_a));
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    uvi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 4096, 0, 0), NULL, NULL);
    accept_on(nic, vi, disc("rel"));
    accept_on(nic, uvi, disc("unrel"));

    /* Unreliable: dropped, nothing reported, the connection stays. */
    barrier(1);
    barrier(2); /* the child's send completed */
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 1024);
    OK(VipPostRecv(uvi, d, r.mh));
    barrier(3);
    recv_wait(uvi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    CHECK_MSG(check_fill(r.base + 4096, 256, 2) == -1, "received the dropped message instead of the second one");
    CHECK_EQ(vi_state(uvi), VIP_STATE_CONNECTED);
    CHECK_EQ(calls_a, 0);

    /* Reliable: the connection breaks; RECVQ_EMPTY here. */
    barrier(4);
    CHECK_MSG(poll_until(a_called, &one, BOUND_MS), "no error callback for RECVQ_EMPTY");
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    pthread_mutex_lock(&lock);
    CHECK_EQ(calls_a, 1);
    CHECK_EQ(last.ErrorCode, VIP_ERROR_RECVQ_EMPTY);
    CHECK_EQ(last.ResourceCode, VIP_RESOURCE_VI);
    CHECK(last.NicHandle == nic);
    CHECK(last.ViHandle == vi);
    CHECK(last.CQHandle == NULL);
    CHECK(last.DescriptorPtr == NULL);
    CHECK_EQ(state_in_handler, VIP_STATE_ERROR);
    CHECK_MSG(!on_main, "the error callback ran on the main thread");
    pthread_mutex_unlock(&lock);
    CHECK_EQ(vi_state(uvi), VIP_STATE_CONNECTED);
    OK(VipDisconnect(vi));

    /* Replaced: the new handler gets the next error (the child disconnects uvi). */
    OK(VipErrorCallback(nic, &calls_b, handler_b));
    barrier(5);
    CHECK_MSG(poll_until(b_called, &one, BOUND_MS), "the replacement handler was not called");
    CHECK_EQ(calls_a, 1);
    CHECK_EQ(last.ErrorCode, VIP_ERROR_CONN_LOST);
    CHECK(last.ViHandle == uvi);
    OK(VipDisconnect(uvi));

    /* Removed: errors are only logged. Then set again: called again. */
    OK(VipErrorCallback(nic, NULL, NULL));
    accept_on(nic, uvi, disc("unrel2"));
    barrier(6);
    CHECK(wait_state(uvi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(uvi));
    OK(VipErrorCallback(nic, &calls_b, handler_b));
    accept_on(nic, uvi, disc("unrel3"));
    barrier(7);
    CHECK_MSG(poll_until(b_called, &two, BOUND_MS), "the handler set again was not called");
    CHECK_EQ(calls_a, 1);
    CHECK_EQ(calls_b, 2);
    OK(VipDisconnect(uvi));

    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(uvi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

/* The child sends. */
static int child(void)
{
    VIP_VI_HANDLE vi, uvi;
    int one = 1;

    setup();
    OK(VipErrorCallback(nic, &calls_a, handler_a));
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    uvi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_UNRELIABLE, 4096, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("rel"));
    connect_to(nic, uvi, disc("unrel"));

    barrier(1);
    send_one(uvi, 0, 1); /* no receive posted: dropped */
    barrier(2);
    barrier(3);
    send_one(uvi, 0, 2);
    CHECK_EQ(vi_state(uvi), VIP_STATE_CONNECTED);

    barrier(4);
    /* Reliable delivery: the send itself completes without error... */
    send_one(vi, 64, 3);
    /* ...and the connection breaks: CONN_LOST here. */
    CHECK_MSG(poll_until(a_called, &one, BOUND_MS), "no error callback on the sender");
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    pthread_mutex_lock(&lock);
    CHECK_EQ(last.ErrorCode, VIP_ERROR_CONN_LOST);
    CHECK(last.ViHandle == vi);
    CHECK(last.NicHandle == nic);
    pthread_mutex_unlock(&lock);
    OK(VipDisconnect(vi));

    barrier(5); /* the parent replaced its handler */
    OK(VipDisconnect(uvi));
    connect_to(nic, uvi, disc("unrel2"));
    barrier(6); /* the parent saw the connection up before it goes down */
    OK(VipDisconnect(uvi));
    connect_to(nic, uvi, disc("unrel3"));
    barrier(7); /* as above */
    OK(VipDisconnect(uvi));
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(uvi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("errcb", 120, parent, child); }
