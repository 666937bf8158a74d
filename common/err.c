#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int wb__err_vset(wb_err *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        err->code = code;
    }
    return code;
}

int wb__err_vsetp(wb_err *err, int code, const char *prefix, const char *fmt, va_list ap)
{
    if (err) {
        int n = snprintf(err->msg, sizeof err->msg, "%s: ", prefix);
        if (n >= 0 && (size_t)n < sizeof err->msg)
            vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
        err->code = code;
    }
    return code;
}

int wb__err_set(wb_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    wb__err_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int wb__err_errno(wb_err *err, int code, int errnum, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        if (n >= 0 && (size_t)n < sizeof err->msg)
            snprintf(err->msg + n, sizeof err->msg - (size_t)n, ": %s", strerror(errnum));
        err->code = code;
    }
    return code;
}

void wb__err_clear(wb_err *err)
{
    if (err) {
        err->code = WB_OK;
        err->msg[0] = '\0';
    }
}
