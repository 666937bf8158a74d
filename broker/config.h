/* wbrokerd's configuration file: INI, read with libinih.
 *
 *   [broker]
 *   socket = /run/wbroker/broker.sock
 *   heartbeat-ms = 1000
 *
 *   [model llama-base]
 *   path = /var/lib/wbroker/llama-base.safetensors
 *   device = 0
 *
 * Every key of [broker] is the name of one of the program's long options
 * ('_' may stand for '-'), so the file can set whatever the command line can
 * and nothing else. The file is not interpreted here: it becomes a vector of
 * "--key=value" arguments that the program parses with the same code as its
 * command line, placed before the real arguments so that flags given on the
 * command line win. A [model NAME] section becomes "--model=NAME=PATH", or
 * "--model=NAME@DEVICES=PATH" when it names devices (`device =` or
 * `devices =`, a placement: "0", "0,1", "all", "GPU-...").
 *
 * A comment starts with '#' or ';' at the start of a line or after a space
 * or tab ("max-models = 8  # two per GPU"); elsewhere both characters are
 * part of the value (a path "/models/run#3"), so a value cannot hold " #"
 * or " ;".
 *
 * Errors name the file and line: "/etc/wbroker.conf:12: unknown key 'sokcet'
 * in [broker] (did you mean 'socket'?)". */
#ifndef WB_BROKER_CONFIG_H
#define WB_BROKER_CONFIG_H

#include "err.h"
#include "placement.h"

#include <getopt.h>

typedef struct wb_config {
    char *file;  /* the path as given; owned */
    int n_args;  /* number of synthesised arguments */
    char **args; /* "--key=value", owned, in file order */
    int *lines;  /* the line each argument comes from (a model's: its path's) */
} wb_config;

/* Reads `file`. `opts` is the program's getopt_long table (ended by a NULL
 * name); `exclude` lists long options a file may not set (for example
 * "config", "help"), ended by NULL. Returns WB_OK and fills *cfg, or an error
 * whose message starts with "FILE:LINE: " (or "FILE: " when the file cannot
 * be read): WB_ENOTFOUND / WB_EIO when it cannot be read, WB_EFORMAT for a
 * line that is not INI, WB_EINVAL for an unknown section or key, a key given
 * twice, or a value that is wrong whatever the program makes of it. On error
 * *cfg is left empty. */
int wb__config_load(const char *file, const struct option *opts, const char *const *exclude,
                    wb_config *cfg, wb_err *err);

/* Frees what wb__config_load filled; the struct may be reused. */
void wb__config_free(wb_config *cfg);

/* A model given as "--model NAME=PATH", "NAME=PATH@DEVICES" or
 * "NAME@DEVICES=PATH", DEVICES a placement (placement.h: "0,1", "all",
 * "GPU-..."). */
typedef struct wb_model_arg {
    char name[256];
    int device;       /* a placement of one ordinal: it; else -1 */
    const char *path; /* path_len bytes (the placement after it is not part) */
    size_t path_len;
    const char *placement; /* NULL when not given; placement_len bytes */
    size_t placement_len;
    wb_placement where; /* parsed */
} wb_model_arg;

/* Splits a --model value (not modified; path and placement point into it).
 * Returns WB_OK, or WB_EINVAL with a message that says what is wrong with
 * it (a placement's names its text and position). */
int wb__config_parse_model(const char *value, wb_model_arg *out, wb_err *err);

#endif
