/* The broker's transport: the listening unix socket the clients' ZeroMQ
 * DEALER sockets connect to (libzmq's ipc:// is a plain SOCK_STREAM unix
 * socket) and one connection per peer. Each connection reads into its ZMTP
 * codec (zmtp.h) under the transport bounds and writes from a bounded queue;
 * a peer that breaks a bound or the protocol is disconnected. What a
 * complete request means is the caller's (on_message). */
#ifndef WB_BROKER_CONN_H
#define WB_BROKER_CONN_H

#include "broker_stats.h"
#include "err.h"
#include "peer.h"
#include "zmtp.h"

#include <stddef.h>
#include <stdint.h>

/* Gets the socket path ready for binding: creates missing parent
 * directories (mode 0750), refuses with WB_EEXIST when a broker answers on
 * the path or when the path is something other than a socket, and removes a
 * socket file that nothing answers on. */
int wb__socket_prepare(const char *path, wb_err *err);

/* Transport bounds: what peers can make the broker hold. */
typedef struct wb_loop_options {
    unsigned max_peers;            /* connections at once; more are closed at once */
    size_t max_request;            /* payload bytes of one incoming message */
    unsigned max_frames;           /* frames of one incoming message */
    size_t max_buffered;           /* bytes of unfinished messages over all connections */
    int max_queued_replies;        /* replies queued for one peer (send high-water mark) */
    size_t max_queued_bytes;       /* bytes queued for one peer (one message always fits) */
    size_t max_queued_total;       /* bytes queued for every peer together */
    unsigned max_per_process;      /* connections of one process (SO_PEERCRED pid) */
    unsigned max_per_uid;          /* connections of one uid (root and the broker's uid aside) */
    unsigned max_sessions_per_uid; /* descriptor channel sessions of one hidden-pid uid */
    unsigned handshake_ms;         /* time a connection has for greeting and READY */
} wb_loop_options;

struct outbuf;

/* The most connections of one refused uid kept at once on each socket:
 * each lives until its first request is answered or its handshake
 * deadline, whichever comes first. */
#define WB_REFUSED_PER_UID 4
/* The longest reason kept for a connection refused at accept. */
#define WB_REFUSE_MAX 512

/* One client connection: its socket, the ZMTP codec, its credentials
 * (SO_PEERCRED) and the messages waiting to be written. */
typedef struct wb_conn {
    int fd;
    uint64_t serial; /* the connection's identity for deferred replies */
    wb_zmtp z;
    size_t held; /* wb__zmtp_buffered(&z) as counted in wb_conns.buffered */
    /* Who the requests act as: the kernel's view (SO_PEERCRED), or the
     * descriptor channel session that a hello named (session != 0). */
    wb_peer_creds creds;
    wb_peer_creds kernel; /* what SO_PEERCRED said at accept */
    /* The process that connected (SO_PEERPIDFD, or pidfd_open checked at
     * accept), -1 when its pid is hidden: the connection acts as its pid
     * only while this says the process lives (wb__pidfd_exited). */
    int pidfd;
    uint64_t session; /* the bound session's connection serial, 0: none */
    /* Refused at accept (a uid on no allow list, a process already gone):
     * the first request is answered with `refusal`, undecoded, and the
     * connection closed; until then the handshake deadline holds. */
    int refused;
    char refusal[WB_REFUSE_MAX];
    int closing; /* closed once its queue is written; nothing more is read */
    struct outbuf *out_head, *out_tail;
    int queued;           /* messages in the queue */
    size_t queued_bytes;  /* their unsent bytes, counted in wb_conns.queued_bytes */
    int64_t accepted_ms;  /* when accepted, for the handshake deadline */
    uint32_t loop_events; /* what the event loop registered for fd (0: not yet) */
} wb_conn;

typedef struct wb_conns wb_conns;

/* A complete single-frame message from connection c. The connection may be
 * gone when it returns (a reply to a slow reader). */
typedef void (*wb_conn_message_fn)(void *ctx, wb_conn *c, const wb_zmtp_msg *m);

/* Judges a new connection by its kernel credentials before it is served,
 * and may complete them (its supplementary groups, read through `pidfd`:
 * the process that connected, -1 when its pid is hidden): 0 to serve it,
 * else a refusal with the reason in `why`. */
typedef int (*wb_conn_admit_fn)(void *ctx, wb_peer_creds *kernel, int pidfd, char *why,
                                size_t size);

/* Every connection, the listening socket and what they hold in all. */
struct wb_conns {
    const wb_loop_options *opt;
    wb_broker_stats *stats; /* peers_refused, peers_disconnected, malformed_messages */
    wb_conn_message_fn on_message;
    wb_conn_admit_fn admit; /* NULL: every connection is served */
    /* May be NULL: told the serial of each connection that goes, whatever
     * ended it (its subscriptions end with it). */
    void (*on_close)(void *ctx, uint64_t serial);
    void *ctx;
    uint32_t exempt_uid; /* besides root, not bound by --max-peers-per-uid */
    int lfd;             /* the listening socket, -1 before wb__conns_listen */
    int spare;           /* a descriptor kept to be freed when accept meets EMFILE */
    wb_conn **v;
    size_t n, cap;
    uint64_t next_serial;
    size_t buffered;     /* bytes held by every connection's codec */
    size_t queued_bytes; /* bytes queued for every connection */
    int64_t refused_logged_ms;
    uint64_t refused_since_log;
    int64_t timeout_logged_ms;
    uint64_t timeouts_since_log;
    /* The earliest handshake deadline not yet checked, 0 when none. */
    int64_t next_expire_ms;
    /* Set when a connection was added or its queue became empty or
     * non-empty: the event loop then updates what epoll watches. */
    int interest_changed;
};

/* Binds the unix socket (mode 0660) and listens. On failure the caller
 * still calls wb__conns_destroy. */
int wb__conns_listen(wb_conns *cs, const char *path, wb_err *err);

/* Accepts pending connections (at most 256 a round). Above --max-peers, or
 * above --max-peers-per-process connections of the same process, a
 * connection is closed at once; out of descriptors, the spare one is given
 * up for a moment so that the backlog drains. */
void wb__conns_accept(wb_conns *cs);

/* Handles poll events of the connection with this serial, if it is still
 * there: writes what is queued, reads and handles what came. */
void wb__conns_event(wb_conns *cs, uint64_t serial, int writable, int readable);

/* Closes connection `serial` once what is queued for it is written (at
 * once when nothing is), after a ZMTP ERROR command with `reason` when it
 * is not NULL; nothing more is read from it. */
void wb__conns_close(wb_conns *cs, uint64_t serial, const char *reason);

/* Closes the connections that have not completed the ZMTP handshake
 * within --handshake-timeout-ms (counted in peers_disconnected, logged at
 * most once a second). Returns the milliseconds until the next deadline,
 * or -1 when no connection is in its handshake. */
long wb__conns_expire(wb_conns *cs);

/* Sends one message as a ZMTP frame to the connection `ident` (its serial,
 * 8 bytes), or with `frame` (not NULL) as two: body, then `frame_len` bytes
 * of `frame`, written from where they are (what the socket does not take
 * at once is copied). Returns WB_OK; WB_ENOTFOUND when no such connection is open;
 * WB_ELIMIT when the peer left --max-queued-replies messages unread, or
 * its queue (or every peer's) would pass --max-queued-bytes
 * (--max-queued-bytes-total), and
 * WB_EIO when it is gone (both disconnect it). */
int wb__conns_send(wb_conns *cs, const void *ident, size_t ident_len, const void *body, size_t len,
                   const void *frame, size_t frame_len);

/* Queues one message the peer did not ask for (a VersionNotice) to
 * connection `serial`, only while its queue has room to spare: fewer than
 * half of --max-queued-replies messages and of --max-queued-bytes queued,
 * and every peer's queues under half of --max-queued-bytes-total, so that
 * the replies it asks for always find room. WB_OK; WB_ELIMIT when there is
 * no room (the message is dropped, the peer stays connected); WB_ENOTFOUND;
 * WB_EIO when the peer is gone (removed when its end of file is read). */
int wb__conns_offer(wb_conns *cs, uint64_t serial, const void *body, size_t len);

/* Closes every connection and the listening socket (the path stays). */
void wb__conns_destroy(wb_conns *cs);

#endif
