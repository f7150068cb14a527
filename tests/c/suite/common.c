/* common.c: helpers of the VIPL C conformance suite; see common.h. */
#include "common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *suite_prog = "?";
const char *suite_role = "main";
int suite_pid;

static int to_peer = -1;
static int from_peer = -1;
static pid_t the_child = -1;

const char *vip_str(VIP_RETURN r)
{
    static const char *names[] = {
        "VIP_SUCCESS", "VIP_NOT_DONE", "VIP_INVALID_PARAMETER",
        "VIP_ERROR_RESOURCE", "VIP_TIMEOUT", "VIP_REJECT",
        "VIP_INVALID_RELIABILITY_LEVEL", "VIP_INVALID_MTU",
        "VIP_INVALID_QOS", "VIP_INVALID_PTAG", "VIP_INVALID_RDMAREAD",
        "VIP_DESCRIPTOR_ERROR", "VIP_INVALID_STATE",
        "VIP_ERROR_NAMESERVICE", "VIP_NO_MATCH",
    };
    if ((unsigned)r < sizeof names / sizeof names[0])
        return names[r];
    return "(unknown VIP_RETURN)";
}

void suite_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "FAIL [%s/%s] %s:%d: ", suite_prog, suite_role, file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    if (the_child > 0)
        kill(the_child, SIGKILL);
    _exit(1);
}

static void on_alarm(int sig)
{
    static const char msg[] = "FAIL: timed out (alarm): the program hung\n";
    ssize_t n;
    (void)sig;
    n = write(2, msg, sizeof msg - 1);
    (void)n;
    if (the_child > 0)
        kill(the_child, SIGKILL);
    _exit(3);
}

int child_pid(void) { return (int)the_child; }
void child_reaped(void) { the_child = -1; }

/* SUITE_PEER_NETNS=/run/netns/<name>: the child is "another host". Before
 * it opens anything of the library, it enters that network namespace and
 * takes the other host's settings: SUITE_PEER_DEVICE (its NIC),
 * SUITE_PEER_INSTANCE (its own viad: the daemon's socket path is reachable
 * from every namespace, its TCP listeners are not) and
 * SUITE_PEER_REMOTE_HOST (the parent's host address, for remote_addr). */
static void become_remote_peer(void)
{
    const char *ns = getenv("SUITE_PEER_NETNS");
    const char *dev = getenv("SUITE_PEER_DEVICE");
    const char *inst = getenv("SUITE_PEER_INSTANCE");
    const char *remote = getenv("SUITE_PEER_REMOTE_HOST");
    int fd;
    if (!ns || !*ns)
        return;
    CHECK_MSG(dev && *dev && inst && *inst && remote && *remote,
              "SUITE_PEER_NETNS needs SUITE_PEER_DEVICE, SUITE_PEER_INSTANCE and "
              "SUITE_PEER_REMOTE_HOST");
    fd = open(ns, O_RDONLY | O_CLOEXEC);
    CHECK_MSG(fd >= 0, "open %s: %s", ns, strerror(errno));
    CHECK_MSG(setns(fd, CLONE_NEWNET) == 0, "setns %s: %s", ns, strerror(errno));
    close(fd);
    CHECK(setenv("SUITE_DEVICE", dev, 1) == 0);
    CHECK(setenv("VIA_INSTANCE", inst, 1) == 0);
    CHECK(setenv("SUITE_REMOTE_HOST", remote, 1) == 0);
}

int suite_between_hosts(void)
{
    const char *ns = getenv("SUITE_PEER_NETNS");
    return ns && *ns;
}

int run_pair(const char *prog, unsigned alarm_s, int (*parent)(void), int (*child)(void))
{
    int p2c[2], c2p[2];
    int status = 0, rc;
    pid_t pid;

    suite_prog = prog;
    suite_pid = (int)getpid();
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    /* Close-on-exec: the viad the library may start (fork + exec) must not
     * keep the pipes open, or a side would never see the other exit. */
    if (pipe2(p2c, O_CLOEXEC) != 0 || pipe2(c2p, O_CLOEXEC) != 0) {
        perror("pipe");
        return 2;
    }
    alarm(alarm_s);
    fflush(NULL);
    pid = fork();
    if (pid < 0) {
        perror("fork");
        return 2;
    }
    if (pid == 0) {
        suite_role = "child";
        /* Die with the parent, whatever happens to it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != (pid_t)suite_pid)
            _exit(4);
        become_remote_peer();
        close(p2c[1]);
        close(c2p[0]);
        from_peer = p2c[0];
        to_peer = c2p[1];
        rc = child();
        /* exit, not _exit: leak checkers (ASan builds) run at exit. */
        exit(rc);
    }
    suite_role = "parent";
    the_child = pid;
    close(p2c[0]);
    close(c2p[1]);
    from_peer = c2p[0];
    to_peer = p2c[1];
    rc = parent();
    if (rc != 0) {
        fprintf(stderr, "FAIL [%s/parent]: returned %d\n", prog, rc);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return rc;
    }
    if (the_child > 0) {
        if (waitpid(pid, &status, 0) != pid) {
            perror("waitpid");
            return 2;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (WIFSIGNALED(status))
                fprintf(stderr, "FAIL [%s/child]: killed by signal %d\n", prog, WTERMSIG(status));
            else
                fprintf(stderr, "FAIL [%s/child]: exit status %d\n", prog, WEXITSTATUS(status));
            return 1;
        }
    }
    printf("PASS %s\n", prog);
    return 0;
}

void say(const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(to_peer, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        CHECK_MSG(k > 0, "say: the other process is gone (%s)", k < 0 ? strerror(errno) : "EOF");
        p += k;
        n -= (size_t)k;
    }
}

void hear(void *buf, size_t n)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = read(from_peer, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        CHECK_MSG(k > 0, "hear: the other process is gone (%s)", k < 0 ? strerror(errno) : "EOF");
        p += k;
        n -= (size_t)k;
    }
}

void say_u64(uint64_t v) { say(&v, sizeof v); }

uint64_t hear_u64(void)
{
    uint64_t v;
    hear(&v, sizeof v);
    return v;
}

void barrier(int id)
{
    int other;
    say(&id, sizeof id);
    hear(&other, sizeof other);
    CHECK_MSG(other == id, "barrier %d met barrier %d of the other process", id, other);
}

static char hosts_path[64];

static void remove_hosts_file(void)
{
    if (hosts_path[0] && getpid() == (pid_t)suite_pid)
        unlink(hosts_path);
}

void use_hosts_file(const char *contents)
{
    char instance[64];
    FILE *f;
    snprintf(hosts_path, sizeof hosts_path, "/tmp/vipl-hosts-%d", (int)getpid());
    f = fopen(hosts_path, "w");
    CHECK(f != NULL);
    CHECK(fputs(contents, f) >= 0);
    CHECK(fclose(f) == 0);
    snprintf(instance, sizeof instance, "%s-hosts-%d",
             getenv("VIA_INSTANCE") ? getenv("VIA_INSTANCE") : "suite", (int)getpid());
    CHECK(setenv("VIA_HOSTS", hosts_path, 1) == 0);
    CHECK(setenv("VIA_INSTANCE", instance, 1) == 0);
    suite_pid = (int)getpid();
    atexit(remove_hosts_file);
}

double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

int poll_until(int (*f)(void *), void *arg, unsigned long ms)
{
    double end = now_ms() + (double)ms;
    struct timespec one = {0, 1000000};
    int v;
    while (!(v = f(arg)) && now_ms() < end)
        nanosleep(&one, NULL);
    return v;
}

VIP_NIC_HANDLE open_nic(void)
{
    VIP_NIC_HANDLE nic = NULL;
    /* SUITE_DEVICE: run the suite on another kind of NIC (tools/verbs-vm.sh
     * c: rxe0). */
    const char *dev = getenv("SUITE_DEVICE");
    OK(VipOpenNic(dev && *dev ? dev : "/dev/via_lo", &nic));
    CHECK(nic != NULL);
    return nic;
}

VIP_NIC_ATTRIBUTES nic_attrs(VIP_NIC_HANDLE nic)
{
    VIP_NIC_ATTRIBUTES a;
    memset(&a, 0, sizeof a);
    OK(VipQueryNic(nic, &a));
    return a;
}

VIP_PROTECTION_HANDLE new_ptag(VIP_NIC_HANDLE nic)
{
    VIP_PROTECTION_HANDLE p = NULL;
    OK(VipCreatePtag(nic, &p));
    CHECK(p != NULL);
    return p;
}

const char *disc(const char *tag)
{
    static char bufs[8][96];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s-%d-%s", suite_prog, suite_pid, tag);
    return b;
}

VIP_NET_ADDRESS *make_addr(VIP_NIC_HANDLE nic, const char *d)
{
    VIP_NIC_ATTRIBUTES a = nic_attrs(nic);
    size_t dl = strlen(d);
    VIP_NET_ADDRESS *addr = malloc(sizeof *addr + a.NicAddressLen + dl);
    CHECK(addr != NULL);
    addr->HostAddressLen = a.NicAddressLen;
    addr->DiscriminatorLen = (VIP_UINT16)dl;
    memcpy(addr->HostAddress, a.LocalNicAddress, a.NicAddressLen);
    memcpy(addr->HostAddress + a.NicAddressLen, d, dl);
    return addr;
}

VIP_NET_ADDRESS *remote_addr(VIP_NIC_HANDLE nic, const char *d)
{
    /* SUITE_REMOTE_HOST: the other process's host (an IPv4 address), when
     * it runs on another host (SUITE_PEER_NETNS); else it is this one. */
    const char *host = getenv("SUITE_REMOTE_HOST");
    struct in_addr in;
    VIP_NET_ADDRESS *addr = make_addr(nic, d);
    if (!host || !*host)
        return addr;
    CHECK_MSG(inet_pton(AF_INET, host, &in) == 1, "SUITE_REMOTE_HOST=%s is not an IPv4 address", host);
    CHECK_MSG(addr->HostAddressLen == 4, "SUITE_REMOTE_HOST on a NIC whose addresses are not IPv4");
    memcpy(addr->HostAddress, &in.s_addr, 4);
    return addr;
}

VIP_NET_ADDRESS *addr_room(VIP_NIC_HANDLE nic)
{
    VIP_NIC_ATTRIBUTES a = nic_attrs(nic);
    VIP_NET_ADDRESS *addr = calloc(1, sizeof *addr + a.NicAddressLen + a.MaxDiscriminatorLen);
    CHECK(addr != NULL);
    return addr;
}

VIP_VI_ATTRIBUTES vi_attrs(VIP_PROTECTION_HANDLE ptag, VIP_RELIABILITY_LEVEL level,
                           unsigned long mtu, int rdma_write, int rdma_read)
{
    VIP_VI_ATTRIBUTES a;
    memset(&a, 0, sizeof a);
    a.ReliabilityLevel = level;
    a.MaxTransferSize = mtu;
    a.QoS = NULL;
    a.Ptag = ptag;
    a.EnableRdmaWrite = rdma_write ? VIP_TRUE : VIP_FALSE;
    a.EnableRdmaRead = rdma_read ? VIP_TRUE : VIP_FALSE;
    return a;
}

VIP_VI_HANDLE new_vi(VIP_NIC_HANDLE nic, VIP_VI_ATTRIBUTES a, VIP_CQ_HANDLE scq, VIP_CQ_HANDLE rcq)
{
    VIP_VI_HANDLE vi = NULL;
    OK(VipCreateVi(nic, &a, scq, rcq, &vi));
    CHECK(vi != NULL);
    return vi;
}

VIP_VI_STATE vi_state(VIP_VI_HANDLE vi)
{
    VIP_VI_STATE s;
    VIP_VI_ATTRIBUTES a;
    VIP_BOOLEAN se, re;
    OK(VipQueryVi(vi, &s, &a, &se, &re));
    return s;
}

struct state_wait {
    VIP_VI_HANDLE vi;
    VIP_VI_STATE state;
};

static int state_reached(void *p)
{
    struct state_wait *w = p;
    return vi_state(w->vi) == w->state;
}

int wait_state(VIP_VI_HANDLE vi, VIP_VI_STATE state, unsigned long ms)
{
    struct state_wait w;
    w.vi = vi;
    w.state = state;
    return poll_until(state_reached, &w, ms);
}

void accept_on(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *d)
{
    VIP_NET_ADDRESS *local = make_addr(nic, d);
    VIP_NET_ADDRESS *remote = addr_room(nic);
    VIP_VI_ATTRIBUTES ra;
    VIP_CONN_HANDLE conn = NULL;
    OK(VipConnectWait(nic, local, WAIT_MS, remote, &ra, &conn));
    OK(VipConnectAccept(conn, vi));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    free(local);
    free(remote);
}

void connect_to(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *d)
{
    char mine[120];
    VIP_NET_ADDRESS *local, *remote = remote_addr(nic, d);
    VIP_VI_ATTRIBUTES ra;
    snprintf(mine, sizeof mine, "%s-client", d);
    local = make_addr(nic, mine);
    OK(VipConnectRequest(vi, local, remote, WAIT_MS, &ra));
    CHECK_EQ(vi_state(vi), VIP_STATE_CONNECTED);
    free(local);
    free(remote);
}

region region_new(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE ptag, size_t len,
                  int rdma_write, int rdma_read)
{
    region r;
    void *p = NULL;
    long page = sysconf(_SC_PAGESIZE);
    r.nic = nic;
    r.len = (len + (size_t)page - 1) / (size_t)page * (size_t)page;
    CHECK(posix_memalign(&p, (size_t)page, r.len) == 0);
    memset(p, 0, r.len);
    r.base = p;
    r.mh = reg_mem(nic, r.base, r.len, ptag, rdma_write, rdma_read);
    return r;
}

VIP_MEM_HANDLE reg_mem(VIP_NIC_HANDLE nic, void *p, size_t n, VIP_PROTECTION_HANDLE ptag,
                       int rdma_write, int rdma_read)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 0;
    ma.Ptag = ptag;
    ma.EnableRdmaWrite = rdma_write ? VIP_TRUE : VIP_FALSE;
    ma.EnableRdmaRead = rdma_read ? VIP_TRUE : VIP_FALSE;
    OK(VipRegisterMem(nic, p, n, &ma, &mh));
    return mh;
}

void region_free(region *r)
{
    OK(VipDeregisterMem(r->nic, r->base, r->mh));
    free(r->base);
    r->base = NULL;
}

VIP_DESCRIPTOR *desc_at(region *r, size_t off)
{
    CHECK(off % VIP_DESCRIPTOR_ALIGNMENT == 0 && off + 32 <= r->len);
    return (VIP_DESCRIPTOR *)(void *)(r->base + off);
}

void desc_init(VIP_DESCRIPTOR *d, unsigned control, unsigned segs)
{
    memset(&d->CS, 0, sizeof d->CS);
    d->CS.Control = (VIP_UINT16)control;
    d->CS.SegCount = (VIP_UINT16)segs;
}

void desc_local(VIP_DESCRIPTOR *d, unsigned i, void *addr, VIP_MEM_HANDLE h, uint32_t len)
{
    d->DS[i].Local.Data.AddressBits = 0;
    d->DS[i].Local.Data.Address = addr;
    d->DS[i].Local.Handle = h;
    d->DS[i].Local.Length = len;
}

void desc_remote(VIP_DESCRIPTOR *d, uint64_t addr, VIP_MEM_HANDLE h)
{
    d->DS[0].Remote.Data.AddressBits = addr;
    d->DS[0].Remote.Handle = h;
    d->DS[0].Remote.Reserved = 0;
}

void desc_simple(VIP_DESCRIPTOR *d, void *addr, VIP_MEM_HANDLE h, uint32_t len)
{
    desc_init(d, VIP_CONTROL_OP_SENDRECV, 1);
    desc_local(d, 0, addr, h, len);
    d->CS.Length = len;
}

VIP_DESCRIPTOR *recv_wait(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *expect)
{
    VIP_DESCRIPTOR *d = NULL;
    OK(VipRecvWait(vi, WAIT_MS, &d));
    CHECK_MSG(d == expect, "VipRecvWait returned descriptor %p, expected %p", (void *)d, (void *)expect);
    return d;
}

VIP_DESCRIPTOR *send_wait(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *expect)
{
    VIP_DESCRIPTOR *d = NULL;
    OK(VipSendWait(vi, WAIT_MS, &d));
    CHECK_MSG(d == expect, "VipSendWait returned descriptor %p, expected %p", (void *)d, (void *)expect);
    return d;
}

void exchange_message(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d, unsigned char *buf, VIP_MEM_HANDLE mh,
                      uint32_t cap, int sender, uint32_t len, uint32_t seed)
{
    if (sender) {
        barrier(100);
        fill(buf, len, seed);
        desc_simple(d, buf, mh, len);
        OK(VipPostSend(vi, d, mh));
        send_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_SEND);
    } else {
        desc_simple(d, buf, mh, cap);
        OK(VipPostRecv(vi, d, mh));
        barrier(100);
        recv_wait(vi, d);
        CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
        CHECK_EQ(d->CS.Length, len);
        CHECK(check_fill(buf, len, seed) == -1);
    }
}

void fill(void *buf, size_t n, uint32_t seed)
{
    unsigned char *p = buf;
    uint32_t x = seed * 2654435761u + 0x9e3779b9u;
    size_t i;
    for (i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)(x >> 7);
    }
}

long check_fill(const void *buf, size_t n, uint32_t seed)
{
    const unsigned char *p = buf;
    uint32_t x = seed * 2654435761u + 0x9e3779b9u;
    size_t i;
    for (i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        if (p[i] != (unsigned char)(x >> 7))
            return (long)i;
    }
    return -1;
}

void rdma_write_wait(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d, void *src, VIP_MEM_HANDLE mh,
                     VIP_MEM_HANDLE d_mh, uint64_t addr, VIP_MEM_HANDLE h, uint32_t len)
{
    desc_init(d, VIP_CONTROL_OP_RDMAWRITE, 2);
    desc_remote(d, addr, h);
    desc_local(d, 1, src, mh, len);
    d->CS.Length = len;
    OK(VipPostSend(vi, d, d_mh));
    send_wait(vi, d);
}
