/*
 * common.h: helpers of the VIPL C conformance suite (tests/c/suite).
 *
 * Every program of the suite checks one area of VIPL between two real
 * processes: main() calls run_pair(parent, child), which forks before
 * any Vip* call; the two sides talk over a pair of pipes (say/hear/
 * barrier) to exchange addresses and to order their steps. A failed
 * check prints "FAIL [program/role] file:line: what" and exits non-zero
 * (the parent also kills the child, and the child dies with its parent);
 * an alarm() bounds the whole run, and every VIPL wait has a timeout.
 * A program prints "PASS program" and exits 0 when both sides pass.
 */
#ifndef SUITE_COMMON_H
#define SUITE_COMMON_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vipl.h>

/* Timeout of ordinary waits that must succeed (ms). */
#define WAIT_MS 10000UL
/* Upper bound for things that must happen "within a bounded time" (ms). */
#define BOUND_MS 5000UL

extern const char *suite_prog; /* program name (set by run_pair) */
extern const char *suite_role; /* "parent" or "child" */
extern int suite_pid;          /* pid of the parent, for unique names */

/* ---- checks ---------------------------------------------------------- */

void suite_fail(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((noreturn, format(printf, 3, 4)))
#endif
    ;
const char *vip_str(VIP_RETURN r);

#define CHECK(cond)                                                      \
    do {                                                                 \
        if (!(cond))                                                     \
            suite_fail(__FILE__, __LINE__, "check failed: %s", #cond);   \
    } while (0)

#define CHECK_MSG(cond, ...)                                             \
    do {                                                                 \
        if (!(cond))                                                     \
            suite_fail(__FILE__, __LINE__, __VA_ARGS__);                 \
    } while (0)

#define EXPECT_RC(call, want)                                            \
    do {                                                                 \
        VIP_RETURN rc_ = (call);                                         \
        VIP_RETURN want_ = (want);                                       \
        if (rc_ != want_)                                                \
            suite_fail(__FILE__, __LINE__, "%s returned %s, expected %s", \
                       #call, vip_str(rc_), vip_str(want_));             \
    } while (0)

#define OK(call) EXPECT_RC(call, VIP_SUCCESS)

#define CHECK_EQ(a, b)                                                   \
    do {                                                                 \
        unsigned long long a_ = (unsigned long long)(a);                 \
        unsigned long long b_ = (unsigned long long)(b);                 \
        if (a_ != b_)                                                    \
            suite_fail(__FILE__, __LINE__, "%s == %s: %llu (0x%llx) != %llu (0x%llx)", \
                       #a, #b, a_, a_, b_, b_);                          \
    } while (0)

/* CS.Status must be exactly `want`. */
#define CHECK_STATUS(desc, want)                                         \
    do {                                                                 \
        unsigned st_ = (unsigned)(desc)->CS.Status;                      \
        unsigned want_ = (unsigned)(want);                               \
        if (st_ != want_)                                                \
            suite_fail(__FILE__, __LINE__, "status of %s: 0x%x, expected 0x%x", \
                       #desc, st_, want_);                               \
    } while (0)

/* ---- two processes --------------------------------------------------- */

/* Forks; runs parent() here and child() in the child; returns the exit
 * code for main (0 if both sides returned 0). `alarm_s` bounds the run. */
int run_pair(const char *prog, unsigned alarm_s, int (*parent)(void), int (*child)(void));
/* Between hosts: with SUITE_PEER_NETNS=/run/netns/<name> the child enters
 * that network namespace right after the fork and takes SUITE_PEER_DEVICE,
 * SUITE_PEER_INSTANCE and SUITE_PEER_REMOTE_HOST as its SUITE_DEVICE,
 * VIA_INSTANCE and SUITE_REMOTE_HOST (see remote_addr). Non-zero then. */
int suite_between_hosts(void);
/* The child's pid (in the parent), e.g. to kill it. */
int child_pid(void);
/* Marks the child as gone (after the parent reaped it itself). */
void child_reaped(void);

/* Sends / receives n bytes to / from the other process. */
void say(const void *buf, size_t n);
void hear(void *buf, size_t n);
void say_u64(uint64_t v);
uint64_t hear_u64(void);
/* Both processes call barrier(id) with the same id; returns when both did. */
void barrier(int id);

/* Writes `contents` as the name-service hosts file and points VIA_HOSTS at
 * it (the library reads it in this process), with a VIA_INSTANCE of this
 * program's own. Call before run_pair's fork (before any Vip*
 * call); the file is removed at exit. */
void use_hosts_file(const char *contents);

/* ---- time ------------------------------------------------------------ */

double now_ms(void);
/* Polls cond-like state: calls f(arg) every 1 ms until it returns non-zero
 * or `ms` pass; returns the last value. */
int poll_until(int (*f)(void *), void *arg, unsigned long ms);

/* ---- VIPL helpers ---------------------------------------------------- */

VIP_NIC_HANDLE open_nic(void);
VIP_NIC_ATTRIBUTES nic_attrs(VIP_NIC_HANDLE nic);
VIP_PROTECTION_HANDLE new_ptag(VIP_NIC_HANDLE nic);

/* A unique discriminator "<prog>-<parent pid>-<tag>". */
const char *disc(const char *tag);
/* A malloc'ed address: this NIC's host address plus discriminator `d`. */
VIP_NET_ADDRESS *make_addr(VIP_NIC_HANDLE nic, const char *d);
/* make_addr with the other process's host: SUITE_REMOTE_HOST (IPv4) when
 * set (the processes are on two hosts), else this NIC's. */
VIP_NET_ADDRESS *remote_addr(VIP_NIC_HANDLE nic, const char *d);
/* Room for any address the NIC can report (NicAddressLen + MaxDiscriminatorLen). */
VIP_NET_ADDRESS *addr_room(VIP_NIC_HANDLE nic);

VIP_VI_ATTRIBUTES vi_attrs(VIP_PROTECTION_HANDLE ptag, VIP_RELIABILITY_LEVEL level,
                           unsigned long mtu, int rdma_write, int rdma_read);
VIP_VI_HANDLE new_vi(VIP_NIC_HANDLE nic, VIP_VI_ATTRIBUTES a, VIP_CQ_HANDLE scq, VIP_CQ_HANDLE rcq);
VIP_VI_STATE vi_state(VIP_VI_HANDLE vi);
/* Waits (polling) up to `ms` for the VI to reach `state`; returns whether it did. */
int wait_state(VIP_VI_HANDLE vi, VIP_VI_STATE state, unsigned long ms);

/* Server side: waits for a request on discriminator d and accepts it with vi. */
void accept_on(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *d);
/* Client side: connects vi to discriminator d on the other process's host
 * (remote_addr). */
void connect_to(VIP_NIC_HANDLE nic, VIP_VI_HANDLE vi, const char *d);

/* Registered memory: page-aligned, zeroed, `len` bytes (rounded to pages). */
typedef struct {
    VIP_NIC_HANDLE nic;
    unsigned char *base;
    size_t len;
    VIP_MEM_HANDLE mh;
} region;
region region_new(VIP_NIC_HANDLE nic, VIP_PROTECTION_HANDLE ptag, size_t len,
                  int rdma_write, int rdma_read);
/* Posts an RDMA write of len bytes from src (registered as mh) to addr in
 * the peer's region h, built in d, and waits for its completion. */
void rdma_write_wait(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d, void *src, VIP_MEM_HANDLE mh,
                     VIP_MEM_HANDLE d_mh, uint64_t addr, VIP_MEM_HANDLE h, uint32_t len);
/* Registers n bytes of the caller's memory at p (must succeed). */
VIP_MEM_HANDLE reg_mem(VIP_NIC_HANDLE nic, void *p, size_t n, VIP_PROTECTION_HANDLE ptag,
                       int rdma_write, int rdma_read);
void region_free(region *r);
/* The descriptor at byte `off` (a multiple of 64) of r. */
VIP_DESCRIPTOR *desc_at(region *r, size_t off);

/* Descriptor building: clears d, sets Control and SegCount. */
void desc_init(VIP_DESCRIPTOR *d, unsigned control, unsigned segs);
void desc_local(VIP_DESCRIPTOR *d, unsigned i, void *addr, VIP_MEM_HANDLE h, uint32_t len);
void desc_remote(VIP_DESCRIPTOR *d, uint64_t addr, VIP_MEM_HANDLE h);
/* A send/receive descriptor with one segment (none when len is 0 for sends). */
void desc_simple(VIP_DESCRIPTOR *d, void *addr, VIP_MEM_HANDLE h, uint32_t len);

/* Waits (WAIT_MS) for the next completion; fails unless it is `expect`. */
VIP_DESCRIPTOR *recv_wait(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *expect);
VIP_DESCRIPTOR *send_wait(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *expect);

/* One message over the connected vi, in step with the other process: the
 * receiver posts d for `cap` bytes at buf, then both meet at barrier 100,
 * then the sender sends `len` bytes of fill(seed) from buf. Each side
 * checks its completion; the receiver checks length and data. */
void exchange_message(VIP_VI_HANDLE vi, VIP_DESCRIPTOR *d, unsigned char *buf, VIP_MEM_HANDLE mh,
                      uint32_t cap, int sender, uint32_t len, uint32_t seed);

/* Deterministic data. */
void fill(void *buf, size_t n, uint32_t seed);
/* Index of the first byte that differs from fill(seed), or -1. */
long check_fill(const void *buf, size_t n, uint32_t seed);

#endif /* SUITE_COMMON_H */
