/* Subscriptions: the models each connection asked to hear about
 * (SubscribeRequest), keyed by the connection's serial. A subscription
 * lasts as long as its connection (the loop drops them when it closes);
 * at most WB_MAX_SUBSCRIPTIONS per connection. Pure bookkeeping: who is
 * told, and how, is the broker's (wb__broker_make_current). */
#ifndef WB_BROKER_SUBS_H
#define WB_BROKER_SUBS_H

#include "err.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

typedef struct wb_sub_conn {
    uint64_t serial;
    uint32_t n;
    char *names[WB_MAX_SUBSCRIPTIONS]; /* owned */
} wb_sub_conn;

typedef struct wb_subs {
    wb_sub_conn **v; /* in serial order */
    size_t n, cap;
} wb_subs;

/* Subscribes connection `serial` to `name` (already subscribed: nothing
 * changes). WB_ELIMIT past WB_MAX_SUBSCRIPTIONS, WB_ENOMEM. */
int wb__subs_add(wb_subs *s, uint64_t serial, const char *name, wb_err *err);
/* Ends the subscription; 1 when there was one, else 0. */
int wb__subs_remove(wb_subs *s, uint64_t serial, const char *name);
/* Every subscription of a connection that closed. */
void wb__subs_drop_conn(wb_subs *s, uint64_t serial);
/* The subscriptions of connection `serial`, or NULL when it has none. */
const wb_sub_conn *wb__subs_of(const wb_subs *s, uint64_t serial);
/* Calls fn for every connection subscribed to `name`, in serial order. */
void wb__subs_each(const wb_subs *s, const char *name, void (*fn)(void *ctx, uint64_t serial),
                   void *ctx);
/* Connections with at least one subscription. */
size_t wb__subs_conns(const wb_subs *s);
void wb__subs_destroy(wb_subs *s);

#endif
