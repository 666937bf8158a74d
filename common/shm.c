#include "shm.h"

#include "text.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SHM_DIR     "/dev/shm"
#define SHM_HEX_LEN 32
#define SHM_MODE    0640

/* Fills buf with n random bytes from the kernel's generator. */
static int random_bytes(uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

/* Checks the part after "/": "wb-<pid>-<32 hex>", and returns the pid. */
static int parse_base(const char *s, long *pid)
{
    if (strncmp(s, WB_SHM_PREFIX, strlen(WB_SHM_PREFIX)) != 0)
        return 0;
    s += strlen(WB_SHM_PREFIX);
    long v = 0;
    int digits = 0;
    while (*s >= '0' && *s <= '9') {
        if (++digits > 10)
            return 0;
        v = v * 10 + (*s - '0');
        s++;
    }
    if (digits == 0 || v <= 0 || *s != '-')
        return 0;
    s++;
    for (int i = 0; i < SHM_HEX_LEN; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
    }
    if (s[SHM_HEX_LEN] != '\0')
        return 0;
    if (pid)
        *pid = v;
    return 1;
}

int wb__shm_name_valid(const char *name)
{
    if (!name || name[0] != '/' || strlen(name) >= WB_SHM_NAME_MAX)
        return 0;
    return parse_base(name + 1, NULL);
}

static int make_name(char *buf, size_t size)
{
    uint8_t rnd[SHM_HEX_LEN / 2];
    if (random_bytes(rnd, sizeof rnd) != 0)
        return -1;
    int n = snprintf(buf, size, "/" WB_SHM_PREFIX "%ld-", (long)getpid());
    if (n > 0 && (size_t)n < size)
        wb__text_hex(buf + n, size - (size_t)n, rnd, sizeof rnd);
    return 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

static int shm_create(wb_shm *shm, uint64_t size, int lazy, int memfd, wb_err *err)
{
    memset(shm, 0, sizeof *shm);
    long page = sysconf(_SC_PAGESIZE);
    uint64_t real = size ? size : (uint64_t)(page > 0 ? page : 4096);
    if (real > (uint64_t)INT64_MAX || real > (uint64_t)SIZE_MAX)
        return wb__err_set(err, WB_EINVAL, "shared memory slab of %llu bytes is too large",
                           (unsigned long long)size);

    char name[WB_SHM_NAME_MAX] = "memfd";
    int fd = -1;
    if (memfd) {
        fd = memfd_create("wb-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (fd < 0)
            return wb__err_errno(err, errno == ENOMEM ? WB_ENOMEM : WB_EIO, errno, "memfd_create");
    }
    /* The name is 128 random bits; a collision means something is wrong with
     * the random source, so give up after a few tries. */
    for (int attempt = 0; !memfd && attempt < 4 && fd < 0; attempt++) {
        if (make_name(name, sizeof name) != 0)
            return wb__err_errno(err, WB_EIO, errno, "getrandom for a shared memory name");
        fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, SHM_MODE);
        if (fd < 0 && errno != EEXIST)
            return wb__err_errno(err, WB_EIO, errno, "shm_open %s", name);
    }
    if (fd < 0)
        return wb__err_set(err, WB_EIO, "shm_open: four random names already existed");

    int rc = WB_OK;
    /* A named slab stays open and locked while it lives, from before it
     * has a size: the proof of life that a cleanup in another PID
     * namespace can see (wb__shm_cleanup_stale). */
    if (!memfd && flock(fd, LOCK_SH | LOCK_NB) != 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "flock %s", name);
        goto fail;
    }
    /* The umask may have removed group read; set the mode explicitly. */
    if (!memfd && fchmod(fd, SHM_MODE) != 0) {
        rc = wb__err_errno(err, WB_EIO, errno, "fchmod %s", name);
        goto fail;
    }
    if (ftruncate(fd, (off_t)real) != 0) {
        rc = wb__err_errno(err, errno == ENOSPC ? WB_ENOMEM : WB_EIO, errno,
                           "ftruncate %s to %llu bytes", name, (unsigned long long)real);
        goto fail;
    }
    void *addr = mmap(NULL, (size_t)real, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        rc = wb__err_errno(err, WB_EIO, errno, "mmap %s (%llu bytes)", name,
                           (unsigned long long)real);
        goto fail;
    }
    if (lazy) {
        /* Huge pages, where tmpfs gives them (shmem_enabled "advise" and
         * up): one allocation and no fault per 2 MiB instead of 512. Only
         * a hint: an error leaves small pages. */
        (void)madvise(addr, (size_t)real, MADV_HUGEPAGE);
        /* A length of 0 checks the advice without doing anything: a kernel
         * that does not know MADV_POPULATE_WRITE says EINVAL. */
        if (madvise(addr, 0, MADV_POPULATE_WRITE) != 0)
            lazy = 0;
    }
    /* Reserve the pages now unless the filler populates each range: tmpfs
     * allocates lazily, and running out of shared memory while filling the
     * mapping would be SIGBUS, not an error. */
    int frc = lazy ? 0 : posix_fallocate(fd, 0, (off_t)real);
    if (frc != 0 && frc != EOPNOTSUPP) {
        munmap(addr, (size_t)real);
        rc = wb__err_errno(err, frc == ENOSPC ? WB_ENOMEM : WB_EIO, frc,
                           "reserving %llu bytes of shared memory for %s", (unsigned long long)real,
                           name);
        goto fail;
    }
    if (memfd) {
        shm->memfd = 1;
        shm->fd = fd;
    } else {
        shm->locked = 1;
        shm->fd = fd;
        snprintf(shm->name, sizeof shm->name, "%s", name);
    }
    shm->addr = addr;
    shm->size = real;
    shm->writable = 1;
    shm->lazy = lazy;
    return WB_OK;

fail:
    if (!memfd)
        shm_unlink(name);
    close(fd);
    return rc;
}

int wb__shm_create_memfd(wb_shm *shm, uint64_t size, wb_err *err)
{
    return shm_create(shm, size, 1, 1, err);
}

int wb__shm_seal(wb_shm *shm, wb_err *err)
{
    if (!shm->memfd)
        return wb__err_set(err, WB_EINVAL, "slab %s is not a memfd and cannot be sealed",
                           shm->name);
    /* F_SEAL_WRITE is refused (EBUSY) while a shared mapping that may
     * write exists, and a read-only mapping of a descriptor opened for
     * writing still counts on kernels before 6.7: unmap, seal, map again. */
    if (shm->addr) {
        munmap(shm->addr, (size_t)shm->size);
        shm->addr = NULL;
    }
    shm->writable = 0;
    if (fcntl(shm->fd, F_ADD_SEALS, WB_SHM_SEALS_REQUIRED | F_SEAL_SEAL) != 0)
        return wb__err_errno(err, WB_EIO, errno, "sealing the memfd slab of %llu bytes",
                             (unsigned long long)shm->size);
    void *addr = mmap(NULL, (size_t)shm->size, PROT_READ, MAP_SHARED, shm->fd, 0);
    if (addr == MAP_FAILED)
        return wb__err_errno(err, WB_EIO, errno,
                             "mapping the sealed memfd slab of %llu bytes read-only",
                             (unsigned long long)shm->size);
    shm->addr = addr;
    return WB_OK;
}

int wb__shm_map_fd_ro(wb_shm *shm, int fd, uint64_t size, const char *what, wb_err *err)
{
    memset(shm, 0, sizeof *shm);
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0)
        return wb__err_errno(err, WB_EPROTO, errno, "%s: the descriptor is not a sealable memfd",
                             what);
    if ((seals & WB_SHM_SEALS_REQUIRED) != WB_SHM_SEALS_REQUIRED)
        return wb__err_set(err, WB_EPROTO,
                           "%s: the memfd is not sealed against writing and resizing "
                           "(seals 0x%x, need 0x%x)",
                           what, (unsigned)seals, (unsigned)WB_SHM_SEALS_REQUIRED);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return wb__err_errno(err, WB_EIO, errno, "%s: fstat", what);
    if (st.st_size < 0 || (uint64_t)st.st_size != size || size == 0 || size > (uint64_t)SIZE_MAX)
        return wb__err_set(err, WB_EPROTO, "%s has %lld bytes, expected %llu", what,
                           (long long)st.st_size, (unsigned long long)size);
    void *addr = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED)
        return wb__err_errno(err, WB_EIO, errno, "%s: mmap of %llu bytes, read-only", what,
                             (unsigned long long)size);
    shm->addr = addr;
    shm->size = size;
    return WB_OK;
}

int wb__shm_create(wb_shm *shm, uint64_t size, wb_err *err)
{
    return shm_create(shm, size, 0, 0, err);
}

int wb__shm_create_lazy(wb_shm *shm, uint64_t size, wb_err *err)
{
    return shm_create(shm, size, 1, 0, err);
}

int wb__shm_populate(wb_shm *shm, uint64_t offset, uint64_t len, wb_err *err)
{
    if (!shm->writable || !shm->addr)
        return wb__err_set(err, WB_EINTERNAL, "slab %s is not mapped for writing", shm->name);
    if (!shm->lazy || offset >= shm->size || len == 0)
        return WB_OK;
    if (len > shm->size - offset)
        len = shm->size - offset;
    long ps = sysconf(_SC_PAGESIZE);
    uint64_t page = ps > 0 ? (uint64_t)ps : 4096;
    uint64_t from = offset & ~(page - 1);
    /* The mapping covers whole pages: the last one may be rounded up. */
    uint64_t to = (offset + len + page - 1) & ~(page - 1);
    uint8_t *p = (uint8_t *)shm->addr + from;
    while (madvise(p, (size_t)(to - from), MADV_POPULATE_WRITE) != 0) {
        int e = errno;
        if (e == EINTR)
            continue;
        /* EFAULT: a page could not be had (tmpfs full: the SIGBUS a write
         * would have got); ENOMEM: out of memory. */
        if (e == EFAULT || e == ENOMEM)
            return wb__err_set(err, WB_ENOMEM,
                               "shared memory ran out filling slab %s: bytes %llu to %llu of "
                               "%llu cannot be backed (is %s full?)",
                               shm->memfd ? "(memfd)" : shm->name, (unsigned long long)from,
                               (unsigned long long)to, (unsigned long long)shm->size,
                               shm->memfd ? "shared memory" : SHM_DIR);
        return wb__err_errno(err, WB_EIO, e, "populating bytes %llu to %llu of slab %s",
                             (unsigned long long)from, (unsigned long long)to,
                             shm->memfd ? "(memfd)" : shm->name);
    }
    return WB_OK;
}

int wb__shm_map_ro(wb_shm *shm, const char *name, uint64_t size, wb_err *err)
{
    memset(shm, 0, sizeof *shm);
    if (!wb__shm_name_valid(name))
        return wb__err_set(err, WB_EINVAL,
                           "'%.80s' is not a slab name of the form /wb-<pid>-<32 hex>",
                           name ? name : "(null)");
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return wb__err_set(err, WB_ENOTFOUND, "no shared memory object %s", name);
        return wb__err_errno(err, e == EACCES ? WB_EPERM : WB_EIO, e, "shm_open %s", name);
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return wb__err_errno(err, WB_EIO, e, "fstat %s", name);
    }
    if (st.st_size < 0 || (uint64_t)st.st_size != size || size == 0) {
        close(fd);
        return wb__err_set(err, WB_EPROTO, "shared memory object %s has %lld bytes, expected %llu",
                           name, (long long)st.st_size, (unsigned long long)size);
    }
    if (size > (uint64_t)SIZE_MAX) {
        close(fd);
        return wb__err_set(err, WB_EINVAL, "slab %s of %llu bytes cannot be mapped", name,
                           (unsigned long long)size);
    }
    void *addr = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    close(fd);
    if (addr == MAP_FAILED)
        return wb__err_errno(err, WB_EIO, e, "mmap %s (%llu bytes, read-only)", name,
                             (unsigned long long)size);
    snprintf(shm->name, sizeof shm->name, "%s", name);
    shm->addr = addr;
    shm->size = size;
    shm->writable = 0;
    return WB_OK;
}

void wb__shm_unlink(wb_shm *shm)
{
    if (shm && !shm->memfd && shm->name[0])
        shm_unlink(shm->name);
}

void wb__shm_unmap(wb_shm *shm)
{
    if (!shm)
        return;
    if (shm->addr && shm->size)
        munmap(shm->addr, (size_t)shm->size);
    if ((shm->memfd || shm->locked) && shm->fd >= 0)
        close(shm->fd);
    memset(shm, 0, sizeof *shm);
}

/* Whether the broker that made a slab has ended. kill(pid, 0) alone is not
 * enough: a broker that was killed but not yet reaped by its parent (a
 * supervisor that waits late, a shell running it in the background) is a
 * zombie, which kill() still finds, though it holds no memory and never runs
 * again. Its state in /proc/PID/stat ('Z', or 'X' while being reaped) tells.
 * When /proc cannot tell, the process is taken to be alive. */
static int pid_gone(long pid)
{
    if (kill((pid_t)pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT; /* reaped since kill() */
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* "PID (COMM) STATE ...": COMM may hold spaces and parentheses, so the
     * state follows the last ')'. */
    const char *rp = strrchr(buf, ')');
    if (!rp || rp[1] != ' ')
        return 0;
    return rp[2] == 'Z' || rp[2] == 'X';
}

/* Whether a live broker holds the object locked (wb__shm_create keeps a
 * shared flock on it). Unreadable objects count as held. */
static int held_by_a_broker(int dir, const char *base)
{
    int fd = openat(dir, base, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return 1;
    int held = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd); /* releases the lock if it was taken */
    return held;
}

int wb__shm_cleanup_stale(void)
{
    DIR *dir = opendir(SHM_DIR);
    if (!dir)
        return 0;
    uid_t euid = geteuid();
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(dir)) != NULL) {
        long pid;
        if (!parse_base(de->d_name, &pid) || pid > 0x7fffffffL)
            continue;
        struct stat st;
        if (fstatat(dirfd(dir), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode) || st.st_uid != euid)
            continue;
        if (pid == (long)getpid() || !pid_gone(pid))
            continue;
        if ((st.st_size == 0 && time(NULL) - st.st_mtime < 10) ||
            held_by_a_broker(dirfd(dir), de->d_name))
            continue;
        /* parse_base() bounded the name to fewer than WB_SHM_NAME_MAX bytes. */
        char name[sizeof de->d_name + 1];
        snprintf(name, sizeof name, "/%s", de->d_name);
        if (shm_unlink(name) == 0)
            removed++;
    }
    closedir(dir);
    return removed;
}
