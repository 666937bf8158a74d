/* The administrator's operations: load (deferred to the loader thread when
 * there is one, answered by wb__ops_load_done) and unload, and the
 * administrator check they and the listings make. */
#include "ops_impl.h"

#include "log.h"
#include "publish.h"

#include <stdio.h>
#include <string.h>

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

/* The reply of a load or rollout whose model is `model` (loading for a
 * no_wait one, else ready): LoadReply, or RolloutReply with the version it
 * replaced (or, loading, will replace) and when it became current. */
static int load_reply(const wb_load_job *job, const wb_model *model, wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    Wbproto__ModelInfo *mi = wb__ops_model_info(model, model->state, a);
    if (!mi)
        return WB_ENOMEM;
    if (job->op == WBPROTO__REQUEST__BODY_ROLLOUT) {
        Wbproto__RolloutReply *rr = wb__arena_alloc(a, sizeof *rr);
        if (!rr)
            return WB_ENOMEM;
        wbproto__rollout_reply__init(rr);
        rr->model = mi;
        rr->previous_version =
            model->state == WBPROTO__MODEL_STATE__MODEL_LOADING ? job->beside : job->previous;
        rr->current_at = job->current_at;
        r->msg.body_case = WBPROTO__REPLY__BODY_ROLLOUT;
        r->msg.rollout = rr;
        return WB_OK;
    }
    Wbproto__LoadReply *lr = wb__arena_alloc(a, sizeof *lr);
    if (!lr)
        return WB_ENOMEM;
    wbproto__load_reply__init(lr);
    lr->model = mi;
    r->msg.body_case = WBPROTO__REPLY__BODY_LOAD;
    r->msg.load = lr;
    return WB_OK;
}

void wb__ops_load_done(wb_broker *b, const wb_load_job *job, wb_model *model, wb_ops_reply *r)
{
    (void)b;
    r->msg.version = WB_PROTOCOL_VERSION;
    r->msg.id = job->request_id;
    if (job->rc != WB_OK || !model) {
        wb__ops_error(r, job->request_id, job->rc != WB_OK ? job->rc : WB_EINTERNAL, job->err.msg);
        return;
    }
    if (load_reply(job, model, r) != WB_OK)
        /* The load is done and stays: the error says so. */
        wb__ops_fail(r, WB_ENOMEM,
                     "model '%s' is loaded (%s), version %u, but out of memory building the "
                     "reply; `wbctl models` lists it",
                     model->name, wb__model_state_name(model->state), model->version);
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
    if (m->state == WBPROTO__MODEL_STATE__MODEL_READY)
        return wb__ops_fail(r, WB_EEXIST,
                            "a model named '%s' already exists (version %u is current); `wbctl "
                            "rollout %s PATH` loads a new version of it",
                            m->name, m->version, m->name);
    return wb__ops_fail(r, WB_EEXIST, "a model named '%s' already exists (%s)", m->name,
                        wb__model_state_name(m->state));
}

int wb__ops_start_load(wb_broker *b, const wb_peer_creds *peer, const wb_load_start *ls,
                       const void *ident, size_t ident_len, wb_ops_reply *r)
{
    char q[300], qp[WB_PATH_MAX + 64];
    wb_model *m = wb__model_new(ls->name, ls->path, b->cfg.backend, b->cfg.device);
    /* A load nobody waits for answers nothing when it ends. */
    wb_load_job *job =
        wb__load_job_new(ls->name, ls->path, b->cfg.backend, b->cfg.device,
                         ls->no_wait ? NULL : ident, ls->no_wait ? 0 : ident_len, r->msg.id);
    if (!m || !job) {
        wb__model_free(&m);
        wb__load_job_free(&job);
        return wb__ops_oom(r);
    }
    /* Its failure is kept for `wbctl models` to show when nobody is told,
     * when it replaces such a record, or for a rollout (beside the current
     * version it leaves as it was). */
    job->keep_failed = ls->no_wait || ls->replaces || ls->rollout;
    job->rollout = ls->rollout;
    job->beside = ls->beside;
    job->op = ls->rollout ? WBPROTO__REQUEST__BODY_ROLLOUT : WBPROTO__REQUEST__BODY_LOAD;
    job->no_share = ls->no_share;
    m->no_share = ls->no_share;
    if (ls->replaces) {
        wb_model *old = ls->replaces;
        wb__models_remove(&b->models, old);
        wb__model_free(&old);
    }
    wb__broker_set_devices(b, m, job, ls->devices, ls->n_devices);
    wb__broker_check_job(b, peer, job);
    wb__models_add(&b->models, m);
    /* Numbered once it is a record of its name: the failed record it
     * replaced counted as issued. */
    m->version = job->version = ls->rollout ? wb__models_issue(&b->models, ls->name) : 1;
    m->job = job;
    wb__log_quote(q, sizeof q, ls->name);
    wb__log_quote(qp, sizeof qp, ls->path);
    if (ls->rollout)
        wb_info("model_rollout_start",
                "model=%s version=%u current=%u path=%s backend=%s pid=%u uid=%u%s", q, m->version,
                ls->beside, qp, b->cfg.backend->name, peer->pid, peer->uid,
                ls->no_wait ? " no_wait=yes" : "");
    else
        wb_info("model_load_start", "model=%s path=%s backend=%s pid=%u uid=%u%s", q, qp,
                b->cfg.backend->name, peer->pid, peer->uid, ls->no_wait ? " no_wait=yes" : "");
    if (b->loader) {
        wb__loader_submit(b->loader, job);
        if (!ls->no_wait)
            return WB_OPS_DEFERRED;
        if (load_reply(job, m, r) != WB_OK)
            return wb__ops_oom(r);
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

int wb__ops_load(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                 const void *ident, size_t ident_len, wb_ops_reply *r)
{
    const char *name = req->load->name;
    char q[300];
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, "load", r);
    if (!wb__model_name_valid(name))
        return wb__ops_fail(r, WB_EINVAL,
                            "model name %s is not 1 to %d characters of A-Z a-z 0-9 . _ -",
                            wb__log_quote(q, 80, name), WB_NAME_MAX);
    /* The record of a failed load is replaced: a load of its name is the
     * retry. A name with any other record is taken (a new version of it is
     * a rollout). */
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
    wb_load_start ls = {.name = name,
                        .path = req->load->path,
                        .no_wait = req->load->no_wait,
                        .no_share = req->load->no_share,
                        .replaces = old};
    crc = wb__broker_placement(b, name, req->load->placement, ls.devices, &ls.n_devices, &cerr);
    if (crc != WB_OK)
        return wb__ops_fail(r, crc, "%s", cerr.msg);
    return wb__ops_start_load(b, peer, &ls, ident, ident_len, r);
}

/* Cancels the loading version of a name (`wbctl cancel`): a rollout in
 * progress, or the name's first load. */
static int cancel_loading(wb_broker *b, const wb_peer_creds *peer, const char *name,
                          wb_ops_reply *r)
{
    wb_model *m = wb__models_in_state(&b->models, name, WBPROTO__MODEL_STATE__MODEL_LOADING);
    if (!m) {
        const wb_model *any = wb__models_find(&b->models, name);
        return wb__ops_fail(r, WB_ESTATE,
                            "model '%s' is %s, not loading: there is no load to cancel (unload "
                            "it instead)",
                            name, wb__model_state_name(any->state));
    }
    Wbproto__UnloadReply *ur = wb__arena_alloc(&r->arena, sizeof *ur);
    if (!ur)
        return wb__ops_oom(r);
    wbproto__unload_reply__init(ur);
    if (!(ur->model = wb__ops_model_info(m, WBPROTO__MODEL_STATE__MODEL_FREED, &r->arena)))
        return wb__ops_oom(r);
    ur->load_cancelled = 1;
    wb__broker_cancel_load(b, m, peer, WB_LOAD_CANCELLED);
    r->msg.body_case = WBPROTO__REPLY__BODY_UNLOAD;
    r->msg.unload = ur;
    return 0;
}

/* An unload ends every version of the name: a loading one has its load
 * stopped, a failed record goes, one without leases is freed, the others
 * drain. The reply shows the version that stood for the name, draining
 * while any version is leased (with the leases of them all), else freed. */
int wb__ops_unload(wb_broker *b, const wb_peer_creds *peer, const Wbproto__Request *req,
                   wb_ops_reply *r)
{
    wb_arena *a = &r->arena;
    const char *name = req->unload->name;
    char q[300];
    if (!wb__ops_is_admin(b, peer))
        return wb__ops_refuse_admin(b, peer, "unload", r);
    wb_model *rep = wb__models_find(&b->models, name);
    if (!rep)
        return wb__ops_fail(r, WB_ENOTFOUND, "no model named '%s'", name);
    if (req->unload->cancel_only)
        return cancel_loading(b, peer, name, r);
    uint32_t leases = 0;
    int loading = 0;
    for (const wb_model *m = b->models.head; m; m = m->next) {
        if (strcmp(m->name, name) != 0)
            continue;
        loading |= m->state == WBPROTO__MODEL_STATE__MODEL_LOADING;
        if (m->state == WBPROTO__MODEL_STATE__MODEL_READY ||
            m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
            leases += m->leases;
    }
    Wbproto__UnloadReply *ur = wb__arena_alloc(a, sizeof *ur);
    if (!ur)
        return wb__ops_oom(r);
    wbproto__unload_reply__init(ur);
    /* The reply is made first: a refused unload leaves the model as it
     * was. */
    int after = leases ? WBPROTO__MODEL_STATE__MODEL_DRAINING : WBPROTO__MODEL_STATE__MODEL_FREED;
    if (!(ur->model = wb__ops_model_info(rep, after, a)))
        return wb__ops_oom(r);
    ur->model->leases = leases;
    ur->load_cancelled = loading;
    wb__log_quote(q, sizeof q, name);
    wb_model *m = b->models.head;
    while (m) {
        wb_model *next = m->next;
        if (strcmp(m->name, name) != 0) {
            m = next;
            continue;
        }
        if (m->state == WBPROTO__MODEL_STATE__MODEL_LOADING) {
            /* Nothing leases a loading model: its load stops and it goes. */
            wb__broker_cancel_load(b, m, peer, WB_LOAD_UNLOADED);
        } else if (m->state == WBPROTO__MODEL_STATE__MODEL_FAILED || m->leases == 0) {
            wb__broker_free_model(b, m);
        } else {
            m->current = 0;
            wb__publish_checksums_drop(b, m);
            if (m->state != WBPROTO__MODEL_STATE__MODEL_DRAINING) {
                m->state = WBPROTO__MODEL_STATE__MODEL_DRAINING;
                wb_info("model_draining", "model=%s leases=%u version=%u", q, m->leases,
                        m->version);
            }
        }
        m = next;
    }
    r->msg.body_case = WBPROTO__REPLY__BODY_UNLOAD;
    r->msg.unload = ur;
    return 0;
}
