#include "stage_fanout.h"

#include <stdio.h>
#include <string.h>

void wb__stage_fanout_fail(wb_stage_fanout *f, unsigned i, const wb_err *why)
{
    wb_stage_fanout_target *t = &f->t[i];
    if (t->failed)
        return;
    t->failed = 1;
    t->err = *why;
    if (!t->err.code)
        t->err.code = WB_EIO;
}

unsigned wb__stage_fanout_live(const wb_stage_fanout *f)
{
    unsigned n = 0;
    for (unsigned i = 0; i < f->n; i++)
        n += !f->t[i].failed;
    return n;
}

/* The engine's error once no device is left: every device's reason. */
static int all_failed(const wb_stage_fanout *f, wb_err *err)
{
    if (f->n == 1)
        return wb__err_set(err, f->t[0].err.code, "%s", f->t[0].err.msg);
    char msg[WB_ERR_MSG_MAX];
    size_t at = 0;
    msg[0] = '\0';
    for (unsigned i = 0; i < f->n && at < sizeof msg; i++) {
        int w = snprintf(msg + at, sizeof msg - at, "%sdevice %d: %s", i ? "; " : "",
                         f->t[i].device, f->t[i].err.msg);
        if (w < 0)
            break;
        at += (size_t)w;
    }
    return wb__err_set(err, f->t[0].err.code, "the load failed on every device: %s", msg);
}

static int fan_begin(void *ctx, wb_err *err)
{
    wb_stage_fanout *f = ctx;
    for (unsigned i = 0; i < f->n; i++) {
        wb_stage_fanout_target *t = &f->t[i];
        wb_err e;
        if (!t->failed && t->engine->begin && t->engine->begin(t->engine->ctx, &e) != WB_OK)
            wb__stage_fanout_fail(f, i, &e);
    }
    return wb__stage_fanout_live(f) ? WB_OK : all_failed(f, err);
}

static int fan_submit(void *ctx, int buf, const void *src, void *dst, size_t len, wb_err *err)
{
    wb_stage_fanout *f = ctx;
    size_t off = (size_t)((uint8_t *)dst - f->base);
    for (unsigned i = 0; i < f->n; i++) {
        wb_stage_fanout_target *t = &f->t[i];
        wb_err e;
        if (!t->failed &&
            t->engine->submit(t->engine->ctx, buf, src, t->dst + off, len, &e) != WB_OK)
            wb__stage_fanout_fail(f, i, &e);
    }
    return wb__stage_fanout_live(f) ? WB_OK : all_failed(f, err);
}

/* One batch to every device still in the load, each at its own slab. */
static int fan_submit_many(void *ctx, const wb_copy *cp, unsigned n, wb_err *err)
{
    wb_stage_fanout *f = ctx;
    if (n == 0 || n > WB_STAGE_MAX_BATCH)
        return wb__err_set(err, WB_EINTERNAL, "a batch of %u copies", n);
    wb_copy mine[WB_STAGE_MAX_BATCH];
    for (unsigned i = 0; i < f->n; i++) {
        wb_stage_fanout_target *t = &f->t[i];
        if (t->failed)
            continue;
        for (unsigned k = 0; k < n; k++) {
            mine[k] = cp[k];
            mine[k].dst = t->dst + ((uint8_t *)cp[k].dst - f->base);
        }
        wb_err e;
        if (wb__copy_submit_many(t->engine, mine, n, &e) != WB_OK)
            wb__stage_fanout_fail(f, i, &e);
    }
    return wb__stage_fanout_live(f) ? WB_OK : all_failed(f, err);
}

/* Done when every device still in the load is done with the buffer. */
static int fan_query(void *ctx, int buf, wb_err *err)
{
    wb_stage_fanout *f = ctx;
    int done = 1;
    for (unsigned i = 0; i < f->n; i++) {
        wb_stage_fanout_target *t = &f->t[i];
        if (t->failed)
            continue;
        wb_err e;
        int q = t->engine->query(t->engine->ctx, buf, &e);
        if (q < 0)
            wb__stage_fanout_fail(f, i, &e);
        else if (q == 0)
            done = 0;
    }
    if (!wb__stage_fanout_live(f))
        return all_failed(f, err);
    return done;
}

/* Waits for every device, the failed ones too: nothing may still copy into
 * a slab that the loader is about to free. */
static int fan_finish(void *ctx, double *device_seconds, wb_err *err)
{
    wb_stage_fanout *f = ctx;
    *device_seconds = -1;
    for (unsigned i = 0; i < f->n; i++) {
        wb_stage_fanout_target *t = &f->t[i];
        wb_err e;
        double s = -1;
        int was_failed = t->failed;
        t->copy_seconds = -1;
        if (!t->engine)
            continue;
        int rc = t->engine->finish(t->engine->ctx, &s, &e);
        if (was_failed)
            continue;
        if (rc != WB_OK) {
            wb__stage_fanout_fail(f, i, &e);
            continue;
        }
        t->copy_seconds = s;
        if (s > *device_seconds)
            *device_seconds = s;
    }
    return wb__stage_fanout_live(f) ? WB_OK : all_failed(f, err);
}

/* A mapping is registered once, through the first device still in the load;
 * the backends register it portable, so every device copies from it. */
static int fan_register(void *ctx, void *addr, size_t len, wb_err *err)
{
    wb_stage_fanout *f = ctx;
    for (unsigned i = 0; i < f->n; i++) {
        if (!f->t[i].failed)
            return f->t[i].engine->host_register(f->t[i].engine->ctx, addr, len, err);
    }
    return all_failed(f, err);
}

static void fan_unregister(void *ctx, void *addr)
{
    wb_stage_fanout *f = ctx;
    for (unsigned i = 0; i < f->n; i++) {
        if (!f->t[i].failed) {
            f->t[i].engine->host_unregister(f->t[i].engine->ctx, addr);
            return;
        }
    }
}

int wb__stage_fanout_init(wb_stage_fanout *f, wb_stage_fanout_target *targets, unsigned n,
                          wb_err *err)
{
    memset(f, 0, sizeof *f);
    f->t = targets;
    f->n = n;
    int reg = 1;
    for (unsigned i = 0; i < n; i++) {
        if (targets[i].failed)
            continue;
        if (!f->base)
            f->base = targets[i].dst;
        if (!targets[i].engine->host_register || !targets[i].engine->host_unregister)
            reg = 0;
    }
    if (!f->base)
        return n ? all_failed(f, err) : wb__err_set(err, WB_EINVAL, "no device to load to");
    f->engine = (wb_copy_engine){
        .ctx = f,
        .begin = fan_begin,
        .submit = fan_submit,
        .submit_many = fan_submit_many,
        .query = fan_query,
        .finish = fan_finish,
        .host_register = reg ? fan_register : NULL,
        .host_unregister = reg ? fan_unregister : NULL,
    };
    return WB_OK;
}
