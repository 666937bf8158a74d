/* libwbclient: the AOTI binding's error for constants bound by nothing:
 * every one named with its type, the prefix rule that would bind them (or
 * most of them) to the leases, and the fixes for the rest. */
#include "aoti_impl.h"

#include "alloc.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A growing message, for errors that name many constants. On out of memory
 * it keeps what it has and sets `oom`. */
typedef struct msgbuf {
    char *s;
    size_t len, cap;
    int oom;
} msgbuf;

__attribute__((format(printf, 2, 3))) static void mb_add(msgbuf *m, const char *fmt, ...)
{
    for (int tries = 0; tries < 2 && !m->oom; tries++) {
        va_list ap;
        va_start(ap, fmt);
        int w = vsnprintf(m->s ? m->s + m->len : NULL, m->s ? m->cap - m->len : 0, fmt, ap);
        va_end(ap);
        if (w < 0) {
            m->oom = 1;
            return;
        }
        if (m->s && m->len + (size_t)w < m->cap) {
            m->len += (size_t)w;
            return;
        }
        size_t cap = m->cap ? m->cap : 1024;
        while (cap <= m->len + (size_t)w)
            cap *= 2;
        char *n = wb__realloc(m->s, cap);
        if (!n) {
            m->oom = 1;
            return;
        }
        if (!m->s)
            n[0] = '\0';
        m->s = n;
        m->cap = cap;
    }
}

/* 1 when the leases hold a tensor called `name` that would bind constant
 * b (its dtype, and its size as size_fits judges it). */
static int lease_fits(const wb_container *c, const binding *b, const char *name)
{
    for (size_t k = 0; k < c->n_leases; k++) {
        const wb__tensor_entry *t = wb__lease_lookup(c->leases[k], name);
        if (t && wb__aoti_dtype_code(t->dtype) == b->dtype &&
            wb__aoti_size_fits(b->size, t->nbytes))
            return 1;
    }
    return 0;
}

/* A prefix rule to try for a hint: strip `strip` (when an FQN starts with
 * it), then add `prefix`. */
typedef struct rule {
    const char *strip, *prefix;
} rule;

#define MAX_CANDIDATES 12

static void add_candidate(const char **list, size_t *n, const char *p)
{
    if (!p || !p[0] || *n >= MAX_CANDIDATES)
        return;
    for (size_t i = 0; i < *n; i++) {
        if (strcmp(list[i], p) == 0)
            return;
    }
    list[(*n)++] = p;
}

/* The dotted prefixes ("a.", "a.b.", up to three) common to all n names,
 * written into store and added to the candidates. */
static void common_prefixes(const char *const *names, size_t n, char store[3][256],
                            const char **list, size_t *n_list)
{
    if (!n)
        return;
    size_t common = strlen(names[0]);
    for (size_t i = 1; i < n && common; i++) {
        size_t k = 0;
        while (k < common && names[i][k] && names[i][k] == names[0][k])
            k++;
        common = k;
    }
    size_t level = 0;
    for (size_t k = 0; k < common && level < 3; k++) {
        if (names[0][k] != '.' || k + 1 >= 256)
            continue;
        memcpy(store[level], names[0], k + 1);
        store[level][k + 1] = '\0';
        add_candidate(list, n_list, store[level]);
        level++;
    }
}

/* How many of the missing constants the rule binds to leased tensors;
 * marks them in hit[] (may be NULL). */
static size_t rule_binds(const wb_container *c, const size_t *missing, size_t n_missing, rule r,
                         char *hit)
{
    wb__aoti_rules tmp = {.strip_prefix = (char *)r.strip, .prefix = (char *)r.prefix};
    size_t count = 0;
    for (size_t i = 0; i < n_missing; i++) {
        const binding *b = &c->bind[missing[i]];
        char buf[512];
        const char *m = wb__aoti_map_name(&tmp, b->fqn, buf, sizeof buf);
        int ok = m && lease_fits(c, b, m);
        if (hit)
            hit[i] = (char)ok;
        count += (size_t)ok;
    }
    return count;
}

/* The prefix rule that binds the most missing constants to the leases:
 * strip or add a prefix common to the model's names or a lease's, a
 * wrapper's usual prefix (model., module., _orig_mod.), or the inverse of
 * the rules given. 0 when none binds any. */
static size_t best_rule(wb_container *c, const size_t *missing, size_t n_missing, rule *best,
                        char (*store)[3][256])
{
    static const char *const wrappers[] = {"model.", "module.", "_orig_mod."};
    const char *strips[MAX_CANDIDATES], *prefixes[MAX_CANDIDATES];
    size_t ns = 0, np = 0;
    add_candidate(strips, &ns, c->rules.prefix);
    add_candidate(prefixes, &np, c->rules.strip_prefix);
    for (size_t i = 0; i < sizeof wrappers / sizeof wrappers[0]; i++) {
        add_candidate(strips, &ns, wrappers[i]);
        add_candidate(prefixes, &np, wrappers[i]);
    }
    const char **names = wb__malloc((c->n_bind ? c->n_bind : 1) * sizeof *names);
    if (names) {
        size_t n = 0;
        for (size_t i = 0; i < c->n_bind; i++) {
            if (!c->bind[i].folded)
                names[n++] = c->bind[i].fqn;
        }
        common_prefixes(names, n, store[0], strips, &ns);
        free(names);
    }
    for (size_t k = 0; k < c->n_leases; k++) {
        const wb__tensor_entry *t = wb__lease_tensors(c->leases[k]);
        size_t n = c->leases[k]->n_tensors;
        const char **ln = t && n ? wb__malloc(n * sizeof *ln) : NULL;
        if (!ln)
            continue;
        for (size_t i = 0; i < n; i++)
            ln[i] = t[i].name;
        common_prefixes(ln, n, store[1 + k], prefixes, &np);
        free(ln);
    }
    /* Strip only, then add only, then both: the simplest rule wins a tie. */
    size_t top = 0;
    const char *cur_s = c->rules.strip_prefix ? c->rules.strip_prefix : "";
    const char *cur_p = c->rules.prefix ? c->rules.prefix : "";
    for (int pass = 0; pass < 3; pass++) {
        for (size_t i = 0; i < (pass == 1 ? 1 : ns); i++) {
            for (size_t j = 0; j < (pass == 0 ? 1 : np); j++) {
                rule r = {pass == 1 ? "" : strips[i], pass == 0 ? "" : prefixes[j]};
                if (strcmp(r.strip, cur_s) == 0 && strcmp(r.prefix, cur_p) == 0)
                    continue;
                size_t n = rule_binds(c, missing, n_missing, r, NULL);
                if (n > top) {
                    top = n;
                    *best = r;
                }
            }
        }
    }
    return top;
}

/* One missing constant in a list: its type, name and what was tried. */
static void add_missing(msgbuf *m, const wb_container *c, const binding *b, int first)
{
    char buf[512];
    const char *name = wb__aoti_map_name(&c->rules, b->fqn, buf, sizeof buf);
    int other = name && strcmp(name, b->fqn) != 0;
    const wb__alias *a = b->alias >= 0 ? &c->rules.aliases[b->alias] : NULL;
    mb_add(m, "%s%s '%s'", first ? "" : ", ", wb__aoti_type_name(b->type), b->fqn);
    if (other && a)
        mb_add(m, " (checkpoint name '%s', alias target '%s' not found either)", name, a->target);
    else if (other)
        mb_add(m, " (checkpoint name '%s')", name);
    else if (a)
        mb_add(m, " (alias target '%s' not found either)", a->target);
}

/* Fails the creation naming every constant bound by nothing (missing[]),
 * its type, the prefix rule that binds them, or most of them, and the fixes
 * for those it leaves. */
int wb__aoti_report_missing(wb_container *c, const size_t *missing, size_t n)
{
    /* The candidate prefixes live here until the message is written. */
    char(*store)[3][256] = wb__calloc(1 + c->n_leases, sizeof *store);
    char *hit = wb__calloc(n ? n : 1, 1);
    if (!store || !hit) {
        free(store);
        free(hit);
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    }
    rule r = {"", ""};
    size_t hits = best_rule(c, missing, n, &r, store);
    if (hits)
        rule_binds(c, missing, n, r, hit);
    /* The fixes are for the constants no rule binds. */
    size_t left_params = 0, left_others = 0;
    const binding *first_param = NULL;
    for (size_t i = 0; i < n; i++) {
        const binding *b = &c->bind[missing[i]];
        if (hit[i])
            continue;
        if (b->type == 1 && b->size > 0) {
            left_params++;
            first_param = first_param ? first_param : b;
        } else {
            left_others++;
        }
    }
    msgbuf m = {0};
    char names[300];
    wb__aoti_lease_names(c, names, sizeof names);
    mb_add(&m, "model %s: %zu %s bound by nothing (in no lease (%s), no caller tensor%s%s)",
           c->model_path, n, n == 1 ? "constant is" : "constants are",
           c->n_leases ? names : "none given",
           c->rules.extra ? " and not in the constants file " : " and no constants file",
           c->rules.extra ? c->rules.extra_path : "");
    if (hits) {
        char cur[600], with[600];
        wb__aoti_rules_text(c->rules.strip_prefix, c->rules.prefix, cur, sizeof cur);
        wb__aoti_rules_text(r.strip, r.prefix, with, sizeof with);
        if (hits == n)
            mb_add(&m, "; all %zu missing constants bind with%s", n, with);
        else
            mb_add(&m, "; with%s %zu of the %zu missing constants bind", with, hits, n);
        mb_add(&m, " (wb_container_options%s%s%s%s%s%s)", r.strip[0] ? " strip_prefix \"" : "",
               r.strip, r.strip[0] ? "\"" : "", r.prefix[0] ? " prefix \"" : "", r.prefix,
               r.prefix[0] ? "\"" : "");
        if (cur[0])
            mb_add(&m, ", in place of the rules in use (%s)", cur + 1);
        /* The ones the rule leaves come first: they need another fix. */
        if (hits < n) {
            mb_add(&m, "; the other %zu: ", n - hits);
            for (size_t i = 0, k = 0; i < n; i++) {
                if (!hit[i])
                    add_missing(&m, c, &c->bind[missing[i]], k++ == 0);
            }
            mb_add(&m, "; the %zu it binds", hits);
        }
    }
    mb_add(&m, ": ");
    for (size_t i = 0, k = 0; i < n; i++) {
        if (hit[i] || !hits)
            add_missing(&m, c, &c->bind[missing[i]], k++ == 0);
    }
    mb_add(&m, ".");
    if (left_others) {
        if (left_others == n)
            mb_add(&m, " The model library holds no data of its own for %s",
                   n == 1 ? "it" : "them");
        else if (left_others == 1)
            mb_add(&m, " The model library holds no data of its own for the buffer or tensor "
                       "constant among those");
        else
            mb_add(&m,
                   " The model library holds no data of its own for the %zu buffers or tensor "
                   "constants among those",
                   left_others);
        mb_add(&m,
               " (%s): upstream's runtime only warns, and the first run would read memory "
               "nothing has set.",
               c->own_how);
    }
    if (left_params || left_others)
        mb_add(&m,
               " Fixes: compile the model with the compile helper (python3 -m "
               "weightbroker.compile), which stores in the package the tensors no checkpoint "
               "holds and the ties and prefix rules it finds; or give those tensors in a "
               "constants file (--constants FILE, wb_container_options.constants_file) or as "
               "caller tensors (wb_container_options.tensors)%s",
               first_param ? "" : ".");
    if (first_param)
        mb_add(&m,
               "; if one is tied to another weight, give an alias (%s=<checkpoint name>) with "
               "--alias or wb_container_options.aliases.",
               first_param->fqn);
    free(hit);
    free(store);
    if (m.oom) {
        free(m.s);
        return wb__aoti_fail(c, WB_ENOMEM, "out of memory");
    }
    return wb__aoti_fail_long(c, WB_ENOTFOUND, m.s);
}
