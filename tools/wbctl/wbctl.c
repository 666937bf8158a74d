/* wbctl: the weightbroker admin CLI. */
#include "wbctl.h"

#include "log.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The length of the valid UTF-8 sequence at s (2 to 4 bytes, no overlong
 * form, no surrogate, at most U+10FFFF), or 0; C1 controls count as
 * invalid unless allow_c1. */
static size_t utf8_seq(const unsigned char *s, int allow_c1)
{
    unsigned c = s[0];
    size_t n;
    unsigned cp;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    /* C1 controls (U+0080..U+009F): some terminals act on them. */
    if (!allow_c1 && cp >= 0x80 && cp <= 0x9f)
        return 0;
    return n;
}

static size_t utf8_len(const unsigned char *s)
{
    return utf8_seq(s, 0);
}

char *wbctl_utf8(const char *s)
{
    if (!s)
        s = "";
    char *out = malloc(3 * strlen(s) + 1);
    if (!out)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0, n;
    while (*p) {
        if (*p < 0x80) {
            out[o++] = (char)*p++;
        } else if ((n = utf8_seq(p, 1)) > 0) {
            memcpy(out + o, p, n);
            o += n;
            p += n;
        } else {
            memcpy(out + o, "\xef\xbf\xbd", 3);
            o += 3;
            p++;
        }
    }
    out[o] = '\0';
    return out;
}

char *wbctl_escape(const char *s)
{
    if (!s)
        s = "";
    size_t len = strlen(s);
    /* Every byte may become four. */
    char *out = malloc(4 * len + 1);
    if (!out)
        return NULL;
    const unsigned char *p = (const unsigned char *)s;
    size_t o = 0;
    while (*p) {
        size_t n;
        if (*p == '\\') {
            out[o++] = '\\';
            out[o++] = '\\';
            p++;
        } else if (*p >= 0x20 && *p < 0x7f) {
            out[o++] = (char)*p++;
        } else if (*p >= 0x80 && (n = utf8_len(p)) > 0) {
            memcpy(out + o, p, n);
            o += n;
            p += n;
        } else {
            o += (size_t)sprintf(out + o, "\\x%02x", *p++);
        }
    }
    out[o] = '\0';
    return out;
}

typedef int (*wbctl_cmd_fn)(const wbctl_globals *g, int argc, char **argv);

struct wbctl_cmd {
    const char *name;
    wbctl_cmd_fn fn;
    const char *summary;
};

static const struct wbctl_cmd commands[] = {
    {"models", wbctl_models, "list the broker's models"},
    {"leases", wbctl_leases, "list the leases the broker has granted"},
    {"containers", wbctl_containers, "list the AOTI model containers built on leases"},
    {"load", wbctl_load, "load a safetensors checkpoint as a model"},
    {"unload", wbctl_unload, "unload a model (it drains while leases remain)"},
    {"stats", wbctl_stats, "print the broker's counters"},
    {"inspect", wbctl_inspect, "print the tensor table of a safetensors checkpoint"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: wbctl [--socket PATH] [--timeout-ms MS] COMMAND [ARGS]\n\n"
                 "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\noptions (before the command):\n"
                 "  --socket PATH      the broker's socket (see below)\n"
                 "  --timeout-ms MS    how long to wait for each reply (default $WB_TIMEOUT_MS,\n"
                 "                     else 5000; load waits up to 10 minutes)\n"
                 "  -h, --help         print this help\n");
    fprintf(out, "\nRun 'wbctl COMMAND --help' for a command's options.\n"
                 "The socket is --socket, else $WB_SOCKET, else "
                 "$XDG_RUNTIME_DIR/wbroker/broker.sock (root: /run/wbroker/broker.sock).\n"
                 "Exit codes: 0 ok, 1 refused by the broker, 2 misuse, 65 malformed input,\n"
                 "66 missing input, 69 no broker answers.\n");
}

int main(int argc, char **argv)
{
    wbctl_globals g = {0};
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},
        {"timeout-ms", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    wb__log_set_prog("wbctl");
    wb__log_set_level(WB_LOG_WARN);
    /* "+": stop at the first non-option, the subcommand. */
    int c;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            g.socket_path = optarg;
            break;
        case 't': {
            char *end;
            long v = strtol(optarg, &end, 10);
            if (*end || v <= 0 || v > 86400000) {
                fprintf(stderr, "wbctl: --timeout-ms: expected a positive number, got '%s'\n",
                        optarg);
                return WBCTL_EXIT_USAGE;
            }
            g.timeout_ms = (int)v;
            break;
        }
        case 'h':
            usage(stdout);
            return WBCTL_EXIT_OK;
        default:
            usage(stderr);
            return WBCTL_EXIT_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return WBCTL_EXIT_USAGE;
    }
    const char *name = argv[optind];
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(name, commands[i].name) == 0) {
            int sub_argc = argc - optind;
            char **sub_argv = argv + optind;
            optind = 0; /* reset getopt for the subcommand */
            return commands[i].fn(&g, sub_argc, sub_argv);
        }
    }
    fprintf(stderr, "wbctl: unknown command '%s'\n", name);
    usage(stderr);
    return WBCTL_EXIT_USAGE;
}
