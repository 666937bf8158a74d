/* The administrator's operations: load (deferred to the loader thread when
 * there is one, answered by wb__ops_load_done) and unload, and the
 * administrator check they and the listings make. */
#include "ops_impl.h"

#include "log.h"

#include <stdio.h>

int wb__ops_is_admin(const wb_broker *b, const wb_peer_creds *peer)
{
    return wb__auth_admin_ok(&b->auth, peer);
}

/* An administrator operation from a peer that is not one: logged with the
 * list it failed. */
int wb__ops_refuse_admin(wb_broker *b, const wb_peer_creds *peer, const char *verb, wb_ops_reply *r)
{
    char who[200], groups[200];
    wb_err err;
    b->stats.requests_refused++;
    wb_warn("peer_refused", "reason=not_admin op=%s uid=%u gid=%u groups=%s pid=%u admins=\"%s\"",
            verb, peer->uid, peer->gid, wb__auth_groups_field(peer, groups, sizeof groups),
            peer->pid, wb__auth_describe_admins(&b->auth, who, sizeof who));
    wb__auth_refuse_admin(&b->auth, peer, verb, &err);
    return wb__ops_fail(r, WB_EPERM, "%s", err.msg);
}

void wb__ops_load_done(wb_broker *b, const wb_load_job *job, wb_model *model, wb_ops_reply *r)
{
    (void)b;
    wb_arena *a = &r->arena;
    r->msg.version = WB_PROTOCOL_VERSION;
    r->msg.id = job->request_id;
    if (job->rc != WB_OK || !model) {
        wb__ops_error(r, job->request_id, job->rc != WB_OK ? job->rc : WB_EINTERNAL, job->err.msg);
        return;
    }
    Wbproto__LoadReply *lr = wb__arena_alloc(a, sizeof *lr);
    Wbproto__ModelInfo *mi = wb__ops_model_info(model, model->state, a);
    if (!lr || !mi) {
        /* The load is done and stays: the error says so. */
        wb__ops_fail(r, WB_ENOMEM,
                     "model '%s' is loaded (%s), but out of memory building the reply; `wbctl "
                     "models` lists it",
                     model->name, wb__model_state_name(model->state));
        return;
    }
    wbproto__load_reply__init(lr);
    lr->model = mi;
    r->msg.body_case = WBPROTO__REPLY__BODY_LOAD;
    r->msg.load = lr;
}

/* A load of a name that is taken. A draining model keeps its name until its
 * last lease ends: say how to go on. */
static int refuse_taken(wb_ops_reply *r, const wb_model *m)
{
    if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
        return wb__ops_fail(r, WB_EEXIST,
                            "a model named '%s' already exists and is draining: its name is free "
                            "again when its last lease ends (%u left; `wbctl leases %s` shows "
                            "them); wait for that, or load this one under another name",
                            m->name, m->leases, m->name);
    return wb__ops_fail(r, WB_EEXIST, "a model named '%s' already exists (%s)", m->name,
                        wb__model_state_name(m->state));
}

int wb__ops_load(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                 const void *ident, size_t ident_len, wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const char *name = req->load->name;
    const char *path = req->load->path;
    int no_wait = req->load->no_wait;
    char q[300], qp[WB_PATH_MAX + 64];
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, "load", r);
    if (!wb__model_name_valid(name))
        return wb__ops_fail(r, WB_EINVAL,
                            "model name %s is not 1 to %d characters of A-Z a-z 0-9 . _ -",
                            wb__log_quote(q, 80, name), WB_NAME_MAX);
    /* The record of a failed load is replaced: a load of its name is the
     * retry. */
    wb_model *old = wb__models_find(&b->models, name);
    if (old && old->state != WBPROTO__MODEL_STATE__MODEL_FAILED)
        return refuse_taken(r, old);
    /* The path and the files are judged by the loader (wb__broker_check_job):
     * nothing here touches the file system, and the name is reserved by the
     * loading model meanwhile. */
    wb_err cerr;
    int crc = wb__limits_check_models(&b->limits, wb__models_held(&b->models), &cerr);
    if (crc != WB_OK)
        return wb__ops_fail(r, crc, "%s", cerr.msg);
    int devices[WB_GPU_MAX];
    unsigned n_devices = 0;
    crc = wb__broker_placement(b, name, req->load->placement, devices, &n_devices, &cerr);
    if (crc != WB_OK)
        return wb__ops_fail(r, crc, "%s", cerr.msg);
    wb_model *m = wb__model_new(name, path, b->cfg.backend, b->cfg.device);
    /* A load nobody waits for answers nothing when it ends. */
    wb_load_job *job = wb__load_job_new(name, path, b->cfg.backend, b->cfg.device,
                                        no_wait ? NULL : ident, no_wait ? 0 : ident_len, r->msg.id);
    if (!m || !job) {
        wb__model_free(&m);
        wb__load_job_free(&job);
        return wb__ops_oom(r);
    }
    /* Its failure is kept for `wbctl models` to show when nobody is told,
     * or when it replaces such a record. */
    job->keep_failed = no_wait || old;
    if (old) {
        wb__models_remove(&b->models, old);
        wb__model_free(&old);
    }
    wb__broker_set_devices(b, m, job, devices, n_devices);
    wb__broker_check_job(b, peer, job);
    wb__models_add(&b->models, m);
    m->job = job;
    wb_info("model_load_start", "model=%s path=%s backend=%s pid=%u uid=%u%s",
            wb__log_quote(q, sizeof q, name), wb__log_quote(qp, sizeof qp, path),
            b->cfg.backend->name, peer->pid, peer->uid, no_wait ? " no_wait=yes" : "");
    if (b->loader) {
        wb__loader_submit(b->loader, job);
        if (!no_wait)
            return WB_OPS_DEFERRED;
        Wbproto__LoadReply *lr = wb__arena_alloc(a, sizeof *lr);
        Wbproto__ModelInfo *mi = wb__ops_model_info(m, m->state, a);
        if (!lr || !mi)
            return wb__ops_oom(r);
        wbproto__load_reply__init(lr);
        lr->model = mi;
        r->msg.body_case = WBPROTO__REPLY__BODY_LOAD;
        r->msg.load = lr;
        return 0;
    }
    /* Inline (no loader thread): the load has ended when the reply goes,
     * no_wait or not. */
    wb__load_job_run(job, NULL);
    wb_model *ready;
    wb__broker_finish_load(b, job, &ready);
    wb__ops_load_done(b, job, ready, r);
    wb__load_job_free(&job);
    return 0;
}

int wb__ops_unload(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const char *name = req->unload->name;
    int cancel_only = req->unload->cancel_only;
    char q[300];
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, "unload", r);
    wb_model *m = wb__models_find(&b->models, name);
    if (!m)
        return wb__ops_fail(r, WB_ENOTFOUND, "no model named '%s'", name);
    if (cancel_only && m->state != WBPROTO__MODEL_STATE__MODEL_LOADING)
        return wb__ops_fail(r, WB_ESTATE,
                            "model '%s' is %s, not loading: there is no load to cancel (unload "
                            "it instead)",
                            name, wb__model_state_name(m->state));
    Wbproto__UnloadReply *ur = wb__arena_alloc(a, sizeof *ur);
    if (!ur)
        return wb__ops_oom(r);
    wbproto__unload_reply__init(ur);
    if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING) {
        /* Nothing leases a loading model: its load stops and it goes. */
        if (!(ur->model = wb__ops_model_info(m, WBPROTO__MODEL_STATE__MODEL_FREED, a)))
            return wb__ops_oom(r);
        ur->load_cancelled = 1;
        wb__broker_cancel_load(b, m, peer, cancel_only ? WB_LOAD_CANCELLED : WB_LOAD_UNLOADED);
    } else if (m->leases == 0) {
        if (!(ur->model = wb__ops_model_info(m, WBPROTO__MODEL_STATE__MODEL_FREED, a)))
            return wb__ops_oom(r);
        wb__broker_free_model(b, m);
    } else {
        /* The reply is made first: a refused unload leaves the model as
         * it was. */
        if (!(ur->model = wb__ops_model_info(m, WBPROTO__MODEL_STATE__MODEL_DRAINING, a)))
            return wb__ops_oom(r);
        if (m->state != WBPROTO__MODEL_STATE__MODEL_DRAINING) {
            m->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
            wb_info("model_draining", "model=%s leases=%u", wb__log_quote(q, sizeof q, name),
                    m->leases);
        }
    }
    r->msg.body_case = WBPROTO__REPLY__BODY_UNLOAD;
    r->msg.unload = ur;
    return 0;
}
