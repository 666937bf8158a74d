#include "signals.h"

#include "log.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

typedef struct signal_entry {
    int signo;
    const char *name;
    wb_signal_action action;
} signal_entry;

static const signal_entry signals[] = {
    {SIGTERM, "SIGTERM", WB_SIGNAL_STOP},       {SIGINT, "SIGINT", WB_SIGNAL_STOP},
    {SIGQUIT, "SIGQUIT", WB_SIGNAL_STOP},       {SIGXCPU, "SIGXCPU", WB_SIGNAL_STOP},
#ifdef SIGPWR
    {SIGPWR, "SIGPWR", WB_SIGNAL_STOP},
#endif
    {SIGHUP, "SIGHUP", WB_SIGNAL_RELOAD},       {SIGUSR1, "SIGUSR1", WB_SIGNAL_IGNORE},
    {SIGUSR2, "SIGUSR2", WB_SIGNAL_IGNORE},     {SIGALRM, "SIGALRM", WB_SIGNAL_IGNORE},
    {SIGVTALRM, "SIGVTALRM", WB_SIGNAL_IGNORE}, {SIGPROF, "SIGPROF", WB_SIGNAL_IGNORE},
    {SIGIO, "SIGIO", WB_SIGNAL_IGNORE},
#ifdef SIGSTKFLT
    {SIGSTKFLT, "SIGSTKFLT", WB_SIGNAL_IGNORE},
#endif
    {SIGXFSZ, "SIGXFSZ", WB_SIGNAL_IGNORE},
};
#define N_SIGNALS (sizeof signals / sizeof signals[0])

static const signal_entry *find(int signo)
{
    for (size_t i = 0; i < N_SIGNALS; i++) {
        if (signals[i].signo == signo)
            return &signals[i];
    }
    return NULL;
}

void wb__signals_fill(sigset_t *set)
{
    sigemptyset(set);
    for (size_t i = 0; i < N_SIGNALS; i++)
        sigaddset(set, signals[i].signo);
    for (int s = SIGRTMIN; s <= SIGRTMAX; s++)
        sigaddset(set, s);
}

void wb__signals_block(void)
{
    sigset_t set;
    wb__signals_fill(&set);
    for (int s = 1; s < NSIG; s++) {
        if (sigismember(&set, s) == 1)
            signal(s, SIG_DFL);
    }
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

wb_signal_action wb__signal_action(int signo)
{
    const signal_entry *e = find(signo);
    if (e)
        return e->action;
    return signo >= SIGRTMIN && signo <= SIGRTMAX ? WB_SIGNAL_IGNORE : WB_SIGNAL_NONE;
}

const char *wb__signal_name(int signo, char *buf, size_t size)
{
    const signal_entry *e = find(signo);
    if (e)
        return e->name;
    if (signo == SIGRTMIN)
        return "SIGRTMIN";
    if (signo == SIGRTMAX)
        return "SIGRTMAX";
    if (signo > SIGRTMIN && signo < SIGRTMAX)
        snprintf(buf, size, "SIGRTMIN+%d", signo - SIGRTMIN);
    else
        snprintf(buf, size, "signal %d", signo);
    return buf;
}

static void *watch_main(void *arg)
{
    wb_signal_watch *w = arg;
    struct pollfd p[2] = {{.fd = w->sigfd, .events = POLLIN}, {.fd = w->efd, .events = POLLIN}};
    for (;;) {
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            wb_error("signal_watch", "error=\"poll: %s\"", strerror(errno));
            return NULL;
        }
        if (p[1].revents)
            return NULL;
        struct signalfd_siginfo si;
        while (read(w->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
            char buf[32];
            int signo = (int)si.ssi_signo;
            const char *name = wb__signal_name(signo, buf, sizeof buf);
            if (wb__signal_action(signo) == WB_SIGNAL_STOP) {
                wb_info("signal",
                        "signal=%s action=stop while=starting sender_pid=%u "
                        "note=\"the load under way is cancelled\"",
                        name, si.ssi_pid);
                int none = 0;
                atomic_compare_exchange_strong(&w->stop_signo, &none, signo);
                if (w->cancel)
                    atomic_store(w->cancel, 1);
            } else {
                wb_info("signal", "signal=%s action=ignored sender_pid=%u", name, si.ssi_pid);
            }
        }
    }
}

int wb__signal_watch_start(wb_signal_watch *w, atomic_int *cancel, wb_err *err)
{
    *w = (wb_signal_watch){.sigfd = -1, .efd = -1, .cancel = cancel};
    atomic_init(&w->stop_signo, 0);
    sigset_t set;
    wb__signals_fill(&set);
    /* SIGHUP stays pending for the loop: there is no running configuration
     * to reload before it serves. */
    sigdelset(&set, SIGHUP);
    w->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (w->sigfd < 0)
        return wb__err_errno(err, WB_EIO, errno, "signalfd");
    w->efd = eventfd(0, EFD_CLOEXEC);
    if (w->efd < 0) {
        int e = errno;
        close(w->sigfd);
        w->sigfd = -1;
        return wb__err_errno(err, WB_EIO, e, "eventfd");
    }
    int rc = pthread_create(&w->thread, NULL, watch_main, w);
    if (rc != 0) {
        close(w->sigfd);
        close(w->efd);
        w->sigfd = w->efd = -1;
        return wb__err_errno(err, WB_EIO, rc, "starting the signal watcher");
    }
    w->started = 1;
    return WB_OK;
}

int wb__signal_watch_stopping(wb_signal_watch *w)
{
    return atomic_load(&w->stop_signo);
}

int wb__signal_watch_end(wb_signal_watch *w)
{
    if (w->started) {
        uint64_t one = 1;
        if (write(w->efd, &one, sizeof one) != (ssize_t)sizeof one)
            wb_error("signal_watch", "error=\"eventfd write: %s\"", strerror(errno));
        pthread_join(w->thread, NULL);
        w->started = 0;
    }
    if (w->sigfd >= 0)
        close(w->sigfd);
    if (w->efd >= 0)
        close(w->efd);
    w->sigfd = w->efd = -1;
    return atomic_load(&w->stop_signo);
}
