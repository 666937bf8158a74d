/* Every log call site's format, read from the sources: each must be one the
 * logger reads as intended (wb__log_format_check), so that a new call site
 * cannot silently turn into JSON fields of the wrong type or none; and a
 * key keeps one JSON type across the broker's events (pid excepted, see
 * below). The sources are $WB_SOURCE_DIR's broker/, client/, common/,
 * tools/ and examples/. */
#include "log.h"

#include <check.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The logging calls and which argument is the format. wb_warn_peer
 * (broker/ratelog.h) appends " suppressed=%llu" to its format when it
 * withheld lines. */
static const struct {
    const char *name;
    int ev_arg, fmt_arg;
    const char *suffix;
} callers[] = {
    {"wb_debug", 0, 1, NULL},   {"wb_info", 0, 1, NULL},
    {"wb_warn", 0, 1, NULL},    {"wb_error", 0, 1, NULL},
    {"wb__cinfo", 0, 1, NULL},  {"wb__cwarn", 0, 1, NULL},
    {"wb__cerror", 0, 1, NULL}, {"wb__clog", 1, 2, NULL},
    {"wb__log", 1, 2, NULL},    {"wb_warn_peer", 0, 2, " suppressed=%llu"},
};

typedef struct site {
    char where[1100];
    char event[64];
    char fmt[2048];
    const char *suffix;
} site;

static site *sites;
static size_t n_sites, cap_sites;
static char problems[65536];
static size_t n_problems;

static void complain(const char *where, const char *what)
{
    size_t used = strlen(problems);
    snprintf(problems + used, sizeof problems - used, "%s: %s\n", where, what);
    n_problems++;
}

static int ident_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* Skips a comment, string or character literal at s[i], if one starts
 * there; returns the index after it, or i. */
static size_t skip_lexeme(const char *s, size_t n, size_t i)
{
    if (s[i] == '/' && i + 1 < n && s[i + 1] == '/') {
        while (i < n && s[i] != '\n')
            i++;
        return i;
    }
    if (s[i] == '/' && i + 1 < n && s[i + 1] == '*') {
        const char *e = strstr(s + i + 2, "*/");
        return e ? (size_t)(e - s) + 2 : n;
    }
    if (s[i] == '"' || s[i] == '\'') {
        char q = s[i++];
        while (i < n && s[i] != q)
            i += s[i] == '\\' ? 2 : 1;
        return i < n ? i + 1 : n;
    }
    return i;
}

/* Decodes the string literal at s[i] (s[i] == '"') onto out; returns the
 * index after it. */
static size_t decode_literal(const char *s, size_t i, char *out, size_t size, size_t *o)
{
    i++;
    while (s[i] && s[i] != '"') {
        char c = s[i++];
        if (c == '\\') {
            char e = s[i++];
            switch (e) {
            case 'n':
                c = '\n';
                break;
            case 't':
                c = '\t';
                break;
            case 'r':
                c = '\r';
                break;
            case '0':
                c = '\0';
                break;
            case 'x': {
                unsigned v = 0;
                while ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') ||
                       (s[i] >= 'A' && s[i] <= 'F')) {
                    char h = s[i++];
                    v = v * 16 + (unsigned)(h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
                }
                c = (char)v;
                break;
            }
            default:
                c = e; /* \" \\ \' \? */
                break;
            }
        }
        if (*o + 1 < size)
            out[(*o)++] = c;
    }
    out[*o] = '\0';
    return s[i] ? i + 1 : i;
}

/* The format argument s[a..b): string literals only (adjacent ones are one
 * string), with space and comments between. 0, or -1 when it holds
 * anything else (a name: a macro's parameter, PRIu64). */
static int literal_arg(const char *s, size_t a, size_t b, char *out, size_t size)
{
    size_t o = 0, i = a;
    int any = 0;
    out[0] = '\0';
    while (i < b) {
        if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\\') {
            i++;
        } else if (s[i] == '"') {
            i = decode_literal(s, i, out, size, &o);
            any = 1;
        } else if (s[i] == '/' && (s[i + 1] == '/' || s[i + 1] == '*')) {
            i = skip_lexeme(s, b, i);
        } else {
            return -1;
        }
    }
    return any ? 0 : -1;
}

/* 1 when the line holding s[i] is a preprocessor directive (with its
 * continuation lines): a macro's body, not a call site. */
static int in_directive(const char *s, size_t i)
{
    size_t start = i;
    for (;;) {
        while (start > 0 && s[start - 1] != '\n')
            start--;
        /* The line before ends in a backslash: this one continues it. */
        if (start >= 2 && s[start - 2] == '\\') {
            start--;
            continue;
        }
        break;
    }
    while (s[start] == ' ' || s[start] == '\t')
        start++;
    return s[start] == '#';
}

static void scan_file(const char *path, const char *rel)
{
    FILE *fp = fopen(path, "rb");
    ck_assert_msg(fp != NULL, "cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    rewind(fp);
    char *s = calloc(1, (size_t)len + 2);
    ck_assert_ptr_nonnull(s);
    ck_assert_uint_eq(fread(s, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    size_t n = (size_t)len;
    int line = 1;
    for (size_t i = 0; i < n;) {
        size_t j = skip_lexeme(s, n, i);
        if (j != i) {
            for (size_t k = i; k < j; k++)
                line += s[k] == '\n';
            i = j;
            continue;
        }
        if (s[i] == '\n')
            line++;
        if (!ident_char(s[i]) || (i > 0 && ident_char(s[i - 1]))) {
            i++;
            continue;
        }
        size_t e = i;
        while (e < n && ident_char(s[e]))
            e++;
        int which = -1;
        for (size_t c = 0; c < sizeof callers / sizeof callers[0]; c++) {
            if (strlen(callers[c].name) == e - i && memcmp(callers[c].name, s + i, e - i) == 0)
                which = (int)c;
        }
        size_t p = e;
        while (p < n && (s[p] == ' ' || s[p] == '\t' || s[p] == '\n'))
            p++;
        if (which < 0 || p >= n || s[p] != '(') {
            i = e;
            continue;
        }
        /* The arguments' boundaries, at depth 1. */
        size_t bounds[16], nb = 0;
        int depth = 0;
        size_t q = p;
        bounds[nb++] = p + 1;
        for (; q < n; q++) {
            size_t sk = skip_lexeme(s, n, q);
            if (sk != q) {
                q = sk - 1;
                continue;
            }
            if (s[q] == '(' || s[q] == '[' || s[q] == '{')
                depth++;
            else if (s[q] == ')' || s[q] == ']' || s[q] == '}') {
                if (--depth == 0)
                    break;
            } else if (s[q] == ',' && depth == 1 && nb < 15) {
                bounds[nb++] = q + 1;
            }
        }
        bounds[nb] = q + 1; /* one past the ')' */
        site st = {.suffix = callers[which].suffix};
        snprintf(st.where, sizeof st.where, "%s:%d", rel, line);
        int fa = callers[which].fmt_arg, ea = callers[which].ev_arg;
        if (nb > (size_t)fa &&
            literal_arg(s, bounds[fa], bounds[fa + 1] - 1, st.fmt, sizeof st.fmt) == 0) {
            if (literal_arg(s, bounds[ea], bounds[ea + 1] - 1, st.event, sizeof st.event) != 0)
                snprintf(st.event, sizeof st.event, "?");
            if (n_sites == cap_sites) {
                cap_sites = cap_sites ? 2 * cap_sites : 128;
                sites = realloc(sites, cap_sites * sizeof *sites);
                ck_assert_ptr_nonnull(sites);
            }
            sites[n_sites++] = st;
        } else if (!in_directive(s, i) &&
                   !(nb > (size_t)fa &&
                     memmem(s + bounds[fa], bounds[fa + 1] - bounds[fa], "char", 4))) {
            /* Neither a macro's body nor the function's own declaration. */
            complain(st.where, "the format is not a string literal");
        }
        i = e;
    }
    free(s);
}

static void scan_dir(const char *root, const char *rel)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    DIR *d = opendir(path);
    ck_assert_msg(d != NULL, "cannot open %s", path);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char sub[1024], full[2048];
        snprintf(sub, sizeof sub, "%s/%s", rel, de->d_name);
        snprintf(full, sizeof full, "%s/%s", root, sub);
        struct stat stt;
        if (stat(full, &stt) != 0)
            continue;
        size_t len = strlen(de->d_name);
        if (S_ISDIR(stt.st_mode))
            scan_dir(root, sub);
        else if (len > 2 && (strcmp(de->d_name + len - 2, ".c") == 0 ||
                             strcmp(de->d_name + len - 2, ".h") == 0))
            scan_file(full, sub);
    }
    closedir(d);
}

/* Reads every call site afresh (the tests may share a process). */
static void scan_tree(void)
{
    n_sites = 0;
    n_problems = 0;
    problems[0] = '\0';
    const char *root = getenv("WB_SOURCE_DIR");
    ck_assert_msg(root != NULL, "WB_SOURCE_DIR is not set");
    static const char *const dirs[] = {"broker", "client", "common", "tools", "examples"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        scan_dir(root, dirs[i]);
}

static const site *find(const char *event, const char *fmt_part)
{
    for (size_t i = 0; i < n_sites; i++) {
        if (strcmp(sites[i].event, event) == 0 && strstr(sites[i].fmt, fmt_part))
            return &sites[i];
    }
    return NULL;
}

START_TEST(every_format_parses)
{
    scan_tree();
    /* The scan finds what it should: the tree's 95 call sites or so,
     * wb_warn_peer's and libwbclient's among them. */
    ck_assert_uint_gt(n_sites, 80);
    ck_assert_ptr_nonnull(find("model_ready", "bytes=%llu"));
    ck_assert_ptr_nonnull(find("client_destroy_busy_lease", "lease=%.8s"));
    ck_assert_ptr_nonnull(find("model_load_start", "uid=%u%s"));
    const site *peer = NULL;
    for (size_t i = 0; i < n_sites; i++)
        peer = sites[i].suffix ? &sites[i] : peer;
    ck_assert_ptr_nonnull(peer);
    for (size_t i = 0; i < n_sites; i++) {
        char why[256], what[2600], fmt[2100];
        snprintf(fmt, sizeof fmt, "%s%s", sites[i].fmt, sites[i].suffix ? sites[i].suffix : "");
        for (int pass = 0; pass < (sites[i].suffix ? 2 : 1); pass++) {
            if (wb__log_format_check(pass ? fmt : sites[i].fmt, NULL, why, sizeof why) != 0) {
                snprintf(what, sizeof what, "event %s: %s in \"%s\"", sites[i].event, why,
                         pass ? fmt : sites[i].fmt);
                complain(sites[i].where, what);
            }
        }
    }
    ck_assert_msg(n_problems == 0, "%zu call sites the logger cannot read as intended:\n%s",
                  n_problems, problems);
}
END_TEST

/* A key's JSON type, as readers see it. */
static const char *kind(const wb_log_field *f)
{
    switch (f->type) {
    case WB_LOG_INT:
    case WB_LOG_UINT:
        return "integer";
    case WB_LOG_REAL:
        return "real";
    default:
        return "string";
    }
}

/* pid is a number where it is a pid, and a string where it may name a
 * session (wb__peer_name: conn:N, for a peer whose pid is hidden):
 * lease_grant, lease_reclaim, model_load_cancelled, fd_channel_closed. */
static const char *const mixed_ok[] = {"pid"};

START_TEST(keys_keep_one_type)
{
    scan_tree();
    typedef struct seen {
        char key[64];
        const char *kind;
        const char *where;
    } seen;
    static seen keys[1024];
    size_t n_keys = 0;
    for (size_t i = 0; i < n_sites; i++) {
        /* libwbclient's lines are text only: its host gets them as text. */
        if (strncmp(sites[i].where, "client/", 7) == 0)
            continue;
        wb_log_fields f;
        if (wb__log_format_check(sites[i].fmt, &f, NULL, 0) != 0)
            continue; /* every_format_parses says why */
        for (unsigned k = 0; k < f.n; k++) {
            if (!f.f[k].key)
                continue;
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)f.f[k].klen, f.f[k].key);
            size_t j = 0;
            while (j < n_keys && strcmp(keys[j].key, key) != 0)
                j++;
            if (j == n_keys) {
                ck_assert_uint_lt(n_keys, sizeof keys / sizeof keys[0]);
                snprintf(keys[n_keys].key, sizeof keys[n_keys].key, "%s", key);
                keys[n_keys].kind = kind(&f.f[k]);
                keys[n_keys].where = sites[i].where;
                n_keys++;
                continue;
            }
            int ok = strcmp(keys[j].kind, kind(&f.f[k])) == 0;
            for (size_t m = 0; m < sizeof mixed_ok / sizeof mixed_ok[0]; m++)
                ok |= strcmp(key, mixed_ok[m]) == 0;
            if (!ok) {
                char what[2400];
                snprintf(what, sizeof what, "key %s: JSON %s here, %s at %s", key, kind(&f.f[k]),
                         keys[j].kind, keys[j].where);
                complain(sites[i].where, what);
            }
        }
    }
    ck_assert_uint_gt(n_keys, 50);
    ck_assert_msg(n_problems == 0, "%zu fields change type between events:\n%s", n_problems,
                  problems);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("log_sites");
    TCase *tc = tcase_create("log_sites");
    tcase_add_test(tc, every_format_parses);
    tcase_add_test(tc, keys_keep_one_type);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
