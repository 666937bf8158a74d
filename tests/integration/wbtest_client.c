/* A scriptable broker client for the integration tests: it does what a
 * well-behaved worker would not (release another process's lease, send
 * arbitrary bytes) and reports the broker's exact answer.
 *
 *   wbtest_client [--socket PATH] acquire MODEL   print the lease id, hold it
 *                                                 until SIGTERM, then release
 *   wbtest_client [--socket PATH] release HEX     release lease HEX by id
 *   wbtest_client [--socket PATH] raw HEXBYTES    send one frame of raw bytes
 *
 * Exit codes: 0 the broker accepted, 1 it refused (its message on stderr),
 * 2 misuse, 69 no broker answered. */
#include "wb/client.h"

#include "rpc.h"
#include "wire.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *socket_path;

static int usage(void)
{
    fprintf(stderr, "usage: wbtest_client [--socket PATH] acquire MODEL | release HEX | "
                    "raw HEXBYTES\n");
    return 2;
}

static int unhex(const char *s, uint8_t *out, size_t cap, size_t *len)
{
    size_t n = strlen(s);
    if (n % 2 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    *len = n / 2;
    return 0;
}

int main(int argc, char **argv)
{
    int i = 1;
    if (i + 1 < argc && strcmp(argv[i], "--socket") == 0) {
        socket_path = argv[i + 1];
        i += 2;
    }
    if (argc - i != 2)
        return usage();
    const char *cmd = argv[i], *arg = argv[i + 1];

    if (strcmp(cmd, "acquire") == 0) {
        sigset_t stop;
        sigemptyset(&stop);
        sigaddset(&stop, SIGTERM);
        sigaddset(&stop, SIGINT);
        sigprocmask(SIG_BLOCK, &stop, NULL);
        wb_client_options o;
        wb_client_options_init(&o);
        o.socket_path = socket_path;
        wb_client *c = NULL;
        wb_lease *l = NULL;
        int rc = wb_client_connect(&o, &c);
        if (rc == WB_OK)
            rc = wb_lease_acquire(c, arg, &l);
        if (rc != WB_OK) {
            fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
            wb_client_destroy(&c);
            return rc == WB_ECONN || rc == WB_ETIMEDOUT ? 69 : 1;
        }
        char hex[33];
        wb_lease_id_hex(l, hex);
        printf("%s\n", hex);
        fflush(stdout);
        int sig;
        sigwait(&stop, &sig);
        rc = wb_lease_release(&l);
        if (rc != WB_OK)
            fprintf(stderr, "wbtest_client: %s\n", wb_client_errmsg(c));
        else
            printf("released\n");
        wb_client_destroy(&c);
        return rc == WB_OK ? 0 : 1;
    }

    wb__rpc rpc;
    wb_err err;
    int rc = wb__rpc_open(&rpc, socket_path, 0, &err);
    if (rc != WB_OK) {
        fprintf(stderr, "wbtest_client: %s\n", err.msg);
        wb__rpc_close(&rpc);
        return 69;
    }
    Wbproto__Reply *rep = NULL;
    uint8_t buf[4096];
    size_t len = 0;
    if (strcmp(cmd, "release") == 0) {
        if (unhex(arg, buf, sizeof buf, &len) != 0) {
            wb__rpc_close(&rpc);
            return usage();
        }
        Wbproto__ReleaseRequest rel = WBPROTO__RELEASE_REQUEST__INIT;
        rel.lease_id.data = buf;
        rel.lease_id.len = len;
        Wbproto__Request req = WBPROTO__REQUEST__INIT;
        req.body_case = WBPROTO__REQUEST__BODY_RELEASE;
        req.release = &rel;
        rc = wb__rpc_call(&rpc, &req, 0, &rep, &err);
    } else if (strcmp(cmd, "raw") == 0) {
        if (unhex(arg, buf, sizeof buf, &len) != 0) {
            wb__rpc_close(&rpc);
            return usage();
        }
        rc = wb__rpc_call_raw(&rpc, buf, len, 0, &rep, &err);
        if (rep)
            printf("status=%d id=%llu\n", (int)rep->status, (unsigned long long)rep->id);
    } else {
        wb__rpc_close(&rpc);
        return usage();
    }
    wb__rpc_close(&rpc);
    int code = 0;
    if (rc != WB_OK) {
        fprintf(stderr, "wbtest_client: %s: %s\n", cmd, err.msg);
        code = rep ? 1 : 69;
    } else if (strcmp(cmd, "release") == 0) {
        printf("released (model %s)\n", wb__model_state_name(rep->release->model_state));
    }
    wb__reply_free(&rep);
    return code;
}
