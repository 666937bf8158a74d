/* wbctl version: the block every program's --version prints, or the same
 * facts as JSON. Needs no broker. */
#include "wbctl.h"

#include "alloc.h"
#include "buildinfo.h"
#include "wbctl_call.h"
#include "wbctl_out.h"
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "host cuda vmm" as ["host", "cuda", "vmm"]. */
static json_t *backends_json(void)
{
    json_t *a = json_array();
    char *list = wb__strdup(wb__build_backends());
    char *save = NULL;
    for (char *w = list ? strtok_r(list, " ", &save) : NULL; w && a; w = strtok_r(NULL, " ", &save))
        json_array_append_new(a, json_string(w));
    free(list);
    return a;
}

int wbctl_version(const wbctl_globals *g, int argc, char **argv)
{
    (void)g;
    static const wbctl_spec spec = {
        .synopsis = "version [--json]",
        .about = "Prints wbctl's version, the git revision it was built from, the protocol\n"
                 "version it speaks and the backends built in, as --version does.",
        .flags = WBCTL_LOCAL,
    };
    wbctl_args a;
    int rc = wbctl_parse(argc, argv, &spec, &a);
    if (rc >= 0)
        return rc;
    if (a.output != WBCTL_OUT_JSON) {
        wb__print_version(stdout, "wbctl", NULL);
        return WBCTL_EXIT_OK;
    }
    json_t *o = json_object();
    json_object_set_new(o, "program", json_string("wbctl"));
    json_object_set_new(o, "version", json_string(WB_VERSION));
    json_object_set_new(o, "git", json_string(wb__build_rev()));
    json_object_set_new(o, "protocol", json_integer(WB_PROTOCOL_VERSION));
    json_object_set_new(o, "backends", backends_json());
    return wbctl_print_json(o);
}
