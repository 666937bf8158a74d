/* Detailed errors: a status code plus a message that says what was wrong and
 * where (file, tensor, field). Functions that can fail take a `wb_err *`
 * (which may be NULL) and return the same code they store in it. */
#ifndef WB_ERR_H
#define WB_ERR_H

#include "wb/status.h"

#include <stdarg.h>
#include <stddef.h>

#define WB_ERR_MSG_MAX 1024

typedef struct wb_err {
    int code;
    char msg[WB_ERR_MSG_MAX];
} wb_err;

/* Formats the message into err (if not NULL) and returns code. */
int wb__err_set(wb_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* wb__err_set for functions that take their own variable arguments: the one
 * place where a message is formatted into a wb_err. */
int wb__err_vset(wb_err *err, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Like wb__err_vset, with "PREFIX: " before the message: for messages that
 * name their file (or file:line) first. */
int wb__err_vsetp(wb_err *err, int code, const char *prefix, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* Like wb__err_set, but appends ": strerror(errnum)". */
int wb__err_errno(wb_err *err, int code, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Clears err to WB_OK with an empty message. */
void wb__err_clear(wb_err *err);

#endif
