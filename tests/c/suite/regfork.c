/* regfork.c: fork after registration, as programs that call fork, system
 * or popen do.
 *
 * The parent of the pair has heap objects around registered buffers: a
 * live registration of a malloc'd buffer, one of a page-aligned buffer,
 * and a malloc'd buffer registered and deregistered again (kept by the
 * registration cache). It forks a grandchild, which
 *   - finds every heap object intact and churns the heap (frees half the
 *     objects, allocates and fills new ones), and writes the deregistered
 *     buffer: all of that is its own, private memory;
 *   - finds the pages of the live registrations absent (as verbs programs
 *     get after ibv_fork_init), the partly covered first and last pages of
 *     the malloc'd one present with the neighbours' bytes.
 * Then the parent finds its heap objects and the deregistered buffer
 * unchanged, and the connection and the registrations still working (the
 * peer sends into both registered buffers).
 *
 * With VIA_REGCACHE=off, a deregistered buffer is private memory again in
 * the parent itself (not in a shared file). */
#include "common.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define NOBJ 80
#define BUF 65536

static unsigned char *obj[NOBJ];
static size_t objlen[NOBJ];

static VIP_MEM_HANDLE reg(VIP_NIC_HANDLE nic, void *p, size_t n, VIP_PROTECTION_HANDLE tag)
{
    VIP_MEM_ATTRIBUTES ma;
    VIP_MEM_HANDLE mh = 0;
    ma.Ptag = tag;
    ma.EnableRdmaWrite = VIP_FALSE;
    ma.EnableRdmaRead = VIP_FALSE;
    OK(VipRegisterMem(nic, p, n, &ma, &mh));
    return mh;
}

/* Receives `len` bytes of fill(seed) into buf (handle bmh), with the
 * descriptor d in another region (handle dmh); in step with the sender's
 * exchange_message. */
static void receive_into(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d, VIP_MEM_HANDLE dmh, unsigned char *buf,
                         VIP_MEM_HANDLE bmh, uint32_t len, uint32_t seed)
{
    desc_simple(d, buf, bmh, len);
    OK(VipPostRecv(vi, d, dmh));
    barrier(100);
    recv_wait(vi, d);
    CHECK_STATUS(d, VIP_STATUS_DONE | VIP_STATUS_OP_RECEIVE);
    CHECK_EQ(d->CS.Length, len);
    CHECK(check_fill(buf, len, seed) == -1);
}

static int objects_intact(void)
{
    int i;
    for (i = 0; i < NOBJ; i++)
        if (obj[i] && check_fill(obj[i], objlen[i], 7000 + i) != -1)
            return 0;
    return 1;
}

/* Whether any mapping of this process covers address a. */
static int mapped(const void *a)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int found = 0;
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= (unsigned long)a && (unsigned long)a < hi)
            found = 1;
    }
    fclose(f);
    return found;
}

/* Whether the mapping at a is one of the provider's shared files. */
static int in_shared_file(const void *a)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int shared = 0;
    CHECK(f != NULL);
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && lo <= (unsigned long)a && (unsigned long)a < hi)
            shared = strstr(line, "via-arena") != NULL;
    }
    fclose(f);
    return shared;
}

static int grandchild(unsigned char *heapbuf, unsigned char *aligned, unsigned char *dereg)
{
    long page = sysconf(_SC_PAGESIZE);
    unsigned char *first_whole = (unsigned char *)(((uintptr_t)heapbuf + page - 1) & ~(uintptr_t)(page - 1));
    int i;
    if (!objects_intact())
        return 10;
    /* The registered pages are not in the child; the partly covered ones are. */
    if (mapped(aligned) || mapped(first_whole))
        return 11;
    if (!mapped(heapbuf) || !mapped(heapbuf + BUF - 1))
        return 12;
    /* The deregistered buffer is the child's own. */
    if (check_fill(dereg, BUF, 33) != -1)
        return 13;
    fill(dereg, BUF, 34);
    /* Heap churn: ordinary malloc and free. */
    for (i = 0; i < NOBJ; i += 2) {
        free(obj[i]);
        objlen[i] = 16 + (size_t)(i * 977) % 9000;
        obj[i] = malloc(objlen[i]);
        if (!obj[i])
            return 14;
        fill(obj[i], objlen[i], 9000 + i);
    }
    for (i = 0; i < NOBJ; i++)
        if (check_fill(obj[i], objlen[i], (i % 2 ? 7000 : 9000) + i) != -1)
            return 15;
    return 0;
}

static int parent(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, BUF, 0, 0), NULL, NULL);
    region r = region_new(nic, tag, 4096, 0, 0);
    unsigned char *heapbuf = NULL, *aligned, *dereg = NULL;
    VIP_MEM_HANDLE hh, ah, dh;
    const char *cache = getenv("VIA_REGCACHE");
    int i, st;
    pid_t g;

    for (i = 0; i < NOBJ; i++) {
        objlen[i] = 16 + (size_t)(i * 7919) % 5000;
        obj[i] = malloc(objlen[i]);
        CHECK(obj[i] != NULL);
        fill(obj[i], objlen[i], 7000 + i);
        if (i == NOBJ / 3) {
            heapbuf = malloc(BUF);
            dereg = malloc(BUF);
        }
    }
    aligned = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(heapbuf && dereg && aligned != MAP_FAILED);
    fill(dereg, BUF, 33);
    dh = reg(nic, dereg, BUF, tag);
    OK(VipDeregisterMem(nic, dereg, dh));
    if (cache && strcmp(cache, "off") == 0)
        CHECK_MSG(!in_shared_file(dereg + 8192), "deregistered pages stayed in a shared file");
    hh = reg(nic, heapbuf, BUF, tag);
    ah = reg(nic, aligned, BUF, tag);
    accept_on(nic, vi, disc("fork"));

    fflush(NULL);
    g = fork();
    CHECK(g >= 0);
    if (g == 0)
        _exit(grandchild(heapbuf, aligned, dereg));
    CHECK(waitpid(g, &st, 0) == g);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the forked child failed: status 0x%x "
              "(10: heap objects, 11: registered pages present, 12: partly covered pages absent, "
              "13: deregistered buffer, 14/15: malloc in the child)", st);
    CHECK_MSG(objects_intact(), "the child's malloc and free changed the parent's heap objects");
    CHECK_MSG(check_fill(dereg, BUF, 33) == -1, "the child's writes reached the parent's memory");

    /* The registrations still work. */
    receive_into(vi, desc_at(&r, 0), r.mh, heapbuf, hh, BUF, 41);
    receive_into(vi, desc_at(&r, 64), r.mh, aligned, ah, BUF, 42);
    CHECK(objects_intact());
    barrier(1);
    OK(VipDisconnect(vi));
    OK(VipDeregisterMem(nic, heapbuf, hh));
    OK(VipDeregisterMem(nic, aligned, ah));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

static int child(void)
{
    VIP_NIC_HANDLE nic = open_nic();
    VIP_PROTECTION_HANDLE tag = new_ptag(nic);
    VIP_VI_HANDLE vi = new_vi(nic, vi_attrs(tag, VIP_SERVICE_RELIABLE_DELIVERY, BUF, 0, 0), NULL, NULL);
    region r = region_new(nic, tag, BUF + 4096, 0, 0);
    connect_to(nic, vi, disc("fork"));
    exchange_message(vi, desc_at(&r, 0), r.base + 4096, r.mh, BUF, 1, BUF, 41);
    exchange_message(vi, desc_at(&r, 64), r.base + 4096, r.mh, BUF, 1, BUF, 42);
    barrier(1);
    CHECK(wait_state(vi, VIP_STATE_ERROR, BOUND_MS));
    OK(VipDisconnect(vi));
    OK(VipDestroyVi(vi));
    region_free(&r);
    OK(VipCloseNic(nic));
    return 0;
}

int main(void) { return run_pair("regfork", 120, parent, child); }
