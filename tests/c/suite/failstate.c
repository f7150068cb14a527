/* failstate.c: a failed descriptor is seen with its VI in the error state.
 * A message longer than the receive on a Reliable Reception connection:
 * the receiver's VipRecvWait returns the receive with
 * VIP_STATUS_LENGTH_ERROR, and VipQueryVi right after it says
 * VIP_STATE_ERROR, even while the receiver's error callback is still busy
 * with an earlier error (another connection's break), which holds up the
 * provider thread that delivers this break; a send it posts then is
 * flushed (VIP_STATUS_DESC_FLUSHED_ERROR). The sender's VipSendWait
 * returns VIP_STATUS_REMOTE_DESC_ERROR with its VI in the error state.
 * Once the callback returns, the receiver's callback gets
 * VIP_ERROR_CONN_LOST for the VI. */
#include "common.h"

#include <pthread.h>

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;
static VIP_VI_HANDLE vi, other;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t released = PTHREAD_COND_INITIALIZER;
static int hold;    /* the handler waits while set */
static int entered; /* handler calls so far */
static int conn_lost_on_vi;

static void handler(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    (void)ctx;
    pthread_mutex_lock(&lock);
    entered++;
    if (e->ErrorCode == VIP_ERROR_CONN_LOST && e->ViHandle == vi)
        conn_lost_on_vi = 1;
    while (hold)
        pthread_cond_wait(&released, &lock);
    pthread_mutex_unlock(&lock);
}

static int handler_entered(void *p)
{
    int v;
    (void)p;
    pthread_mutex_lock(&lock);
    v = entered >= 1;
    pthread_mutex_unlock(&lock);
    return v;
}

static int vi_conn_lost(void *p)
{
    int v;
    (void)p;
    pthread_mutex_lock(&lock);
    v = conn_lost_on_vi;
    pthread_mutex_unlock(&lock);
    return v;
}

/* The NIC, a region, the VI under test and another one. */
static void setup(void)
{
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 4096, 0, 0), NULL, NULL);
    other = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
}

static int teardown(void)
{
    OK(VipDisconnect(vi));
    OK(VipDisconnect(other));
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(other));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

/* The parent receives: its receive is too short. */
static int parent(void)
{
    VIP_DESCRIPTOR *d;

    setup();
    OK(VipErrorCallback(nic, NULL, handler));
    accept_on(nic, vi, disc("vi"));
    accept_on(nic, other, disc("other"));
    pthread_mutex_lock(&lock);
    hold = 1;
    pthread_mutex_unlock(&lock);

    /* The other connection breaks (a message without a receive): the
     * handler is called for it and stays. */
    barrier(1);
    CHECK_MSG(poll_until(handler_entered, NULL, BOUND_MS), "no error callback for the other VI");

    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 64);
    OK(VipPostRecv(vi, d, r.mh));
    barrier(2);
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_LENGTH_ERROR);
    CHECK_EQ(vi_state(vi), VIP_STATE_ERROR);

    /* A VI seen in the error state sends nothing more, the break still on
     * its way: a send posted now is flushed. */
    d = desc_at(&r, 128);
    desc_simple(d, r.base + 8192, r.mh, 8);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_DESC_FLUSHED_ERROR);

    /* The callback returns: the break lands. */
    pthread_mutex_lock(&lock);
    hold = 0;
    pthread_cond_broadcast(&released);
    pthread_mutex_unlock(&lock);
    CHECK_MSG(poll_until(vi_conn_lost, NULL, BOUND_MS), "no CONN_LOST for the VI");
    CHECK_EQ(vi_state(vi), VIP_STATE_ERROR);
    CHECK_EQ(vi_state(other), VIP_STATE_ERROR);
    barrier(3);
    return teardown();
}

/* The child sends. */
static int child(void)
{
    VIP_DESCRIPTOR *d;

    setup();
    connect_to(nic, vi, disc("vi"));
    connect_to(nic, other, disc("other"));

    barrier(1);
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 8192, r.mh, 32);
    OK(VipPostSend(other, d, r.mh));
    send_wait(other, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);

    barrier(2);
    d = desc_at(&r, 64);
    fill(r.base + 8192, 256, 1);
    desc_simple(d, r.base + 8192, r.mh, 256);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_REMOTE_DESC_ERROR);
    CHECK_EQ(vi_state(vi), VIP_STATE_ERROR);
    barrier(3);
    return teardown();
}

int main(void) { return run_pair("failstate", 120, parent, child); }
