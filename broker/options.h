/* wbrokerd's options: the command line and the configuration file's
 * [broker] keys (config.c turns them into the same arguments) go through one
 * table-driven parser into one struct, checked as a whole before anything
 * starts. main.c only runs what they say. */
#ifndef WB_BROKER_OPTIONS_H
#define WB_BROKER_OPTIONS_H

#include "auth.h"
#include "backend.h"
#include "config.h"
#include "quota.h"

#include <stddef.h>
#include <stdio.h>

#define WB_EXIT_USAGE 2
/* sysexits.h's EX_CONFIG: the configuration file is wrong. */
#define WB_EXIT_CONFIG 78
/* wb__options_parse and wb__options_validate: go on to the next step. */
#define WB_OPTIONS_GO_ON (-1)
/* --slab-pool-seconds when not given. */
#define WB_DEFAULT_SLAB_POOL_SECONDS 30

/* Numeric options, table-driven: each is a decimal number from min to
 * max; a wrong one is "--NAME: 'VALUE' is not WHAT". */
typedef enum wb_num_opt {
    WB_NUM_HEARTBEAT,
    WB_NUM_STALE,
    WB_NUM_HEARTBEAT_RATE,
    WB_NUM_READ_THREADS,
    WB_NUM_STAGING_MIB,
    WB_NUM_STAGING_BUFFERS,
    WB_NUM_REGISTER_THREADS,
    WB_NUM_COPY_BATCH,
    WB_NUM_MAX_LEASES,
    WB_NUM_MAX_MODELS,
    WB_NUM_MAX_TENSORS,
    WB_NUM_MAX_SHARDS,
    WB_NUM_MAX_MESSAGE,
    WB_NUM_MAX_HEADER,
    WB_NUM_MAX_PEERS,
    WB_NUM_MAX_REQUEST,
    WB_NUM_MAX_BUFFERED,
    WB_NUM_MAX_QUEUED,
    WB_NUM_MAX_QUEUED_BYTES,
    WB_NUM_MAX_QUEUED_TOTAL,
    WB_NUM_MAX_PER_PROCESS,
    WB_NUM_HANDSHAKE,
    WB_NUM_MAX_PER_UID,
    WB_NUM_MAX_SESSIONS_PER_UID,
    WB_NUM_METRICS_REQUEST_TIMEOUT,
    WB_NUM_MAX_VERSIONS,
    WB_NUM_SLAB_POOL_SECONDS,
    WB_NUM_PUBLISH_STREAMS,
    WB_NUM_OPTS
} wb_num_opt;

typedef struct wb_preload {
    char *name;
    char *path;
    int device;      /* a placement of one ordinal: it; else -1 */
    char *placement; /* NULL: the broker's --device; else "0,1", "all", ... */
    int from_file;   /* given by a [model NAME] section of the configuration file */
    int line;        /* that section's path line, else 0 */
} wb_preload;

/* Everything the options say, parsed and checked before anything starts. */
typedef struct wb_options {
    const char *socket;
    int socket_line; /* the configuration file's line of socket, 0: not from the file */
    const char *backend;
    int device, device_given;
    int load_mode;
    int read_source;       /* --read-source: wb_stage_read, 0: the default */
    int staging_pages;     /* --staging-pages: wb_stage_pages, 0: the default */
    int staging_demote;    /* --staging-demote: wb_stage_demote, 0: the default */
    int host_memfd;        /* --host-slab memfd (the default), 0: shm */
    int cuda_slab;         /* --cuda-slab: WB_CUDA_SLAB_AUTO (default), _VMM or _IPC */
    long num[WB_NUM_OPTS]; /* 0: not given */
    int line[WB_NUM_OPTS]; /* the configuration file's line of each, 0: not from the file */
    int log_level;         /* --log-level: a wb_log_level, -1: not given (info) */
    int log_format;        /* --log-format: a wb_log_format, -1: not given (text) */
    const char *metrics;
    const char *config_file;
    int check_config;
    wb_preload *models;
    size_t n_models;
    int require_all_models; /* a preload that fails stops the broker */
    int no_slab_pool;       /* --no-slab-pool: freed cuda-vmm slabs are not kept */
    int no_share_tensors;   /* --no-share-tensors: every load gets its own bytes */
    /* --device-memory-budget, --host-memory-budget (tier.h) */
    uint64_t device_budget;
    unsigned device_budget_pct;
    uint64_t host_budget;
    unsigned host_budget_pct;
    wb_auth auth; /* access lists, handed to the broker when it starts */
    wb_config config;
    char **av; /* the configuration file's arguments, then the command line's */
    int ac;
    /* A copy of the command line as given, owned, for wb__options_reparse
     * (parsing cuts --model values in place). */
    char **cmdline;
    int n_cmdline;
    char **reparsed; /* wb__options_reparse's working copy of it, owned */
    /* 1: nothing is printed or set in the process (the log level and
     * format stay as they are); why a parse or check failed is in `why`. */
    int quiet;
    char why[WB_ERR_MSG_MAX + 1280];
} wb_options;

/* Defaults: the "auto" backend, the access lists of this user. */
void wb__options_init(wb_options *o);

/* Reads the configuration file (its options go first, so that the command
 * line's win) and every option, and sets the log level and format they
 * name. Returns WB_OPTIONS_GO_ON, or the exit status (after printing why,
 * or --help or --version). A mistake is printed as "wbrokerd: MESSAGE",
 * with "FILE:LINE: " first and exit status 78 when the configuration file
 * holds it, else followed by "Try 'wbrokerd --help'." with exit status 2. */
int wb__options_parse(wb_options *o, int argc, char **argv);

/* Fills the defaults left, checks what single options cannot (stale-ms must
 * be at least twice heartbeat-ms), and answers --check-config, which also
 * checks that every model's path can be read (a file, a directory holding a
 * checkpoint, or a shard index and its shards). Returns WB_OPTIONS_GO_ON, or
 * the exit status; mistakes are reported as by wb__options_parse. */
int wb__options_validate(wb_options *o);

/* For SIGHUP: the configuration file read again and the command line as
 * `running` was given it (so that its flags still win), parsed and
 * validated into `next` (initialised here) without printing anything or
 * changing the process's log settings. Returns WB_OK, or WB_EINVAL with the
 * message (with FILE:LINE where the file is at fault) in err; free `next`
 * in both cases. */
int wb__options_reparse(const wb_options *running, wb_options *next, wb_err *err);

/* The limits the options set, over the defaults (quota.h). */
void wb__options_limits(const wb_options *o, wb_limits *l);

/* The long option of a numeric one, without its dashes ("stale-ms"). */
const char *wb__options_num_name(wb_num_opt k);

void wb__options_free(wb_options *o);

/* Reports why the broker cannot start or go on. In the JSON log format it
 * is a log line like the others, so that a log collector keeps it. */
void wb__fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* wbrokerd --help: every option, with its defaults, to `out`
 * (options_usage.c). */
void wb__options_usage(FILE *out);
/* wbrokerd --version: the common version block with this build's optional
 * features (+systemd, +metrics), to stdout. */
void wb__options_print_version(void);

#endif
