/* Prometheus metrics over HTTP (libmicrohttpd), at /metrics on --metrics
 * ADDR:PORT, in the text exposition format 0.0.4.
 *
 * The broker's state belongs to the event loop's thread. The HTTP server
 * runs its own thread, so it never looks at that state: the loop renders the
 * whole page into a buffer (wb__metrics_tick, on changes and every 250 ms)
 * and publishes it under a mutex; each scrape copies the last page. */
#ifndef WB_BROKER_METRICS_H
#define WB_BROKER_METRICS_H

#include "broker.h"
#include "err.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

typedef struct wb_metrics wb_metrics;

/* Parses "ADDR:PORT": an IPv4 address, "[IPv6]" or a host name, and a port
 * from 0 (any free port) to 65535. When ss is not NULL, fills it (and *len)
 * with the first address found. Returns WB_OK or WB_EINVAL saying what is
 * wrong. */
int wb__metrics_parse_addr(const char *spec, struct sockaddr_storage *ss, socklen_t *len,
                           wb_err *err);

/* Binds ADDR:PORT, publishes a first page rendered from b (when not NULL),
 * then starts the HTTP thread. SIGTERM and SIGINT must
 * already be blocked (the thread inherits the mask). WB_ENOSYS when built
 * without libmicrohttpd, WB_EIO when the address cannot be bound. */
int wb__metrics_start(const char *spec, const wb_broker *b, wb_metrics **out, wb_err *err);

/* Stops the HTTP thread and frees everything; sets *m to NULL. NULL is
 * fine. */
void wb__metrics_stop(wb_metrics **m);

/* The port the server listens on (useful with port 0). */
unsigned wb__metrics_port(const wb_metrics *m);

/* Renders the page for the broker's current state into a new buffer (the
 * caller frees it). Returns NULL when out of memory. Loop thread only. */
char *wb__metrics_render(const wb_broker *b, size_t *len);

/* Replaces the published page with `text` (taken over, freed later). */
void wb__metrics_publish(wb_metrics *m, char *text, size_t len);

/* Called by the loop after each round: renders and publishes when the
 * broker changed (`changed`) and the last page is at least 20 ms old, or
 * when it is 250 ms old anyway. */
void wb__metrics_tick(wb_metrics *m, const wb_broker *b, int changed);

/* A copy of the published page (for tests); NULL when out of memory. */
char *wb__metrics_snapshot(wb_metrics *m, size_t *len);

#endif
