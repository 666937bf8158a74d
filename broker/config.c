#include "config.h"

#include "alloc.h"
#include "models.h"
#include "names.h"

#include <errno.h>
#include <ini.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The longest line accepted (without its newline). Debian's inih can be told
 * to grow its buffer; a stock inih splits lines longer than INI_MAX_LINE - 3,
 * so those are refused rather than misread. */
#ifdef WB_HAVE_INIH_OPTIONS
#define LINE_MAX_CHARS 8192
#else
#define LINE_MAX_CHARS (INI_MAX_LINE - 3)
#endif

enum section_kind { SECTION_NONE, SECTION_BROKER, SECTION_MODEL };

/* A key already seen in the current section, to refuse it twice. */
typedef struct seen_key {
    char *name;
    int line;
} seen_key;

typedef struct parser {
    const char *file;
    FILE *f;
    const struct option *opts;
    const char *const *exclude;
    /* The physical line being handed to inih, and how much of it is gone. */
    char *line;
    size_t cap;
    size_t len;
    size_t off;
    int lineno;
    /* The first error; once set, everything else is ignored. */
    int rc;
    wb_err *err;
    /* The current section. */
    enum section_kind kind;
    int section_line;
    char model[256];
    char *model_path;
    char *model_device;
    int device_line;
    int path_line;
    seen_key *seen;
    size_t n_seen;
    /* Sections met so far ("broker", "model NAME"), to refuse duplicates. */
    seen_key *sections;
    size_t n_sections;
    /* The output. */
    char **args;
    int *lines;
    int n_args;
    int cap_args;
} parser;

/* Records the first error, prefixed with "FILE:LINE: ". */
__attribute__((format(printf, 4, 5))) static int fail_code(parser *p, int code, int line,
                                                           const char *fmt, ...)
{
    if (p->rc != WB_OK)
        return p->rc;
    char where[1100];
    snprintf(where, sizeof where, "%s:%d", p->file, line);
    va_list ap;
    va_start(ap, fmt);
    wb__err_vsetp(p->err, code, where, fmt, ap);
    va_end(ap);
    p->rc = code;
    return p->rc;
}

#define fail_at(p, line, ...) fail_code(p, WB_EINVAL, line, __VA_ARGS__)

static int out_of_memory(parser *p)
{
    if (p->rc == WB_OK)
        p->rc = wb__err_set(p->err, WB_ENOMEM, "%s: out of memory", p->file);
    return p->rc;
}

static int add_arg(parser *p, char *arg, int line)
{
    if (!arg)
        return out_of_memory(p);
    if (p->n_args == p->cap_args) {
        int cap = p->cap_args ? p->cap_args * 2 : 16;
        char **args = wb__realloc(p->args, (size_t)cap * sizeof *args);
        if (!args) {
            free(arg);
            return out_of_memory(p);
        }
        p->args = args;
        int *lines = wb__realloc(p->lines, (size_t)cap * sizeof *lines);
        if (!lines) {
            free(arg);
            return out_of_memory(p);
        }
        p->lines = lines;
        p->cap_args = cap;
    }
    p->args[p->n_args] = arg;
    p->lines[p->n_args] = line;
    p->n_args++;
    return WB_OK;
}

__attribute__((format(printf, 1, 2))) static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (wb__vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

static void forget_keys(parser *p)
{
    for (size_t i = 0; i < p->n_seen; i++)
        free(p->seen[i].name);
    p->n_seen = 0;
}

/* Records `name`, seen on the current line, in a list. Returns 0 the first
 * time; a repeat fails the parse as "WHAT (first on line N)", as does
 * running out of memory, and returns -1. */
static int first_time(parser *p, seen_key **list, size_t *n, const char *name, const char *what)
{
    for (size_t i = 0; i < *n; i++) {
        if (strcmp((*list)[i].name, name) == 0) {
            fail_at(p, p->lineno, "%s (first on line %d)", what, (*list)[i].line);
            return -1;
        }
    }
    seen_key *grown = wb__realloc(*list, (*n + 1) * sizeof **list);
    if (grown)
        *list = grown;
    if (!grown || !(grown[*n].name = wb__strdup(name))) {
        out_of_memory(p);
        return -1;
    }
    grown[*n].line = p->lineno;
    (*n)++;
    return 0;
}

int wb__config_parse_model(const char *value, wb_model_arg *out, wb_err *err)
{
    out->name[0] = '\0';
    out->device = -1;
    out->path = NULL;
    out->path_len = 0;
    out->placement = NULL;
    out->placement_len = 0;
    memset(&out->where, 0, sizeof out->where);
    const char *eq = value ? strchr(value, '=') : NULL;
    if (!eq || eq == value || !eq[1])
        return wb__err_set(err, WB_EINVAL,
                           "'%s' is not NAME=PATH, NAME=PATH@DEVICES or NAME@DEVICES=PATH",
                           value ? value : "");
    const char *at = memchr(value, '@', (size_t)(eq - value));
    size_t name_len = (size_t)((at ? at : eq) - value);
    if (name_len >= sizeof out->name)
        name_len = sizeof out->name - 1;
    memcpy(out->name, value, name_len);
    out->name[name_len] = '\0';
    if (!wb__model_name_valid(out->name))
        return wb__err_set(err, WB_EINVAL,
                           "model name '%s' is not 1 to 255 characters of A-Z a-z 0-9 . _ -",
                           out->name);
    out->path = eq + 1;
    out->path_len = strlen(out->path);
    /* NAME@DEVICES=PATH, or NAME=PATH@DEVICES: the last '@' of the path
     * starts the placement (a path with an '@' of its own needs one). */
    const char *pat = strrchr(out->path, '@');
    if (at && pat)
        return wb__err_set(err, WB_EINVAL, "model '%s' has two placements ('@%.*s' and '%s')",
                           out->name, (int)(eq - at - 1), at + 1, pat);
    if (at) {
        out->placement = at + 1;
        out->placement_len = (size_t)(eq - at - 1);
    } else if (pat) {
        out->placement = pat + 1;
        out->placement_len = strlen(pat + 1);
        out->path_len = (size_t)(pat - out->path);
        if (out->path_len == 0)
            return wb__err_set(err, WB_EINVAL, "model '%s' has no path before '%s'", out->name,
                               pat);
    }
    if (out->placement) {
        wb_err perr;
        if (wb__placement_parse(out->placement, out->placement_len, &out->where, &perr) != WB_OK)
            return wb__err_set(err, WB_EINVAL, "model '%s': %s", out->name, perr.msg);
        if (!out->where.all && out->where.n == 1 && out->where.items[0].index >= 0)
            out->device = out->where.items[0].index;
    }
    return WB_OK;
}

/* Ends the current section: a model section becomes one --model argument. */
static int end_section(parser *p)
{
    if (p->rc == WB_OK && p->kind == SECTION_MODEL) {
        if (!p->model_path) {
            fail_at(p, p->section_line, "[model %s] has no 'path'", p->model);
        } else {
            char *arg = p->model_device ? str_printf("--model=%s@%s=%s", p->model, p->model_device,
                                                     p->model_path)
                                        : str_printf("--model=%s=%s", p->model, p->model_path);
            wb_model_arg m;
            wb_err e;
            if (arg && wb__config_parse_model(arg + strlen("--model="), &m, &e) != WB_OK)
                fail_at(p, p->model_device ? p->device_line : p->section_line, "%s", e.msg);
            else
                add_arg(p, arg, p->path_line);
            if (p->rc != WB_OK)
                free(arg);
        }
    }
    free(p->model_path);
    free(p->model_device);
    p->model_path = p->model_device = NULL;
    p->model[0] = '\0';
    forget_keys(p);
    return p->rc;
}

static int is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f' || c == '\v';
}

/* Starts the section named by a "[...]" line (already checked to have its
 * ']'): [broker] or [model NAME]. */
static void begin_section(parser *p, const char *name, size_t len)
{
    if (end_section(p) != WB_OK)
        return;
    while (len && is_space(name[0])) {
        name++;
        len--;
    }
    while (len && is_space(name[len - 1]))
        len--;
    char key[300];
    if (len == 6 && memcmp(name, "broker", 6) == 0) {
        p->kind = SECTION_BROKER;
        snprintf(key, sizeof key, "broker");
    } else if (len > 5 && memcmp(name, "model", 5) == 0 && is_space(name[5])) {
        const char *n = name + 5;
        size_t nl = len - 5;
        while (nl && is_space(n[0])) {
            n++;
            nl--;
        }
        if (nl == 0 || nl >= sizeof p->model) {
            fail_at(p, p->lineno, "section [%.*s] does not name a model of 1 to 255 characters",
                    (int)len, name);
            return;
        }
        memcpy(p->model, n, nl);
        p->model[nl] = '\0';
        if (!wb__model_name_valid(p->model)) {
            fail_at(p, p->lineno, "model name '%s' is not 1 to 255 characters of A-Z a-z 0-9 . _ -",
                    p->model);
            return;
        }
        p->kind = SECTION_MODEL;
        snprintf(key, sizeof key, "model %s", p->model);
    } else {
        fail_at(p, p->lineno, "unknown section [%.*s]; expected [broker] or [model NAME]",
                (int)(len > 200 ? 200 : len), name);
        return;
    }
    char what[WB_ERR_MSG_MAX];
    snprintf(what, sizeof what, "section [%s] appears twice", key);
    if (first_time(p, &p->sections, &p->n_sections, key, what) != 0)
        return;
    p->section_line = p->lineno;
}

/* Looks at a new physical line before inih does: section headers (so that
 * sections without keys are checked, and names longer than inih keeps are
 * seen whole) and lines that are not INI at all, so that every error comes
 * with the right line number. */
static void check_line(parser *p)
{
    const char *s = p->line;
    size_t n = p->len;
    if (p->lineno == 1 && n >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0) {
        s += 3;
        n -= 3;
    }
    while (n && is_space(*s)) {
        s++;
        n--;
    }
    while (n && is_space(s[n - 1]))
        n--;
    if (n == 0 || *s == '#' || *s == ';')
        return;
    if (*s == '[') {
        const char *close = memchr(s, ']', n);
        if (!close) {
            fail_code(p, WB_EFORMAT, p->lineno, "section header without its closing ']'");
            return;
        }
        for (const char *t = close + 1; t < s + n; t++) {
            if (is_space(*t))
                continue;
            if (*t == ';' || *t == '#')
                break;
            fail_code(p, WB_EFORMAT, p->lineno, "unexpected text after the section header");
            return;
        }
        begin_section(p, s + 1, (size_t)(close - s - 1));
        return;
    }
    if (!memchr(s, '=', n) && !memchr(s, ':', n)) {
        fail_code(p, WB_EFORMAT, p->lineno,
                  "expected 'key = value', '[section]' or a comment, not '%.*s'",
                  (int)(n > 80 ? 80 : n), s);
        return;
    }
    if (memchr(s, '\0', n))
        fail_code(p, WB_EFORMAT, p->lineno, "the line contains a NUL byte");
}

/* Cuts the line's comment: a '#' or ';' at the start of the line or after
 * a space or tab ("key = value  # why"). Either character elsewhere is
 * part of the value, so that "path = /models/run#3" keeps its '#'. inih
 * knows only ';' after a value (and keeps it where the value starts with
 * it); cut here, both work the same in any build of inih. */
static void cut_comment(parser *p)
{
    for (size_t i = 0; i < p->len; i++) {
        char c = p->line[i];
        if ((c == '#' || c == ';') && (i == 0 || p->line[i - 1] == ' ' || p->line[i - 1] == '\t')) {
            p->line[i] = '\n';
            p->line[i + 1] = '\0';
            p->len = i + 1;
            return;
        }
    }
}

/* inih's fgets-like reader. It hands out one physical line at a time (in
 * pieces when inih's buffer is smaller) and counts lines, so that the
 * handler knows which line a key is on. Returning NULL ends the parse, which
 * is how the first error stops it. */
static char *reader(char *str, int num, void *stream)
{
    parser *p = stream;
    if (p->rc != WB_OK || num < 2)
        return NULL;
    if (p->off == p->len) {
        ssize_t got = getline(&p->line, &p->cap, p->f);
        if (got <= 0)
            return NULL;
        p->len = (size_t)got;
        p->off = 0;
        p->lineno++;
        size_t body = p->len;
        while (body && (p->line[body - 1] == '\n' || p->line[body - 1] == '\r'))
            body--;
        if (body > LINE_MAX_CHARS) {
            fail_code(p, WB_EFORMAT, p->lineno,
                      "the line has %zu characters, at most %d are allowed", body, LINE_MAX_CHARS);
            return NULL;
        }
        cut_comment(p);
        check_line(p);
        if (p->rc != WB_OK)
            return NULL;
    }
    size_t take = p->len - p->off;
    if (take > (size_t)num - 1)
        take = (size_t)num - 1;
    memcpy(str, p->line + p->off, take);
    str[take] = '\0';
    p->off += take;
    return str;
}

static int excluded(const parser *p, const char *name)
{
    for (const char *const *e = p->exclude; e && *e; e++) {
        if (strcmp(*e, name) == 0)
            return 1;
    }
    return 0;
}

static void unknown_key(parser *p, const char *key, const char *section)
{
    const char *best = NULL;
    size_t best_d = 3;
    if (p->kind == SECTION_BROKER) {
        for (const struct option *o = p->opts; o && o->name; o++) {
            if (excluded(p, o->name) || strcmp(o->name, "model") == 0)
                continue;
            size_t d = wb__names_distance(key, o->name);
            if (d < best_d) {
                best_d = d;
                best = o->name;
            }
        }
    } else {
        static const char *const model_keys[] = {"path", "device", "devices"};
        for (size_t i = 0; i < 3; i++) {
            size_t d = wb__names_distance(key, model_keys[i]);
            if (d < best_d) {
                best_d = d;
                best = model_keys[i];
            }
        }
    }
    if (best)
        fail_at(p, p->lineno, "unknown key '%s' in [%s] (did you mean '%s'?)", key, section, best);
    else
        fail_at(p, p->lineno, "unknown key '%s' in [%s]", key, section);
}

/* Values of options that take no argument: a boolean. */
static int parse_bool(const char *v)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0)
            return 1;
        if (strcasecmp(v, no[i]) == 0)
            return 0;
    }
    return -1;
}

static void broker_key(parser *p, const char *name, const char *value)
{
    char key[64];
    size_t n = strlen(name);
    if (n >= sizeof key) {
        fail_at(p, p->lineno, "unknown key '%.60s...' in [broker]", name);
        return;
    }
    for (size_t i = 0; i <= n; i++)
        key[i] = name[i] == '_' ? '-' : name[i];
    if (strcmp(key, "model") == 0) {
        fail_at(p, p->lineno,
                "models are not set in [broker]: give each one a [model NAME] "
                "section with 'path = ...'");
        return;
    }
    const struct option *opt = NULL;
    for (const struct option *o = p->opts; o && o->name; o++) {
        if (strcmp(o->name, key) == 0) {
            opt = o;
            break;
        }
    }
    if (opt && excluded(p, key)) {
        fail_at(p, p->lineno,
                "'%s' cannot be set in a configuration file, only on the command "
                "line",
                key);
        return;
    }
    if (!opt) {
        unknown_key(p, name, "broker");
        return;
    }
    char what[WB_ERR_MSG_MAX];
    snprintf(what, sizeof what, "key '%s' is set twice in [broker]", key);
    if (first_time(p, &p->seen, &p->n_seen, key, what) != 0)
        return;
    if (opt->has_arg == no_argument) {
        int on = parse_bool(value);
        if (on < 0)
            fail_at(p, p->lineno, "%s: '%s' is not true or false", key, value);
        else if (on)
            add_arg(p, str_printf("--%s", key), p->lineno);
        return;
    }
    add_arg(p, str_printf("--%s=%s", key, value), p->lineno);
}

static void model_key(parser *p, const char *name, const char *value)
{
    char section[300];
    snprintf(section, sizeof section, "model %s", p->model);
    char **slot;
    if (strcmp(name, "path") == 0) {
        slot = &p->model_path;
        p->path_line = p->lineno;
    } else if (strcmp(name, "device") == 0 || strcmp(name, "devices") == 0) {
        /* One key under two spellings: "device = 0", "devices = 0,1". */
        if (p->model_device) {
            fail_at(p, p->lineno, "[model %s] sets its devices twice", p->model);
            return;
        }
        slot = &p->model_device;
        p->device_line = p->lineno;
    } else {
        unknown_key(p, name, section);
        return;
    }
    char what[WB_ERR_MSG_MAX];
    snprintf(what, sizeof what, "key '%s' is set twice in [%s]", name, section);
    if (first_time(p, &p->seen, &p->n_seen, name, what) != 0)
        return;
    if (!value[0]) {
        fail_at(p, p->lineno, "'%s' of [%s] is empty", name, section);
        return;
    }
    if (!(*slot = wb__strdup(value)))
        out_of_memory(p);
}

static int handler(void *user, const char *section, const char *name, const char *value)
{
    (void)section; /* inih truncates long names; the reader tracks sections itself */
    parser *p = user;
    if (p->rc != WB_OK)
        return 1;
    switch (p->kind) {
    case SECTION_NONE:
        fail_at(p, p->lineno, "key '%s' comes before any section; put it under [broker]", name);
        break;
    case SECTION_BROKER:
        broker_key(p, name, value);
        break;
    case SECTION_MODEL:
        model_key(p, name, value);
        break;
    }
    return 1;
}

static void parser_free(parser *p)
{
    free(p->line);
    free(p->model_path);
    free(p->model_device);
    forget_keys(p);
    free(p->seen);
    for (size_t i = 0; i < p->n_sections; i++)
        free(p->sections[i].name);
    free(p->sections);
    for (int i = 0; i < p->n_args; i++)
        free(p->args[i]);
    free(p->args);
    free(p->lines);
}

int wb__config_load(const char *file, const struct option *opts, const char *const *exclude,
                    wb_config *cfg, wb_err *err)
{
    memset(cfg, 0, sizeof *cfg);
    parser p = {.file = file, .opts = opts, .exclude = exclude, .err = err, .rc = WB_OK};
    p.f = fopen(file, "re");
    if (!p.f) {
        int e = errno;
        return wb__err_errno(err, e == ENOENT ? WB_ENOTFOUND : WB_EIO, e,
                             "%s: cannot open the configuration file", file);
    }
#ifdef WB_HAVE_INIH_OPTIONS
    /* Debian's inih reads its limits from variables: let it grow its line
     * buffer to our own limit, and treat indented lines as ordinary ones
     * rather than continuations of the previous value. */
    ini_use_stack = false;
    ini_allow_realloc = true;
    ini_max_line = LINE_MAX_CHARS + 3;
    ini_allow_multiline = false;
#endif
    int rc = ini_parse_stream(reader, &p, handler, &p);
    if (p.rc == WB_OK && ferror(p.f))
        wb__err_errno(err, p.rc = WB_EIO, errno, "%s: read error", file);
    if (p.rc == WB_OK && rc > 0) {
        /* The reader checks every line; this is inih's own verdict on one it
         * let through. */
        p.rc = wb__err_set(err, WB_EFORMAT, "%s:%d: not a valid INI line", file, rc);
    } else if (p.rc == WB_OK && rc < 0) {
        p.rc = wb__err_set(err, WB_ENOMEM, "%s: out of memory", file);
    }
    end_section(&p);
    fclose(p.f);
    if (p.rc != WB_OK) {
        parser_free(&p);
        return p.rc;
    }
    cfg->file = wb__strdup(file);
    if (!cfg->file) {
        parser_free(&p);
        return wb__err_set(err, WB_ENOMEM, "%s: out of memory", file);
    }
    cfg->args = p.args;
    cfg->lines = p.lines;
    cfg->n_args = p.n_args;
    p.args = NULL;
    p.lines = NULL;
    p.n_args = 0;
    parser_free(&p);
    return WB_OK;
}

void wb__config_free(wb_config *cfg)
{
    if (!cfg)
        return;
    for (int i = 0; i < cfg->n_args; i++)
        free(cfg->args[i]);
    free(cfg->args);
    free(cfg->lines);
    free(cfg->file);
    memset(cfg, 0, sizeof *cfg);
}
