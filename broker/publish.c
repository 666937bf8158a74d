/* The publishes under way: their list on the broker, their ends (abort,
 * connection closed, process dead, unload) and the memfds the descriptor
 * channel brings them. The requests are ops_publish.c's, the copy
 * publish_copy.c's. */
#include "publish.h"

#include "alloc.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

wb_publish *wb__publish_find(const wb_broker *b, const uint8_t *id, size_t len)
{
    if (!id || len != WB_PUBLISH_ID_LEN)
        return NULL;
    for (wb_publish *p = b->publishes; p; p = p->next) {
        if (memcmp(p->id, id, WB_PUBLISH_ID_LEN) == 0)
            return p;
    }
    return NULL;
}

static void unlink_publish(wb_broker *b, wb_publish *p)
{
    for (wb_publish **pp = &b->publishes; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    p->next = NULL;
}

/* Frees what the publish holds (not its model record). */
static void publish_free(wb_broker *b, wb_publish *p)
{
    wb__model_data_free(&p->data, b->cfg.backend);
    for (unsigned i = 0; i < p->n_fds; i++)
        close(p->fds[i]);
    free(p->named);
    free(p->sources);
    free(p->pieces);
    free(p->name);
    free(p);
}

static void drop_model(wb_broker *b, wb_publish *p)
{
    wb_model *m = p->model;
    if (!m)
        return;
    m->publish = NULL;
    wb__models_remove(&b->models, m);
    wb__model_free(&m);
    p->model = NULL;
}

void wb__publish_release(wb_broker *b, wb_publish *p)
{
    unlink_publish(b, p);
    drop_model(b, p);
    publish_free(b, p);
}

void wb__publish_end(wb_broker *b, wb_publish *p, const char *reason)
{
    char q[300];
    b->stats.publishes_failed++;
    wb_warn("publish_aborted", "model=%s version=%u reason=%s pid=%u uid=%u fds=%u bytes=%llu",
            wb__log_quote(q, sizeof q, p->name), p->version, reason, p->creds.pid, p->creds.uid,
            p->n_fds, (unsigned long long)p->bytes);
    wb__publish_release(b, p);
}

void wb__publish_forget(wb_broker *b, uint64_t serial, uint32_t pid)
{
    if (!b->src_cache_owner || (serial ? b->src_cache_owner != serial : b->src_cache_pid != pid))
        return;
    uint64_t owner = b->src_cache_owner;
    b->src_cache_owner = 0;
    b->src_cache_pid = 0;
    wb_load_job *j = wb__load_job_new("", "", b->cfg.backend, -1, NULL, 0, 0);
    if (!j) {
        /* The next commit, or the broker's end, closes them. */
        wb_warn("publish_forget", "owner=%llu error=\"out of memory\"", (unsigned long long)owner);
        return;
    }
    j->kind = WB_JOB_FORGET;
    j->forget_owner = owner;
    j->src_cache_slot = &b->src_cache;
    if (b->loader) {
        wb__loader_submit(b->loader, j);
        return;
    }
    wb__publish_forget_run(j);
    wb__load_job_free(&j);
}

void wb__publish_conn_closed(wb_broker *b, uint64_t serial)
{
    wb_publish *p = b->publishes;
    while (p) {
        wb_publish *next = p->next;
        if (p->owner == serial && p->committing)
            p->owner_gone = 1;
        else if (p->owner == serial)
            wb__publish_end(b, p, "connection_closed");
        p = next;
    }
    wb__publish_forget(b, serial, 0);
}

void wb__publish_pid_dead(wb_broker *b, uint32_t pid)
{
    wb_publish *p = b->publishes;
    while (p) {
        wb_publish *next = p->next;
        if (p->creds.pid == pid && p->committing)
            p->owner_gone = 1;
        else if (p->creds.pid == pid)
            wb__publish_end(b, p, "process_exit");
        p = next;
    }
    wb__publish_forget(b, 0, pid);
}

void wb__publish_unloaded(wb_broker *b, wb_model *m, const wb_peer_creds *peer)
{
    wb_publish *p = m->publish;
    char q[300];
    if (!p->committing) {
        wb_info("publish_unloaded", "model=%s version=%u pid=%u uid=%u",
                wb__log_quote(q, sizeof q, p->name), p->version, peer->pid, peer->uid);
        wb__publish_end(b, p, "unloaded");
        return;
    }
    /* The copy runs on: its result is freed when it ends. */
    p->cancelled = 1;
    drop_model(b, p);
}

int wb__publish_add_fd(wb_broker *b, const uint8_t *id, const wb_peer_creds *creds, int fd,
                       char *msg, size_t size)
{
    wb_publish *p = wb__publish_find(b, id, WB_PUBLISH_ID_LEN);
    /* Another identity's publish is answered as one that does not exist:
     * its id tells nobody else anything. */
    if (!p || p->creds.uid != creds->uid || p->creds.pid != creds->pid) {
        snprintf(msg, size,
                 "no publish of this process has this id (begun and not yet "
                 "committed or ended)");
        return WB_ENOTFOUND;
    }
    if (p->committing) {
        snprintf(msg, size, "the publish of '%.100s' is committing: its sources are fixed",
                 p->name);
        return WB_ESTATE;
    }
    if (p->n_fds >= WB_PUBLISH_MAX_FDS) {
        snprintf(msg, size, "the publish of '%.100s' has %d memfds already, the most one may",
                 p->name, WB_PUBLISH_MAX_FDS);
        return WB_ELIMIT;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        snprintf(msg, size, "the descriptor is not a memfd or regular file");
        return WB_EINVAL;
    }
    p->fds[p->n_fds] = fd;
    p->fd_sizes[p->n_fds] = (uint64_t)sb.st_size;
    p->n_fds++;
    snprintf(msg, size, "memfd %u of the publish: %llu bytes", p->n_fds - 1,
             (unsigned long long)sb.st_size);
    return WB_OK;
}

void wb__publish_clear(wb_broker *b)
{
    while (b->publishes) {
        wb_publish *p = b->publishes;
        b->publishes = p->next;
        if (p->keep && p->keep->leases)
            p->keep->leases--;
        if (p->model)
            p->model->publish = NULL;
        publish_free(b, p);
    }
}
