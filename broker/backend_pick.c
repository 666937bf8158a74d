/* Choosing the broker's backend from --backend auto|cuda|host, --cuda-slab
 * ipc|vmm and --host-slab shm|memfd. */
#include "backend_pick.h"

#include "clock.h"
#include "log.h"

#include <stdio.h>
#include <string.h>

/* The host backend with the broker's loader settings; one per process. */
static wb_backend host_configured;

static const wb_backend *host_with(const wb_stage_config *stage, int memfd)
{
    host_configured = memfd ? wb__backend_host_memfd : wb__backend_host;
    host_configured.stage = *stage;
    return &host_configured;
}

static void log_choice(const wb_backend *be, const char *requested, int device, const char *why,
                       double start_seconds)
{
    char q[WB_ERR_MSG_MAX + 64];
    wb_stage_config c = be->stage;
    wb__stage_config_fill(&c);
    wb__log_quote(q, sizeof q, why);
    if (be->proto == WBPROTO__BACKEND__BACKEND_HOST) {
        wb_info("backend",
                "backend=host requested=%s reason=%s load_mode=direct read_threads=%u "
                "read_source=%s host_slab=%s",
                requested, q, c.read_threads, wb__stage_read_name(c.read_source), be->transport);
        return;
    }
    unsigned long long buf = be->staging ? (unsigned long long)be->staging->size : 0;
    unsigned n = be->staging ? be->staging->n : 0;
    char pq[2 * sizeof be->staging->pages + 8];
    wb__log_quote(pq, sizeof pq, be->staging ? be->staging->pages : "none");
    wb_info("backend",
            "backend=cuda requested=%s reason=%s device=%d cuda_slab=%s access=%s load_mode=%s "
            "read_threads=%u staging_buffers=%u staging_buffer_bytes=%llu staging_bytes=%llu "
            "start_seconds=%.3f read_source=%s register_threads=%u staging_pages=%s "
            "staging_demote=%s cldemote=%s",
            requested, q, device, be->transport, be->access, wb__stage_mode_name(be->load_mode),
            c.read_threads, n, buf, buf * n, start_seconds, wb__stage_read_name(c.read_source),
            c.register_threads, pq, wb__stage_demote_name(c.demote),
            wb__stage_can_demote() ? "yes" : "no");
}

int wb__backend_pick(const char *requested, int device, const wb_stage_config *stage, int load_mode,
                     int host_memfd, int cuda_slab, const wb_backend **out, wb_err *err)
{
    *out = NULL;
    wb_stage_config filled = *stage;
    wb__stage_config_fill(&filled);
    int rc = wb__stage_config_check(&filled, err);
    if (rc != WB_OK)
        return rc;
    if (strcmp(requested, "host") == 0) {
        *out = host_with(stage, host_memfd);
        log_choice(*out, requested, device, "requested", 0);
        return WB_OK;
    }
    int count = 0;
    wb_err probe;
    if (wb__backend_cuda_probe(&count, &probe) != WB_OK) {
        if (strcmp(requested, "cuda") == 0)
            return wb__err_set(err, probe.code, "%s", probe.msg);
        *out = host_with(stage, host_memfd);
        log_choice(*out, requested, device, probe.msg, 0);
        return WB_OK;
    }
    int slab = cuda_slab == WB_CUDA_SLAB_AUTO ? WB_CUDA_SLAB_VMM : cuda_slab;
    wb_cuda_options o = {.device = device, .slab = slab, .load_mode = load_mode, .stage = *stage};
    wb_backend *cuda = NULL;
    wb_err cerr;
    double t0 = wb__clock_mono_s();
    rc = wb__backend_cuda_new(&o, &cuda, &cerr);
    if (rc == WB_ENOSYS && cuda_slab == WB_CUDA_SLAB_AUTO) {
        /* The default asks for read-only slabs where the device has them;
         * without VMM descriptor export, legacy IPC, and one line why. */
        char q[WB_ERR_MSG_MAX + 64];
        wb_warn("cuda_slab", "cuda_slab=ipc access=rw requested=default reason=%s",
                wb__log_quote(q, sizeof q, cerr.msg));
        o.slab = WB_CUDA_SLAB_IPC;
        rc = wb__backend_cuda_new(&o, &cuda, &cerr);
    }
    if (rc != WB_OK) {
        if (strcmp(requested, "cuda") == 0)
            return wb__err_set(err, rc, "cannot start the cuda backend: %s", cerr.msg);
        char why[WB_ERR_MSG_MAX + 64];
        snprintf(why, sizeof why, "a GPU is usable but the cuda backend failed to start: %.*s",
                 WB_ERR_MSG_MAX - 1, cerr.msg);
        *out = host_with(stage, host_memfd);
        log_choice(*out, requested, device, why, 0);
        return WB_OK;
    }
    char why[64];
    snprintf(why, sizeof why, "%d usable GPU%s", count, count == 1 ? "" : "s");
    *out = cuda;
    log_choice(cuda, requested, device, why, wb__clock_mono_s() - t0);
    return WB_OK;
}

void wb__backend_release(const wb_backend **be)
{
    if (!be || !*be)
        return;
    if ((*be)->proto == WBPROTO__BACKEND__BACKEND_CUDA) {
        wb_backend *b = (wb_backend *)*be;
        wb__backend_cuda_free(&b);
    }
    *be = NULL;
}
