/* forkopen.c: a process that used VIA and closed it forks a worker that
 * opens a NIC of its own, as a server that forks handlers does. The
 * worker's library state is new; what the parent left (its registration
 * cache, with the arena of a deregistered buffer) is the parent's, and the
 * worker must not tear it down in the parent's name (it would retire the
 * parent's arenas at the parent's viad session). Then the parent opens a
 * NIC again, registers the same buffer (served by its cache) and receives
 * into it from its peer: the peer must still reach that memory. */
#include "common.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define L (64 * 1024)

static int parent(void)
{
    /* A descriptor at its start, the message at 4096. */
    unsigned char *buf = mmap(NULL, L + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    VIP_NIC_HANDLE nic;
    VIP_PROTECTION_HANDLE tag;
    VIP_VI_HANDLE vi;
    VIP_MEM_HANDLE h;
    pid_t pid;
    int st = 0;
    CHECK(buf != MAP_FAILED);
    /* Used and closed: the buffer's arena stays in the registration cache. */
    nic = open_nic();
    tag = new_ptag(nic);
    h = reg_mem(nic, buf, L + 4096, tag, 0, 0);
    OK(VipDeregisterMem(nic, buf, h));
    OK(VipDestroyPtag(nic, tag));
    OK(VipCloseNic(nic));
    /* The worker opens and closes a NIC of its own. */
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        VIP_NIC_HANDLE n = open_nic();
        OK(VipCloseNic(n));
        _exit(0);
    }
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "worker status %#x", st);
    /* The parent again: the same buffer, received into from the peer. */
    nic = open_nic();
    tag = new_ptag(nic);
    vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 1 << 20, 0, 0), NULL, NULL);
    accept_on(nic, vi, disc("forkopen"));
    h = reg_mem(nic, buf, L + 4096, tag, 0, 0);
    exchange_message(vi, (VIP_DESCRIPTOR *)buf, buf + 4096, h, L, 0, L, 77);
    barrier(2);
    OK(VipDeregisterMem(nic, buf, h));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, 1 << 20, 0, 0), NULL, NULL);
    region r = region_new(nic, tag, L + 4096, 0, 0);
    connect_to(nic, vi, disc("forkopen"));
    exchange_message(vi, desc_at(&r, 0), r.base + 4096, r.mh, L, 1, L, 77);
    barrier(2);
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("forkopen", 120, parent, child); }
