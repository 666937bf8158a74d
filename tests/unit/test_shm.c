/* The host memory backend's shared memory: slabs are created with fresh
 * names and mode 0640, read back through read-only mappings (here and in a
 * forked child), refuse writes, and fail cleanly on wrong sizes, missing and
 * malformed names; stale slabs of dead brokers are cleaned up. A lazy slab
 * reserves no page until a range is populated, and a range that cannot be
 * backed is an error naming the slab, not a SIGBUS on the first write. */
#include "shm.h"

#include <check.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <unistd.h>

static void fill(uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(seed + i * 31);
}

static int check_bytes(const uint8_t *p, size_t n, uint8_t seed)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != (uint8_t)(seed + i * 31))
            return 0;
    }
    return 1;
}

static int shm_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return 0;
    close(fd);
    return 1;
}

START_TEST(test_create_and_map)
{
    wb_shm w, r;
    wb_err err;
    const size_t size = 3 * 4096 + 100;
    /* A restrictive umask must not change the object's mode. */
    mode_t old = umask(077);
    ck_assert_int_eq(wb__shm_create(&w, size, &err), WB_OK);
    umask(old);
    ck_assert(wb__shm_name_valid(w.name));
    char prefix[32];
    snprintf(prefix, sizeof prefix, "/wb-%ld-", (long)getpid());
    ck_assert_int_eq(strncmp(w.name, prefix, strlen(prefix)), 0);
    ck_assert_uint_eq(w.size, size);
    ck_assert_int_eq(w.writable, 1);

    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", w.name);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0640);
    ck_assert_int_eq(st.st_size, (off_t)size);

    fill(w.addr, size, 7);
    ck_assert_int_eq(wb__shm_map_ro(&r, w.name, size, &err), WB_OK);
    ck_assert_int_eq(r.writable, 0);
    ck_assert_ptr_ne(r.addr, w.addr);
    ck_assert(check_bytes(r.addr, size, 7));

    /* A forked child maps the same name and sees the same bytes. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        wb_shm c;
        if (wb__shm_map_ro(&c, w.name, size, NULL) != WB_OK)
            _exit(2);
        _exit(check_bytes(c.addr, size, 7) ? 0 : 3);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);

    /* The mapping outlives the name. */
    char name[WB_SHM_NAME_MAX];
    snprintf(name, sizeof name, "%s", w.name);
    wb__shm_unlink(&w);
    wb__shm_unlink(&w); /* idempotent */
    ck_assert(!shm_exists(name));
    ck_assert(check_bytes(r.addr, size, 7));
    wb__shm_unmap(&r);
    ck_assert_ptr_null(r.addr);
    wb__shm_unmap(&w);
    ck_assert_ptr_null(w.addr);
    ck_assert_uint_eq(w.size, 0);
    wb__shm_unmap(NULL);
}
END_TEST

START_TEST(test_zero_size_is_one_page)
{
    wb_shm w, r;
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&w, 0, &err), WB_OK);
    ck_assert_uint_eq(w.size, (uint64_t)sysconf(_SC_PAGESIZE));
    ck_assert_int_eq(wb__shm_map_ro(&r, w.name, w.size, &err), WB_OK);
    wb__shm_unmap(&r);
    wb__shm_unlink(&w);
    wb__shm_unmap(&w);
}
END_TEST

START_TEST(test_names_are_fresh)
{
    wb_shm a, b;
    ck_assert_int_eq(wb__shm_create(&a, 10, NULL), WB_OK);
    ck_assert_int_eq(wb__shm_create(&b, 10, NULL), WB_OK);
    ck_assert_str_ne(a.name, b.name);
    wb__shm_unlink(&a);
    wb__shm_unlink(&b);
    wb__shm_unmap(&a);
    wb__shm_unmap(&b);
}
END_TEST

START_TEST(test_write_through_ro_mapping_faults)
{
    wb_shm w;
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&w, 4096, &err), WB_OK);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        /* Sanitizers catch SIGSEGV to report it; this test wants the plain
         * signal. */
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigaction(SIGSEGV, &sa, NULL);
        wb_shm r;
        if (wb__shm_map_ro(&r, w.name, 4096, NULL) != WB_OK)
            _exit(2);
        ((volatile uint8_t *)r.addr)[10] = 1;
        _exit(0);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    ck_assert_int_eq(WTERMSIG(status), SIGSEGV);
    ck_assert_int_eq(((uint8_t *)w.addr)[10], 0);
    wb__shm_unlink(&w);
    wb__shm_unmap(&w);
}
END_TEST

/* Bytes of tmpfs memory the slab holds. */
static long long slab_bytes(const wb_shm *s)
{
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", s->name);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    return (long long)st.st_blocks * 512;
}

START_TEST(test_lazy_populate)
{
    const long page = sysconf(_SC_PAGESIZE);
    const size_t size = 5 * (size_t)page;
    wb_shm w, r, e;
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&e, size, &err), WB_OK);
    ck_assert_int_eq(e.lazy, 0);
    ck_assert_int_eq(slab_bytes(&e), (long long)size); /* reserved up front */
    ck_assert_int_eq(wb__shm_populate(&e, 0, size, &err), WB_OK);

    ck_assert_int_eq(wb__shm_create_lazy(&w, size, &err), WB_OK);
    ck_assert(wb__shm_name_valid(w.name));
    ck_assert_int_eq(w.writable, 1);
    if (!w.lazy) {
        /* A kernel without MADV_POPULATE_WRITE: reserved as before. */
        ck_assert_int_eq(slab_bytes(&w), (long long)size);
    } else {
        ck_assert_int_eq(slab_bytes(&w), 0);
        /* [page + 1, 2 * page + 1) touches pages 1 and 2. */
        ck_assert_int_eq(wb__shm_populate(&w, (uint64_t)page + 1, (uint64_t)page, &err), WB_OK);
        ck_assert_int_eq(slab_bytes(&w), 2 * (long long)page);
        /* Past the end is clamped; nothing at all is a no-op. */
        ck_assert_int_eq(wb__shm_populate(&w, 4 * (uint64_t)page, UINT64_MAX, &err), WB_OK);
        ck_assert_int_eq(wb__shm_populate(&w, size, 10, &err), WB_OK);
        ck_assert_int_eq(wb__shm_populate(&w, 0, 0, &err), WB_OK);
        ck_assert_int_eq(slab_bytes(&w), 3 * (long long)page);
    }
    ck_assert_int_eq(wb__shm_populate(&w, 0, size, &err), WB_OK);
    ck_assert_int_eq(slab_bytes(&w), (long long)size);
    fill(w.addr, size, 7);
    ck_assert_int_eq(wb__shm_map_ro(&r, w.name, size, &err), WB_OK);
    ck_assert(check_bytes(r.addr, size, 7));
    /* A read-only mapping is not populated through. */
    ck_assert_int_eq(wb__shm_populate(&r, 0, size, &err), WB_EINTERNAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "is not mapped for writing"));
    wb__shm_unmap(&r);
    wb__shm_unlink(&w);
    wb__shm_unmap(&w);
    wb__shm_unlink(&e);
    wb__shm_unmap(&e);
}
END_TEST

/* Pages that cannot be had (here: cut off by a truncation, as when tmpfs is
 * full) are a WB_ENOMEM naming the slab and the range; writing there would
 * have been a SIGBUS. */
START_TEST(test_lazy_populate_fails_cleanly)
{
    const long page = sysconf(_SC_PAGESIZE);
    wb_shm w;
    wb_err err;
    ck_assert_int_eq(wb__shm_create_lazy(&w, 4 * (size_t)page, &err), WB_OK);
    if (w.lazy) {
        int fd = shm_open(w.name, O_RDWR, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(ftruncate(fd, page), 0);
        close(fd);
        ck_assert_int_eq(wb__shm_populate(&w, 0, (uint64_t)page, &err), WB_OK);
        ck_assert_int_eq(wb__shm_populate(&w, 2 * (uint64_t)page, 10, &err), WB_ENOMEM);
        char want[256];
        snprintf(want, sizeof want,
                 "shared memory ran out filling slab %s: bytes %ld to %ld of %ld cannot be "
                 "backed (is /dev/shm full?)",
                 w.name, 2 * page, 3 * page, 4 * page);
        ck_assert_str_eq(err.msg, want);
    }
    wb__shm_unlink(&w);
    wb__shm_unmap(&w);
}
END_TEST

START_TEST(test_map_errors)
{
    wb_shm w, r;
    wb_err err;
    ck_assert_int_eq(wb__shm_create(&w, 8192, &err), WB_OK);
    ck_assert_int_eq(wb__shm_map_ro(&r, w.name, 4096, &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, w.name));
    ck_assert_ptr_nonnull(strstr(err.msg, "has 8192 bytes, expected 4096"));
    ck_assert_ptr_null(r.addr);
    ck_assert_int_eq(wb__shm_map_ro(&r, w.name, 8193, &err), WB_EPROTO);
    ck_assert_int_eq(wb__shm_map_ro(&r, w.name, 0, &err), WB_EPROTO);
    wb__shm_unlink(&w);
    wb__shm_unmap(&w);

    const char *missing = "/wb-1-00000000000000000000000000000000";
    ck_assert_int_eq(wb__shm_map_ro(&r, missing, 4096, &err), WB_ENOTFOUND);
    ck_assert_str_eq(err.msg, "no shared memory object /wb-1-00000000000000000000000000000000");

    ck_assert_int_eq(wb__shm_map_ro(&r, "/etc/passwd", 4096, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "'/etc/passwd' is not a slab name"));
    ck_assert_int_eq(wb__shm_map_ro(&r, NULL, 4096, &err), WB_EINVAL);
}
END_TEST

START_TEST(test_name_validation)
{
    ck_assert(wb__shm_name_valid("/wb-1-0123456789abcdef0123456789abcdef"));
    ck_assert(wb__shm_name_valid("/wb-4294967295-0123456789abcdef0123456789abcdef"));
    ck_assert(!wb__shm_name_valid(NULL));
    ck_assert(!wb__shm_name_valid(""));
    ck_assert(!wb__shm_name_valid("wb-1-0123456789abcdef0123456789abcdef"));   /* no slash */
    ck_assert(!wb__shm_name_valid("/wb--0123456789abcdef0123456789abcdef"));   /* no pid */
    ck_assert(!wb__shm_name_valid("/wb-0-0123456789abcdef0123456789abcdef"));  /* pid 0 */
    ck_assert(!wb__shm_name_valid("/wb-1-0123456789abcdef0123456789abcde"));   /* 31 hex */
    ck_assert(!wb__shm_name_valid("/wb-1-0123456789abcdef0123456789abcdef0")); /* 33 hex */
    ck_assert(!wb__shm_name_valid("/wb-1-0123456789ABCDEF0123456789abcdef"));  /* upper case */
    ck_assert(!wb__shm_name_valid("/wb-1-0123456789abcdef0123456789abcdeg"));
    ck_assert(!wb__shm_name_valid("/wb-12345678901-0123456789abcdef0123456789abcdef"));
    ck_assert(!wb__shm_name_valid("/xx-1-0123456789abcdef0123456789abcdef"));
    ck_assert(!wb__shm_name_valid("/wb-1-../../0123456789abcdef01234567"));
}
END_TEST

/* Makes a slab object look 60 s old: the cleanup leaves fresher ones to
 * the broker that may be between creating and locking them. */
static void backdate(const char *name)
{
    int fd = shm_open(name, O_RDWR, 0);
    ck_assert_int_ge(fd, 0);
    struct timespec ts[2];
    clock_gettime(CLOCK_REALTIME, &ts[0]);
    ts[0].tv_sec -= 60;
    ts[1] = ts[0];
    ck_assert_int_eq(futimens(fd, ts), 0);
    close(fd);
}

START_TEST(test_cleanup_stale)
{
    /* A pid that certainly no longer exists: a child we reaped. */
    pid_t dead = fork();
    ck_assert_int_ge(dead, 0);
    if (dead == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);

    char stale[WB_SHM_NAME_MAX];
    snprintf(stale, sizeof stale, "/wb-%ld-00112233445566778899aabbccddeeff", (long)dead);
    int fd = shm_open(stale, O_CREAT | O_EXCL | O_RDWR, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    /* A name that does not follow the pattern is never touched. */
    char other[WB_SHM_NAME_MAX];
    snprintf(other, sizeof other, "/wb-%ld-not-ours", (long)dead);
    fd = shm_open(other, O_CREAT | O_RDWR, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);

    wb_shm mine;
    ck_assert_int_eq(wb__shm_create(&mine, 100, NULL), WB_OK);

    /* Empty and fresh (a broker may be about to lock it): left alone. */
    wb__shm_cleanup_stale();
    ck_assert(shm_exists(stale));
    backdate(stale);
    backdate(mine.name);
    ck_assert_int_ge(wb__shm_cleanup_stale(), 1);
    ck_assert(!shm_exists(stale));
    ck_assert(shm_exists(mine.name));
    ck_assert(shm_exists(other));
    /* Nothing left to remove of ours. */
    ck_assert(!shm_exists(stale));

    shm_unlink(other);
    wb__shm_unlink(&mine);
    wb__shm_unmap(&mine);
}
END_TEST

/* A slab whose name carries a pid this process cannot see (its broker runs
 * in another PID namespace that shares /dev/shm) but whose object a live
 * broker holds locked is not stale. Played here by a second name (a hard
 * link) with a dead pid for a slab this process made and holds. */
START_TEST(test_cleanup_spares_locked)
{
    pid_t dead = fork();
    ck_assert_int_ge(dead, 0);
    if (dead == 0)
        _exit(0);
    ck_assert_int_eq(waitpid(dead, NULL, 0), dead);
    wb_shm held;
    ck_assert_int_eq(wb__shm_create(&held, 4096, NULL), WB_OK);
    ck_assert_int_eq(held.locked, 1);
    char foreign[WB_SHM_NAME_MAX], from[300], to[300];
    snprintf(foreign, sizeof foreign, "/wb-%ld-00112233445566778899aabbccddee11", (long)dead);
    snprintf(from, sizeof from, "/dev/shm%s", held.name);
    snprintf(to, sizeof to, "/dev/shm%s", foreign);
    ck_assert_int_eq(link(from, to), 0);
    backdate(foreign);
    wb__shm_cleanup_stale();
    ck_assert(shm_exists(foreign));
    /* Once the slab is unmapped (its broker gone), the name is stale. */
    wb__shm_unlink(&held);
    wb__shm_unmap(&held);
    ck_assert_int_ge(wb__shm_cleanup_stale(), 1);
    ck_assert(!shm_exists(foreign));
}
END_TEST

/* A broker that has exited but is not yet reaped is a zombie: kill(pid, 0)
 * still succeeds on it, and its slabs must go all the same. */
START_TEST(test_cleanup_zombie)
{
    pid_t zombie = fork();
    ck_assert_int_ge(zombie, 0);
    if (zombie == 0)
        _exit(0);
    /* Wait for the exit without reaping it. */
    siginfo_t si;
    ck_assert_int_eq(waitid(P_PID, (id_t)zombie, &si, WEXITED | WNOWAIT), 0);
    ck_assert_int_eq(kill(zombie, 0), 0);

    char stale[WB_SHM_NAME_MAX];
    snprintf(stale, sizeof stale, "/wb-%ld-00112233445566778899aabbccddee00", (long)zombie);
    int fd = shm_open(stale, O_CREAT | O_EXCL | O_RDWR, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    backdate(stale);
    ck_assert_int_ge(wb__shm_cleanup_stale(), 1);
    ck_assert(!shm_exists(stale));
    ck_assert_int_eq(waitpid(zombie, NULL, 0), zombie);
}
END_TEST

/* A memfd slab has no name, is filled through its writable mapping, and
 * once sealed refuses every way of changing it: write(2), growing and
 * shrinking, a writable shared mapping, making the read-only mapping
 * writable. A client maps the descriptor read-only and reads the bytes. */
START_TEST(test_memfd_sealed)
{
    wb_shm s;
    wb_err err;
    const size_t n = 3 * 4096 + 100;
    ck_assert_int_eq(wb__shm_create_memfd(&s, n, &err), WB_OK);
    ck_assert_int_eq(s.memfd, 1);
    ck_assert_int_ge(s.fd, 0);
    ck_assert_str_eq(s.name, "");
    ck_assert_int_eq(wb__shm_populate(&s, 0, n, &err), WB_OK);
    fill(s.addr, n, 7);
    void *before = s.addr;
    ck_assert_int_eq(wb__shm_seal(&s, &err), WB_OK);
    ck_assert_int_eq(s.writable, 0);
    ck_assert_ptr_nonnull(s.addr);
    ck_assert(check_bytes(s.addr, n, 7));
    (void)before;
    int seals = fcntl(s.fd, F_GET_SEALS);
    ck_assert_int_eq(seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
                     F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);

    uint8_t byte = 1;
    errno = 0;
    ck_assert_int_eq(pwrite(s.fd, &byte, 1, 0), -1);
    ck_assert_int_eq(errno, EPERM);
    errno = 0;
    ck_assert_int_eq(ftruncate(s.fd, (off_t)n * 2), -1);
    ck_assert_int_eq(errno, EPERM);
    errno = 0;
    ck_assert_int_eq(ftruncate(s.fd, 4096), -1);
    ck_assert_int_eq(errno, EPERM);
    errno = 0;
    ck_assert_ptr_eq(mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd, 0), MAP_FAILED);
    ck_assert_int_eq(errno, EPERM);
    ck_assert_int_ne(mprotect(s.addr, 4096, PROT_READ | PROT_WRITE), 0);
    /* No more seals can be added or removed: F_SEAL_SEAL. */
    errno = 0;
    ck_assert_int_eq(fcntl(s.fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE), -1);
    ck_assert_int_eq(errno, EPERM);

    /* A client maps it by descriptor: the same bytes, read-only. */
    wb_shm c;
    ck_assert_int_eq(wb__shm_map_fd_ro(&c, s.fd, s.size, "slab 0", &err), WB_OK);
    ck_assert(check_bytes(c.addr, n, 7));
    ck_assert_int_ne(mprotect(c.addr, 4096, PROT_READ | PROT_WRITE), 0);
    /* The wrong size is refused naming the slab. */
    wb_shm d;
    ck_assert_int_eq(wb__shm_map_fd_ro(&d, s.fd, s.size + 1, "slab 0", &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "slab 0 has 12388 bytes, expected 12389");
    wb__shm_unmap(&c);
    int fd = s.fd;
    wb__shm_unmap(&s);
    /* The descriptor was the slab's: closed with it. */
    ck_assert_int_eq(fcntl(fd, F_GETFD), -1);
}
END_TEST

/* A client refuses a descriptor that could change under it: an unsealed
 * memfd, and a file that cannot carry seals at all. Sealing a named slab
 * is refused. */
START_TEST(test_memfd_unsealed_refused)
{
    wb_shm s, c;
    wb_err err;
    ck_assert_int_eq(wb__shm_create_memfd(&s, 4096, &err), WB_OK);
    ck_assert_int_eq(wb__shm_map_fd_ro(&c, s.fd, 4096, "slab 1", &err), WB_EPROTO);
    ck_assert_str_eq(err.msg, "slab 1: the memfd is not sealed against writing and resizing "
                              "(seals 0x0, need 0xe)");
    wb__shm_unmap(&s);
    int fd = open("/dev/null", O_RDONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(wb__shm_map_fd_ro(&c, fd, 4096, "slab 2", &err), WB_EPROTO);
    ck_assert_ptr_nonnull(strstr(err.msg, "slab 2: the descriptor is not a sealable memfd"));
    close(fd);
    wb_shm named;
    ck_assert_int_eq(wb__shm_create(&named, 4096, &err), WB_OK);
    ck_assert_int_eq(wb__shm_seal(&named, &err), WB_EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "is not a memfd and cannot be sealed"));
    wb__shm_unlink(&named);
    wb__shm_unmap(&named);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shm");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_create_and_map);
    tcase_add_test(tc, test_zero_size_is_one_page);
    tcase_add_test(tc, test_names_are_fresh);
    tcase_add_test(tc, test_write_through_ro_mapping_faults);
    tcase_add_test(tc, test_map_errors);
    tcase_add_test(tc, test_lazy_populate);
    tcase_add_test(tc, test_lazy_populate_fails_cleanly);
    tcase_add_test(tc, test_name_validation);
    tcase_add_test(tc, test_cleanup_stale);
    tcase_add_test(tc, test_cleanup_spares_locked);
    tcase_add_test(tc, test_cleanup_zombie);
    tcase_add_test(tc, test_memfd_sealed);
    tcase_add_test(tc, test_memfd_unsealed_refused);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
