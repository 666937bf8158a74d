/* The signals wbrokerd acts on, and what it does with each. All of them are
 * blocked in every thread before any thread starts (wb__signals_block) and
 * read from a signalfd: by the event loop while the broker serves (loop.c),
 * and by a watcher thread while it starts and loads its preloads
 * (wb_signal_watch), so that a stop then cancels the load under way instead
 * of waiting for every preload to finish.
 *
 *   stop, cleanly (the socket and every slab name removed, exit status 0):
 *     SIGTERM, SIGINT, SIGQUIT, SIGXCPU (the CPU limit's warning before
 *     SIGKILL) and SIGPWR (power failing);
 *   reload the configuration file: SIGHUP;
 *   logged and ignored: SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF,
 *     SIGIO (SIGPOLL), SIGSTKFLT, SIGXFSZ (the write past the file size
 *     limit fails with EFBIG, reported as that operation's error) and the
 *     real-time signals: the broker sets no timers and asks for no
 *     notifications, so these come only from someone's kill(1).
 *
 * SIGPIPE is ignored outright (a write to a closed peer fails with EPIPE).
 * The signals that report a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT,
 * SIGTRAP, SIGSYS) keep their default: the process dumps core. */
#ifndef WB_BROKER_SIGNALS_H
#define WB_BROKER_SIGNALS_H

#include "err.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>

typedef enum wb_signal_action {
    WB_SIGNAL_NONE = 0, /* not one of the broker's */
    WB_SIGNAL_STOP,
    WB_SIGNAL_RELOAD,
    WB_SIGNAL_IGNORE,
} wb_signal_action;

/* Fills `set` with every signal above but SIGPIPE. */
void wb__signals_fill(sigset_t *set);

/* Resets their dispositions to the default (a parent may have ignored some:
 * a shell's background job ignores SIGINT and SIGQUIT, nohup SIGHUP, and an
 * ignored signal never reaches a signalfd), blocks them in the calling
 * thread, whose threads inherit the mask, and ignores SIGPIPE. Call it
 * before any thread starts. */
void wb__signals_block(void);

wb_signal_action wb__signal_action(int signo);

/* "SIGTERM", "SIGRTMIN", "SIGRTMIN+3", "SIGRTMAX", or "signal 99"; written
 * into buf when it has to be made. Returns the name. */
const char *wb__signal_name(int signo, char *buf, size_t size);

/* The watcher of the start: a thread that reads the stop and the ignored
 * signals from a signalfd until wb__signal_watch_end. A stop signal is
 * logged (event=signal action=stop while=starting), kept, and sets *cancel,
 * which the load under way polls (wb_load_opts.cancel). SIGHUP is left
 * pending: the loop reloads once it serves. */
typedef struct wb_signal_watch {
    pthread_t thread;
    int started;
    int sigfd;
    int efd; /* eventfd that ends the thread */
    atomic_int *cancel;
    atomic_int stop_signo; /* the stop signal read, 0: none */
} wb_signal_watch;

/* Starts the thread; the signals must be blocked (wb__signals_block). On
 * failure (WB_EIO) nothing runs and wb__signal_watch_end is still safe. */
int wb__signal_watch_start(wb_signal_watch *w, atomic_int *cancel, wb_err *err);

/* The stop signal read so far, 0 if none. */
int wb__signal_watch_stopping(wb_signal_watch *w);

/* Ends the thread; what it has not read stays pending for the loop's
 * signalfd. Returns the stop signal read, or 0. */
int wb__signal_watch_end(wb_signal_watch *w);

#endif
