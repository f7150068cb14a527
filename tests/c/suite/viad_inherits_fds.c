/* viad_inherits_fds.c (regression test): the viad that the library starts
 * (fork + exec from the first process that opens a NIC) inherits that
 * process's file descriptors that are not close-on-exec, and keeps them
 * open while it lives. A legacy program that waits for EOF on a pipe
 * whose writer opened a NIC then waits for as long as viad runs.
 * Run with a VIA_INSTANCE no daemon serves yet, so the child starts it. */
#include "common.h"

#include <poll.h>
#include <unistd.h>

static int fds[2];

static int parent(void)
{
    struct pollfd p;
    char c;
    ssize_t n;
    close(fds[1]);
    barrier(1);
    /* The child has exited its VIA use and closed its end; EOF is due now. */
    p.fd = fds[0];
    p.events = POLLIN;
    CHECK_MSG(poll(&p, 1, 2000) == 1, "no EOF on the pipe 2 s after its only writer closed it: "
                                      "another process (viad) holds the write end");
    n = read(fds[0], &c, 1);
    CHECK_EQ(n, 0);
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic;
    close(fds[0]);
    nic = open_nic(); /* starts viad */
    OK(VipCloseNic(nic));
    close(fds[1]);
    barrier(1);
    return 0;
}

int main(void)
{
    /* A plain pipe, inherited by both processes (not close-on-exec). */
    CHECK(pipe(fds) == 0);
    return run_pair("viad_inherits_fds", 60, parent, child);
}
