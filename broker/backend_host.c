#include "backend.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int host_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    (void)device;
    memset(slab, 0, sizeof *slab);
    /* Nothing is reserved here: each reader populates the range it fills
     * (host_prepare), so that allocating the pages runs in parallel and
     * overlaps the reads instead of preceding them all. */
    int rc = wb__shm_create_lazy(&slab->shm, size, err);
    if (rc != WB_OK)
        return rc;
    slab->size = slab->shm.size;
    slab->device = -1;
    return WB_OK;
}

/* The same in an anonymous memfd, sealed once filled (host_seal). */
static int memfd_alloc(wb_slab *slab, int device, uint64_t size, wb_err *err)
{
    (void)device;
    memset(slab, 0, sizeof *slab);
    int rc = wb__shm_create_memfd(&slab->shm, size, err);
    if (rc != WB_OK)
        return rc;
    slab->size = slab->shm.size;
    slab->device = -1;
    return WB_OK;
}

static int memfd_seal(wb_slab *slab, wb_err *err)
{
    return wb__shm_seal(&slab->shm, err);
}

static int memfd_fd(const wb_slab *slab)
{
    return slab->shm.memfd ? slab->shm.fd : -1;
}

static void *host_dest(wb_slab *slab, uint64_t offset, uint64_t len)
{
    if (!slab->shm.addr || offset > slab->size || len > slab->size - offset)
        return NULL;
    return (uint8_t *)slab->shm.addr + offset;
}

static int host_prepare(wb_slab *slab, uint64_t offset, uint64_t len, wb_err *err)
{
    return wb__shm_populate(&slab->shm, offset, len, err);
}

static int host_read(const wb_slab *slab, uint64_t offset, void *dst, uint64_t len, wb_err *err)
{
    int rc = wb__slab_read_check(slab, slab->shm.addr != NULL, offset, len, err);
    if (rc != WB_OK)
        return rc;
    memcpy(dst, (const uint8_t *)slab->shm.addr + offset, (size_t)len);
    return WB_OK;
}

static void host_export(wb_slab *slab, Wbproto__Slab *out)
{
    wbproto__slab__init(out);
    out->index = slab->index;
    out->backend = WBPROTO__BACKEND__BACKEND_HOST;
    out->device = -1;
    out->size = slab->size;
    out->shm_name = slab->shm.name;
    out->transport = slab->shm.memfd ? "memfd" : "shm";
}

static void host_free(wb_slab *slab)
{
    wb__shm_unlink(&slab->shm);
    wb__shm_unmap(&slab->shm);
    slab->size = 0;
}

/* Named slabs live in /dev/shm: what its file system has free. */
static int shm_free(const wb_backend *be, int device, uint64_t *bytes, char *where,
                    size_t where_len, wb_err *err)
{
    (void)be;
    (void)device;
    struct statvfs sv;
    if (statvfs("/dev/shm", &sv) != 0)
        return wb__err_errno(err, WB_EIO, errno, "statvfs /dev/shm");
    *bytes = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    snprintf(where, where_len, "host shared memory (/dev/shm)");
    return WB_OK;
}

/* memfds take the memory the kernel can give: MemAvailable. */
static int memfd_free(const wb_backend *be, int device, uint64_t *bytes, char *where,
                      size_t where_len, wb_err *err)
{
    (void)be;
    (void)device;
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wb__err_errno(err, WB_EIO, errno, "open /proc/meminfo");
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return wb__err_set(err, WB_EIO, "reading /proc/meminfo");
    buf[n] = '\0';
    const char *p = strstr(buf, "MemAvailable:");
    if (!p)
        return wb__err_set(err, WB_EIO, "/proc/meminfo has no MemAvailable");
    unsigned long long kb = strtoull(p + strlen("MemAvailable:"), NULL, 10);
    *bytes = (uint64_t)kb * 1024;
    snprintf(where, where_len, "host memory (MemAvailable)");
    return WB_OK;
}

const wb_backend wb__backend_host = {
    .name = "host",
    .proto = WBPROTO__BACKEND__BACKEND_HOST,
    .slab_alloc = host_alloc,
    .slab_dest = host_dest,
    .slab_prepare = host_prepare,
    .load_mode = WB_STAGE_DIRECT,
    .slab_export = host_export,
    .slab_read = host_read,
    .slab_free = host_free,
    .transport = "shm",
    .access = "ro",
    .mem_free = shm_free,
    .host_alloc = wb__tier_host_alloc,
    .host_free = wb__tier_host_free,
    .mem_total = wb__tier_host_total,
};

const wb_backend wb__backend_host_memfd = {
    .name = "host",
    .proto = WBPROTO__BACKEND__BACKEND_HOST,
    .slab_alloc = memfd_alloc,
    .slab_dest = host_dest,
    .slab_prepare = host_prepare,
    .slab_seal = memfd_seal,
    .slab_fd = memfd_fd,
    .load_mode = WB_STAGE_DIRECT,
    .slab_export = host_export,
    .slab_read = host_read,
    .slab_free = host_free,
    .transport = "memfd",
    .access = "ro",
    .mem_free = memfd_free,
    .host_alloc = wb__tier_host_alloc,
    .host_free = wb__tier_host_free,
    .mem_total = wb__tier_host_total,
};
