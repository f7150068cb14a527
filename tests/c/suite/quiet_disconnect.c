/* quiet_disconnect.c: a program that sets no error callback is not told
 * at error level about an orderly VipDisconnect by its peer (the
 * CONN_LOST of that VI is logged at info level), and still is about a
 * real error (its peer killed). The parent reads its own stderr through
 * a pipe: VI 1's peer disconnects, then the peer is killed, which breaks
 * VI 2; errors are reported in order, so once VI 2's error line is there,
 * VI 1's report was handled too, and exactly one error line must exist. */
#include "common.h"

#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static VIP_NIC_HANDLE nic;
static VIP_PROTECTION_HANDLE tag;
static VIP_VI_HANDLE vi1, vi2;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char captured[65536];
static size_t n_captured;
static int real_stderr = -1;

/* Copies the pipe behind fd 2 into `captured` and on to the real stderr. */
static void *reader(void *arg)
{
    int fd = *(int *)arg;
    char buf[4096];
    for (;;) {
        ssize_t k = read(fd, buf, sizeof buf);
        if (k <= 0)
            return NULL;
        if (write(real_stderr, buf, (size_t)k) < 0) {
            /* Nothing to do: the copy in `captured` is what counts. */
        }
        pthread_mutex_lock(&lock);
        if (n_captured + (size_t)k < sizeof captured) {
            memcpy(captured + n_captured, buf, (size_t)k);
            n_captured += (size_t)k;
            captured[n_captured] = 0;
        }
        pthread_mutex_unlock(&lock);
    }
}

static int has_conn_lost_error(void *p)
{
    int v;
    (void)p;
    pthread_mutex_lock(&lock);
    v = strstr(captured, " ERROR: ") != NULL && strstr(captured, "ConnLost") != NULL;
    pthread_mutex_unlock(&lock);
    return v;
}

static int error_lines(void)
{
    int n = 0;
    const char *s;
    pthread_mutex_lock(&lock);
    for (s = captured; (s = strstr(s, " ERROR: ")) != NULL; s++)
        n++;
    pthread_mutex_unlock(&lock);
    return n;
}

static int parent(void)
{
    int fds[2], status;
    pthread_t t;
    pid_t pid;
    /* Our stderr, from here on, goes through the reader. */
    CHECK(pipe(fds) == 0);
    real_stderr = dup(2);
    CHECK(real_stderr >= 0);
    CHECK(dup2(fds[1], 2) == 2);
    close(fds[1]);
    CHECK(pthread_create(&t, NULL, reader, &fds[0]) == 0);

    nic = open_nic();
    tag = new_ptag(nic);
    vi1 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    vi2 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    accept_on(nic, vi1, disc("q1"));
    accept_on(nic, vi2, disc("q2"));
    barrier(1);
    /* The child disconnects VI 1, orderly. */
    CHECK_MSG(wait_state(vi1, VIP_STATE_ERROR, BOUND_MS), "VI 1 not broken by the peer's disconnect");
    barrier(2);
    /* Then dies: a real error on VI 2. */
    pid = (pid_t)child_pid();
    CHECK(kill(pid, SIGKILL) == 0);
    CHECK(waitpid(pid, &status, 0) == pid);
    child_reaped();
    CHECK(wait_state(vi2, VIP_STATE_ERROR, BOUND_MS));
    CHECK_MSG(poll_until(has_conn_lost_error, NULL, BOUND_MS),
              "no error logged for the killed peer; stderr:\n%s", captured);
    CHECK_MSG(error_lines() == 1, "%d error lines (expected only the killed peer's); stderr:\n%s",
              error_lines(), captured);

    OK(VipDisconnect(vi1));
    OK(VipDisconnect(vi2));
    OK(VipDestroyVi(vi1));
    OK(VipDestroyVi(vi2));
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    nic = open_nic();
    tag = new_ptag(nic);
    vi1 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    vi2 = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 4096, 0, 0), NULL, NULL);
    connect_to(nic, vi1, disc("q1"));
    connect_to(nic, vi2, disc("q2"));
    barrier(1);
    OK(VipDisconnect(vi1));
    barrier(2);
    for (;;)
        pause();
}

int main(void) { return run_pair("quiet_disconnect", 120, parent, child); }
