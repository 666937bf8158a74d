/* libwbclient's logging: lines go to the handler the host installed with
 * wb_set_log_handler (wb/client.h), never to stderr unless the host asked for
 * it ($WB_CLIENT_LOG, or wb_log_stderr as the handler). */
#ifndef WB_CLOG_H
#define WB_CLOG_H

#include "wb/client.h"

/* Formats one line (the key=value text format of common/log.h, prog=wbclient)
 * and hands it to the handler when `level` passes the threshold. Safe from
 * any thread; the handler runs on the calling thread. */
void wb__clog(wb_log_level level, const char *event, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define wb__cinfo(ev, ...)  wb__clog(WB_LOG_INFO, ev, __VA_ARGS__)
#define wb__cwarn(ev, ...)  wb__clog(WB_LOG_WARN, ev, __VA_ARGS__)
#define wb__cerror(ev, ...) wb__clog(WB_LOG_ERROR, ev, __VA_ARGS__)

#endif
