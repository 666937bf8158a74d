/* Preloaded into wbrokerd by the integration tests (LD_PRELOAD) to make a
 * load take seconds instead of milliseconds: each pread of tensor data (a
 * read of 64 KiB or more; headers are read in smaller pieces) first sleeps
 * $WB_TEST_PREAD_DELAY_US microseconds. Nothing else changes: the broker
 * opens, checks, reads and hashes as it always does, so a test can cancel
 * or interrupt a load that is really in progress. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

static long delay_us(void)
{
    static atomic_long us = -1;
    long v = atomic_load(&us);
    if (v < 0) {
        const char *e = getenv("WB_TEST_PREAD_DELAY_US");
        v = e ? atol(e) : 0;
        atomic_store(&us, v > 0 ? v : 0);
    }
    return v;
}

static void slow_down(size_t len)
{
    long us = delay_us();
    if (len < 65536 || us <= 0)
        return;
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* Exported whatever the build's default visibility: they replace libc's. */
#define SHIM_EXPORT __attribute__((visibility("default")))

SHIM_EXPORT ssize_t pread(int fd, void *buf, size_t len, off_t off)
{
    static ssize_t (*real_pread)(int, void *, size_t, off_t);
    if (!real_pread)
        *(void **)&real_pread = dlsym(RTLD_NEXT, "pread");
    slow_down(len);
    return real_pread(fd, buf, len, off);
}

SHIM_EXPORT ssize_t pread64(int fd, void *buf, size_t len, off64_t off)
{
    static ssize_t (*real_pread64)(int, void *, size_t, off64_t);
    if (!real_pread64)
        *(void **)&real_pread64 = dlsym(RTLD_NEXT, "pread64");
    slow_down(len);
    return real_pread64(fd, buf, len, off);
}
