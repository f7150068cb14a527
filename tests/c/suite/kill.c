/* kill.c: the peer process is SIGKILLed: within a bounded time the
 * survivor's VI enters the error state, the error callback gets
 * VIP_ERROR_CONN_LOST for it, its outstanding receives complete with
 * VIP_STATUS_DESC_FLUSHED_ERROR (also into its CQ), a thread blocked in
 * VipRecvWait(VIP_INFINITE) is woken, and the VI can be disconnected,
 * destroyed and connected again. */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#define K 4
#define FLUSHED_RECV (VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE | VIP_STATUS_DESC_FLUSHED_ERROR)

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static region r;
static VIP_VI_HANDLE vi, vi2;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int n_errors;
static VIP_ERROR_DESCRIPTOR errs[8];
static double error_at;

static void on_error(VIP_PVOID ctx, VIP_ERROR_DESCRIPTOR *e)
{
    CHECK(ctx == &n_errors);
    pthread_mutex_lock(&lock);
    if (n_errors < 8)
        errs[n_errors] = *e;
    n_errors++;
    error_at = now_ms();
    pthread_mutex_unlock(&lock);
}

static int two_errors(void *p)
{
    int v;
    (void)p;
    pthread_mutex_lock(&lock);
    v = n_errors >= 2;
    pthread_mutex_unlock(&lock);
    return v;
}

/* Blocks in VipRecvWait(VIP_INFINITE) on vi2 until the flush wakes it. */
static void *waiter(void *arg)
{
    VIP_DESCRIPTOR *d = NULL;
    OK(VipRecvWait(vi2, VIP_INFINITE, &d));
    CHECK(d == arg);
    return d;
}

static int parent(void)
{
    VIP_CQ_HANDLE cq;
    VIP_DESCRIPTOR *d, *w;
    VIP_VI_HANDLE cvi;
    VIP_BOOLEAN rq;
    pthread_t t;
    void *res;
    double t0, dt;
    int i, status;
    pid_t pid;

    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    OK(VipErrorCallback(nic, &n_errors, on_error));
    OK(VipCreateCQ(nic, 64, &cq));
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 4096, 0, 0), NULL, cq);
    vi2 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    for (i = 0; i < K; i++) {
        d = desc_at(&r, 64 * (size_t)i);
        desc_simple(d, r.base + 4096, r.mh, 1024);
        OK(VipPostRecv(vi, d, r.mh));
    }
    w = desc_at(&r, 64 * 10);
    desc_simple(w, r.base + 8192, r.mh, 1024);
    OK(VipPostRecv(vi2, w, r.mh));
    accept_on(nic, vi, disc("k"));
    accept_on(nic, vi2, disc("k2"));
    /* One message arrives before the kill and is not flushed. */
    barrier(1);
    OK(VipCQWait(cq, WAIT_MS, &cvi, &rq));
    CHECK(cvi == vi && rq == VIP_TRUE);
    OK(VipRecvDone(vi, &d));
    CHECK(d == desc_at(&r, 0));
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    CHECK(pthread_create(&t, NULL, waiter, w) == 0);
    barrier(2);

    pid = (pid_t)child_pid();
    t0 = now_ms();
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, &status, 0) == pid);
    child_reaped();
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    CHECK_MSG(wait_state(vi, VIP_STATE_ERROR, BOUND_MS), "VI not in the error state %lu ms after the kill", BOUND_MS);
    CHECK(wait_state(vi2, VIP_STATE_ERROR, BOUND_MS));
    dt = now_ms() - t0;
    CHECK_MSG(dt < BOUND_MS, "error state reached %.0f ms after the kill", dt);
    /* The blocked waiter is woken with its flushed descriptor. */
    CHECK(pthread_join(t, &res) == 0);
    CHECK(res == w);
    CHECK_STATUS(w, FLUSHED_RECV);
    /* The rest of vi's receives, flushed, in order, with CQ entries. */
    for (i = 1; i < K; i++) {
        OK(VipCQWait(cq, WAIT_MS, &cvi, &rq));
        CHECK(cvi == vi && rq == VIP_TRUE);
        OK(VipRecvDone(vi, &d));
        CHECK(d == desc_at(&r, 64 * (size_t)i));
        CHECK_STATUS(d, FLUSHED_RECV);
    }
    /* The error callback: CONN_LOST for each VI. */
    CHECK_MSG(poll_until(two_errors, NULL, BOUND_MS), "%d error callbacks after the kill", n_errors);
    pthread_mutex_lock(&lock);
    CHECK_EQ(n_errors, 2);
    for (i = 0; i < 2; i++) {
        CHECK_EQ(errs[i].ErrorCode, VIP_ERROR_CONN_LOST);
        CHECK_EQ(errs[i].ResourceCode, VIP_RESOURCE_VI);
        CHECK(errs[i].NicHandle == nic);
        CHECK(errs[i].CQHandle == NULL);
    }
    CHECK((errs[0].ViHandle == vi && errs[1].ViHandle == vi2) || (errs[0].ViHandle == vi2 && errs[1].ViHandle == vi));
    CHECK_MSG(error_at - t0 < BOUND_MS, "error callback %.0f ms after the kill", error_at - t0);
    pthread_mutex_unlock(&lock);
    /* Sends to the dead peer are flushed. */
    d = desc_at(&r, 64 * 20);
    desc_simple(d, r.base + 4096, r.mh, 10);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND | VIP_STATUS_DESC_FLUSHED_ERROR);

    OK(VipDisconnect(vi));
    OK(VipDisconnect(vi2));
    CHECK_EQ(vi_state(vi), VIP_STATE_IDLE);
    OK(VipDestroyVi(vi));
    OK(VipDestroyVi(vi2));
    OK(VipDestroyCQ(cq));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_DESCRIPTOR *d;
    nic = open_nic();
    tag = new_ptag(nic);
    r = region_new(nic, tag, 65536, 0, 0);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_RECEPTION, 4096, 0, 0), NULL, NULL);
    vi2 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    connect_to(nic, vi, disc("k"));
    connect_to(nic, vi2, disc("k2"));
    /* Receives of our own, outstanding when we die. */
    d = desc_at(&r, 64);
    desc_simple(d, r.base + 8192, r.mh, 1024);
    OK(VipPostRecv(vi, d, r.mh));
    d = desc_at(&r, 0);
    desc_simple(d, r.base + 4096, r.mh, 10);
    OK(VipPostSend(vi, d, r.mh));
    send_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    barrier(1);
    barrier(2);
    for (;;)
        pause();
}

int main(void) { return run_pair("kill", 120, parent, child); }
