/* Log levels, shared by libwbclient's log handler (wb/client.h) and the
 * programs' own logger. */
#ifndef WB_LOG_LEVEL_H
#define WB_LOG_LEVEL_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum wb_log_level {
    WB_LOG_DEBUG = 0,
    WB_LOG_INFO = 1,
    WB_LOG_WARN = 2,
    WB_LOG_ERROR = 3,
    WB_LOG_OFF = 4,
} wb_log_level;

#ifdef __cplusplus
}
#endif

#endif
