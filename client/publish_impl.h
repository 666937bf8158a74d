/* The insides of wb_publisher (include/wb/publish.h): publish.c talks to
 * the broker, publish_src.c finds where each tensor's bytes are (the host
 * memfd, or an exported CUDA allocation). */
#ifndef WB_PUBLISH_IMPL_H
#define WB_PUBLISH_IMPL_H

#include "wb/publish.h"

#include "err.h"
#include "names.h"
#include "wire.h"

#include <stdint.h>
#include <sys/types.h>

/* Host tensors start at multiples of this in the memfd. */
#define WB_PUBLISH_ALIGN 256
/* A CUDA IPC handle's bytes (cudaIpcMemHandle_t). */
#define WB_PUBLISH_IPC_HANDLE 64
/* The least a commit waits for the broker's copies. */
#define WB_PUBLISH_COMMIT_MIN_MS 60000

/* One tensor of the table; `name` first (the name index reads it there). */
typedef struct wb__pub_tensor {
    char *name;
    char *dtype;
    uint32_t ndim;
    uint64_t *shape;
    uint64_t nbytes;
    int given;
    uint32_t source; /* index into wb_publisher.src, once given */
    uint64_t offset; /* from the source's start */
} wb__pub_tensor;

/* Where bytes are: the host memfd, or one CUDA allocation of the producer. */
typedef struct wb__pub_source {
    int host;
    int device;
    uintptr_t base;
    uint64_t size;
    uint8_t handle[WB_PUBLISH_IPC_HANDLE];
    char uuid[48];
} wb__pub_source;

struct wb_publisher {
    wb_client *client;
    pid_t pid; /* the process that began it */
    char *model;
    uint8_t id[WB_LEASE_ID_LEN];
    uint32_t version;
    uint64_t reserved;
    uint64_t gen; /* the rpc socket the publish was begun on */
    size_t n;
    wb__pub_tensor *t;
    wb__names_hash *by_name; /* NULL: a scan */
    size_t n_given;
    /* Host bytes: a memfd (-1 until the first host tensor) of `host_cap`
     * bytes, `host_used` of them written; its source's index. */
    int memfd;
    uint64_t host_used, host_cap;
    int host_source;
    wb__pub_source *src;
    size_t n_src, cap_src;
    wb_err err; /* the last failed call's message */
};

/* Records where tensor `t`'s `nbytes` bytes at `data` are: host bytes are
 * written into the memfd (made or grown here), device memory is exported
 * (a source per allocation). On failure nothing the commit reads changes
 * (the memfd may have grown). */
int wb__pub_place(wb_publisher *p, wb__pub_tensor *t, const void *data, uint64_t nbytes,
                  wb_err *err);

/* Before the commit sends it: the memfd cut to the bytes written and
 * sealed against any change (F_SEAL_WRITE, GROW, SHRINK, SEAL). */
int wb__pub_seal(wb_publisher *p, wb_err *err);

/* Frees the sources and closes the memfd. */
void wb__pub_sources_free(wb_publisher *p);

#endif
