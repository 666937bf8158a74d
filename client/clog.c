/* libwbclient's log handler. A library must not print on its host's stderr:
 * without a handler nothing is written, unless $WB_CLIENT_LOG names a level
 * (debug, info, warn, error), which sends lines at that level and above to
 * stderr for someone debugging a worker they cannot rebuild. */
#include "clog.h"

#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The handler, its userdata and the level change together, so they share a
 * lock; the handler is called outside it, so that a slow handler holds up
 * only its own thread. */
static pthread_mutex_t clog_mu = PTHREAD_MUTEX_INITIALIZER;
static wb_log_fn clog_fn;
static void *clog_userdata;
static int clog_level = WB_LOG_INFO;
static int clog_env_checked;

/* Called with clog_mu held. */
static void check_env(void)
{
    if (clog_env_checked)
        return;
    clog_env_checked = 1;
    const char *env = getenv("WB_CLIENT_LOG");
    int lvl = env && env[0] ? wb__log_parse_level(env) : -1;
    if (lvl >= 0 && !clog_fn) {
        clog_fn = wb_log_stderr;
        clog_userdata = NULL;
        clog_level = lvl;
    }
}

WB_EXPORT void wb_set_log_handler(wb_log_fn fn, void *userdata)
{
    pthread_mutex_lock(&clog_mu);
    clog_env_checked = 1; /* the host decides from now on */
    clog_fn = fn;
    clog_userdata = userdata;
    pthread_mutex_unlock(&clog_mu);
}

WB_EXPORT void wb_set_log_level(wb_log_level level)
{
    pthread_mutex_lock(&clog_mu);
    check_env();
    clog_level = (int)level < WB_LOG_DEBUG ? WB_LOG_DEBUG
                 : level > WB_LOG_OFF      ? WB_LOG_OFF
                                           : (int)level;
    pthread_mutex_unlock(&clog_mu);
}

WB_EXPORT void wb_log_stderr(wb_log_level level, const char *line, void *userdata)
{
    (void)level;
    (void)userdata;
    size_t n = strlen(line);
    char buf[4098];
    if (n > sizeof buf - 2)
        n = sizeof buf - 2;
    memcpy(buf, line, n);
    buf[n++] = '\n';
    /* One write per line, so lines of several threads do not interleave. */
    ssize_t w = write(STDERR_FILENO, buf, n);
    (void)w;
}

void wb__clog(wb_log_level level, const char *event, const char *fmt, ...)
{
    pthread_mutex_lock(&clog_mu);
    check_env();
    wb_log_fn fn = clog_fn;
    void *ud = clog_userdata;
    int on = fn && level < WB_LOG_OFF && (int)level >= clog_level;
    pthread_mutex_unlock(&clog_mu);
    if (!on)
        return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    wb__log_format_line(line, sizeof line, "wbclient", level, event, fmt, ap);
    va_end(ap);
    fn(level, line, ud);
}
