/* wbctl load's progress bar: while the load request waits for its deferred
 * reply, a thread polls list_models on a second connection and redraws one
 * line (percent, sizes and rate in IEC units as the tables print them, ETA)
 * on stdout. Only when stdout is a terminal. */
#ifndef WBCTL_PROGRESS_H
#define WBCTL_PROGRESS_H

typedef struct wbctl_progress wbctl_progress;

/* Starts showing the progress of loading model `name` through the broker at
 * socket_path (NULL: the default). Returns NULL, showing nothing, when
 * stdout is not a terminal or the thread cannot start. */
wbctl_progress *wbctl_progress_start(const char *socket_path, const char *name);

/* Stops the thread and clears the line; NULL is fine. Sets *p to NULL. */
void wbctl_progress_stop(wbctl_progress **p);

#endif
