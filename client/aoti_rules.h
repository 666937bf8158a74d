/* Constant binding rules of the AOTI binding: how a model constant's name
 * (its original FQN) becomes the name of a checkpoint tensor (prefix map,
 * aliases for tied weights), and the package's own constants file that holds
 * what no checkpoint has (non-persistent buffers, tensor constants).
 * Internal to libwbclient.
 *
 * The constants file is a safetensors file written when the model is
 * compiled (weightbroker.compile): its tensors are keyed by the model's
 * FQNs and its __metadata__ may hold
 *   "weightbroker.aliases"       "name=target,name=target"
 *   "weightbroker.strip_prefix"  prefix removed from every FQN
 *   "weightbroker.prefix"        prefix added after that
 *   "weightbroker.mutated"       "fqn,fqn": constants the compiled graph
 *                                writes (buffers the exported program
 *                                mutates); never bound to shared memory
 * It is found, in this order: the path given in the options; inside a
 * package or package directory as weightbroker/constants.safetensors (at
 * its top or one folder down, under the archive name); beside
 * the model path as <model path>.wb.safetensors. */
#ifndef WB_AOTI_RULES_H
#define WB_AOTI_RULES_H

#include "err.h"
#include "safetensors.h"

#include <stddef.h>

typedef struct wb__alias {
    char *name;
    char *target;
    int from_file; /* 1: read from the constants file, 0: given by the caller */
} wb__alias;

typedef struct wb__aoti_rules {
    char *strip_prefix; /* NULL: none */
    char *prefix;       /* NULL: none */
    size_t n_aliases;
    wb__alias *aliases;
    char *mutated;      /* ",fqn,fqn,": the file's and the caller's; NULL: none */
    char *extra_path;   /* the constants file, NULL when there is none */
    wb_st_table *extra; /* its table */
} wb__aoti_rules;

/* Parses a list "a=b,c=d" (whitespace around names ignored; empty list
 * fine) and appends it to rules->aliases. WB_EINVAL names the bad item;
 * `what` says where the list came from. */
int wb__aoti_aliases_parse(wb__aoti_rules *rules, const char *list, int from_file, const char *what,
                           wb_err *err);

/* Sets the rules from the caller's options (each may be NULL) and from the
 * constants file, if one is found (see above); caller options win over the
 * file's, and the caller's `mutated` list adds to the file's.
 * `explicit_file` must exist when given. `package_root` is the unpacked
 * package or the package directory (NULL for a bare library). */
int wb__aoti_rules_init(wb__aoti_rules *rules, const char *aliases, const char *strip_prefix,
                        const char *prefix, const char *mutated, const char *explicit_file,
                        const char *package_root, const char *model_path, wb_err *err);

/* 1 when the rules list `fqn` as written by the compiled graph. */
int wb__aoti_is_mutated(const wb__aoti_rules *rules, const char *fqn);

void wb__aoti_rules_free(wb__aoti_rules *rules);

/* The checkpoint name of a model FQN: strip_prefix removed (when the FQN
 * starts with it), then prefix added. Writes into buf; NULL if too long. */
const char *wb__aoti_map_name(const wb__aoti_rules *rules, const char *fqn, char *buf, size_t size);

/* The prefix rules as flags, for messages: " --strip-prefix a. --prefix b."
 * (each part only when set), or "". */
void wb__aoti_rules_text(const char *strip, const char *prefix, char *buf, size_t size);

/* The constants file's tensor for a model FQN (or its mapped name), or NULL. */
const wb_st_tensor *wb__aoti_extra_find(const wb__aoti_rules *rules, const char *fqn,
                                        const char *mapped);

/* Reads a tensor of the constants file into a new malloc'd buffer. */
int wb__aoti_extra_read(const wb__aoti_rules *rules, const wb_st_tensor *t, void **out,
                        wb_err *err);

#endif
