/* wbctl's administrator commands: load and unload. */
#include "wbctl.h"

#include "wbctl_call.h"
#include "placement.h"
#include "wbctl_model.h"
#include "wbctl_progress.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A load can read many gigabytes before the broker answers. */
#define LOAD_TIMEOUT_MS (10 * 60 * 1000)

int wbctl_load(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME", "PATH"};
    int json;
    char *pos[2];
    int rc = wbctl_parse_args(argc, argv, "load [--json] NAME PATH[@DEVICES]",
                              "Loads the safetensors checkpoint PATH (a file, a directory or an "
                              "index) as model NAME\nand waits until the broker has finished "
                              "(up to 10 minutes unless --timeout-ms is given).\n@DEVICES "
                              "places a copy on each device: @0,1, @all or @GPU-<uuid>,... "
                              "(default: the broker's --device).",
                              2, names, &json, pos);
    if (rc >= 0)
        return rc;
    /* PATH@DEVICES, as wbrokerd --model: the last '@' starts the placement. */
    char *placement = strrchr(pos[1], '@');
    if (placement) {
        *placement++ = '\0';
        wb_placement where;
        wb_err perr;
        if (wb__placement_parse(placement, strlen(placement), &where, &perr) != WB_OK) {
            fprintf(stderr, "wbctl load: %s\n", perr.msg);
            return WBCTL_EXIT_USAGE;
        }
    }
    /* The broker resolves paths from its own working directory. */
    char abs[PATH_MAX];
    if (!realpath(pos[1], abs)) {
        int n = pos[1][0] == '/' ? snprintf(abs, sizeof abs, "%s", pos[1]) : -1;
        if (n < 0) {
            char cwd[PATH_MAX];
            if (getcwd(cwd, sizeof cwd))
                n = snprintf(abs, sizeof abs, "%s/%s", cwd, pos[1]);
        }
        if (n < 0 || (size_t)n >= sizeof abs) {
            fprintf(stderr, "wbctl load: cannot make %s absolute: %s\n", pos[1], strerror(errno));
            return WBCTL_EXIT_USAGE;
        }
    }
    Wbproto__LoadRequest body = WBPROTO__LOAD_REQUEST__INIT;
    body.name = pos[0];
    body.path = abs;
    body.placement = placement ? placement : "";
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_LOAD;
    req.load = &body;
    Wbproto__Reply *rep;
    /* On a terminal, a progress bar while the broker loads. */
    wbctl_progress *bar = json ? NULL : wbctl_progress_start(g->socket_path, pos[0]);
    rc = wbctl_call(g, "load", &req, g->timeout_ms > 0 ? g->timeout_ms : LOAD_TIMEOUT_MS, &rep);
    wbctl_progress_stop(&bar);
    if (rc >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->load->model;
    if (!m) {
        fprintf(stderr, "wbctl: load: the broker's reply carries no model\n");
        rc = WBCTL_EXIT_UNAVAILABLE;
    } else if (json) {
        rc = wbctl_print_json(wbctl_model_json(m));
    } else {
        wbctl_table t = {.ncols = WBCTL_MODEL_COLUMNS};
        wbctl_model_header(&t);
        wbctl_model_row(&t, m);
        wbctl_table_print(&t);
        wbctl_model_failures(m);
        wbctl_print_stages(m);
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}

int wbctl_unload(const wbctl_globals *g, int argc, char **argv)
{
    static const char *const names[] = {"NAME"};
    int json;
    char *pos[1];
    int rc = wbctl_parse_args(argc, argv, "unload [--json] NAME",
                              "Unloads model NAME: it is freed at once when no lease holds it, "
                              "else it drains\n(new leases are refused) and is freed when the last "
                              "lease ends.",
                              1, names, &json, pos);
    if (rc >= 0)
        return rc;
    Wbproto__UnloadRequest body = WBPROTO__UNLOAD_REQUEST__INIT;
    body.name = pos[0];
    Wbproto__Request req = WBPROTO__REQUEST__INIT;
    req.body_case = WBPROTO__REQUEST__BODY_UNLOAD;
    req.unload = &body;
    Wbproto__Reply *rep;
    if ((rc = wbctl_call(g, "unload", &req, g->timeout_ms, &rep)) >= 0)
        return rc;
    const Wbproto__ModelInfo *m = rep->unload->model;
    if (!m) {
        fprintf(stderr, "wbctl: unload: the broker's reply carries no model\n");
        rc = WBCTL_EXIT_UNAVAILABLE;
    } else if (json) {
        rc = wbctl_print_json(wbctl_model_json(m));
    } else {
        if (m->state == WBPROTO__MODEL_STATE__MODEL_DRAINING)
            printf("draining (%u lease%s)\n", m->leases, m->leases == 1 ? "" : "s");
        else
            printf("%s\n", wb__model_state_name(m->state));
        rc = WBCTL_EXIT_OK;
    }
    wb__reply_free(&rep);
    return rc;
}
