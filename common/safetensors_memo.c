/* The memo of parsed safetensors headers and shard indexes
 * (safetensors_memo.h): a short list of entries, most recently used first;
 * a broker holds a few dozen checkpoints, so a scan of their digests costs
 * nothing beside a parse. */
#include "safetensors_memo.h"

#include "alloc.h"
#include "xxh.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A header's entries (p, m), or a shard index's tree (index). */
typedef struct memo_entry {
    struct memo_entry *next;
    uint64_t digest;
    size_t len;
    uint8_t *hdr; /* the bytes: a header's, or an index's */
    wb_st_pending *p;
    size_t np;
    wb_st_pending_meta *m;
    size_t nm;
    json_t *index;
    int counted;
    uint64_t map_entries;
    size_t bytes; /* what the entry holds, counted against the limit */
} memo_entry;

/* Bytes that a tree of jansson's takes per value (safetensors_index.h). */
#define TREE_BYTES_PER_VALUE 170

static pthread_mutex_t memo_mu = PTHREAD_MUTEX_INITIALIZER;
static memo_entry *memo_head;
static size_t memo_limit, memo_bytes, memo_entries;
static uint64_t memo_hits, memo_misses;
static _Atomic uint64_t memo_fixed;

void wb__st_pending_free(wb_st_pending *p, size_t n, wb_st_pending_meta *m, size_t nm)
{
    for (size_t i = 0; i < n; i++) {
        free(p[i].name);
        free(p[i].shape);
    }
    free(p);
    for (size_t i = 0; i < nm; i++) {
        free(m[i].key);
        free(m[i].value);
    }
    free(m);
}

static void entry_free(memo_entry *e)
{
    wb__st_pending_free(e->p, e->np, e->m, e->nm);
    json_decref(e->index);
    free(e->hdr);
    free(e);
}

static uint64_t digest_of(const uint8_t *hdr, size_t n)
{
    uint64_t fixed = atomic_load(&memo_fixed);
    return fixed ? fixed : XXH3_64bits(hdr, n);
}

/* Copies entries; *bytes gains what they hold. 0, or -1 (nothing left
 * allocated) when out of memory. */
static int copy_entries(const wb_st_pending *p, size_t np, const wb_st_pending_meta *m, size_t nm,
                        wb_st_pending **po, wb_st_pending_meta **mo, size_t *bytes)
{
    wb_st_pending *cp = wb__calloc(np ? np : 1, sizeof *cp);
    wb_st_pending_meta *cm = wb__calloc(nm ? nm : 1, sizeof *cm);
    size_t done = 0, mdone = 0, b = (np + nm) * sizeof *cp;
    if (!cp || !cm)
        goto fail;
    for (; done < np; done++) {
        cp[done] = p[done];
        cp[done].name = wb__strdup(p[done].name);
        cp[done].shape = NULL;
        if (!cp[done].name)
            goto fail;
        b += strlen(p[done].name) + 1;
        if (p[done].ndim) {
            size_t sz = p[done].ndim * sizeof *cp[done].shape;
            if (!(cp[done].shape = wb__malloc(sz))) {
                done++; /* its name is freed with the others */
                goto fail;
            }
            memcpy(cp[done].shape, p[done].shape, sz);
            b += sz;
        }
    }
    for (; mdone < nm; mdone++) {
        cm[mdone].key = wb__strdup(m[mdone].key);
        cm[mdone].value = cm[mdone].key ? wb__strdup(m[mdone].value) : NULL;
        if (!cm[mdone].value) {
            mdone++;
            goto fail;
        }
        b += strlen(m[mdone].key) + strlen(m[mdone].value) + 2;
    }
    *po = cp;
    *mo = cm;
    *bytes += b;
    return 0;
fail:
    if (cp)
        wb__st_pending_free(cp, done, cm, cm ? mdone : 0);
    else
        free(cm);
    return -1;
}

/* The entry of these bytes and kind, moved to the front; NULL when there
 * is none. Under memo_mu. */
static memo_entry *find(uint64_t d, const void *bytes, size_t n, int index)
{
    memo_entry **pp = &memo_head;
    while (*pp && !((*pp)->digest == d && (*pp)->len == n && ((*pp)->index != NULL) == index &&
                    memcmp((*pp)->hdr, bytes, n) == 0))
        pp = &(*pp)->next;
    memo_entry *e = *pp;
    if (e) {
        *pp = e->next; /* to the front: the most recently used */
        e->next = memo_head;
        memo_head = e;
    }
    return e;
}

/* Drops the least recently used entries until `need` more bytes fit.
 * Under memo_mu. */
static void make_room(size_t need)
{
    while (memo_head && memo_bytes + need > memo_limit) {
        memo_entry **pp = &memo_head;
        while ((*pp)->next)
            pp = &(*pp)->next;
        memo_entry *last = *pp;
        *pp = NULL;
        memo_bytes -= last->bytes;
        memo_entries--;
        entry_free(last);
    }
}

/* On: the memo's limit, read under its lock (0: off). */
static size_t limit_now(void)
{
    pthread_mutex_lock(&memo_mu);
    size_t limit = memo_limit;
    pthread_mutex_unlock(&memo_mu);
    return limit;
}

/* Keeps e unless its bytes are kept already (another thread's open kept
 * them meanwhile) or it is larger than the whole memo. */
static void keep(memo_entry *e, int index)
{
    pthread_mutex_lock(&memo_mu);
    if (find(e->digest, e->hdr, e->len, index) || e->bytes > memo_limit) {
        pthread_mutex_unlock(&memo_mu);
        entry_free(e);
        return;
    }
    make_room(e->bytes);
    e->next = memo_head;
    memo_head = e;
    memo_bytes += e->bytes;
    memo_entries++;
    pthread_mutex_unlock(&memo_mu);
}

void wb__st_memo_set_limit(size_t max_bytes)
{
    pthread_mutex_lock(&memo_mu);
    memo_limit = max_bytes;
    make_room(0);
    pthread_mutex_unlock(&memo_mu);
}

int wb__st_memo_get(const uint8_t *hdr, size_t n, wb_st_pending **p, size_t *np,
                    wb_st_pending_meta **m, size_t *nm)
{
    if (!limit_now())
        return 0;
    uint64_t d = digest_of(hdr, n);
    pthread_mutex_lock(&memo_mu);
    memo_entry *e = find(d, hdr, n, 0);
    int rc = 0;
    if (e) {
        size_t ignored = 0;
        rc = copy_entries(e->p, e->np, e->m, e->nm, p, m, &ignored) == 0 ? 1 : -1;
        if (rc == 1) {
            *np = e->np;
            *nm = e->nm;
            memo_hits++;
        }
    } else {
        memo_misses++;
    }
    pthread_mutex_unlock(&memo_mu);
    return rc;
}

void wb__st_memo_put(const uint8_t *hdr, size_t n, const wb_st_pending *p, size_t np,
                     const wb_st_pending_meta *m, size_t nm)
{
    size_t limit = limit_now();
    if (!limit || n > limit)
        return;
    memo_entry *e = wb__calloc(1, sizeof *e);
    if (!e)
        return;
    e->bytes = sizeof *e + n;
    e->len = n;
    e->digest = digest_of(hdr, n);
    e->hdr = wb__malloc(n ? n : 1);
    if (!e->hdr || copy_entries(p, np, m, nm, &e->p, &e->m, &e->bytes) != 0) {
        free(e->hdr);
        free(e);
        return;
    }
    e->np = np;
    e->nm = nm;
    memcpy(e->hdr, hdr, n);
    keep(e, 0);
}

int wb__st_memo_get_index(const char *buf, size_t n, json_t **root, int *counted,
                          uint64_t *map_entries)
{
    *root = NULL;
    if (!limit_now())
        return 0;
    uint64_t d = digest_of((const uint8_t *)buf, n);
    pthread_mutex_lock(&memo_mu);
    memo_entry *e = find(d, buf, n, 1);
    if (e) {
        *root = json_incref(e->index);
        *counted = e->counted;
        *map_entries = e->map_entries;
        memo_hits++;
    } else {
        memo_misses++;
    }
    pthread_mutex_unlock(&memo_mu);
    return e != NULL;
}

void wb__st_memo_put_index(const char *buf, size_t n, json_t *root, int counted,
                           uint64_t map_entries, uint64_t values)
{
    size_t limit = limit_now();
    if (!limit || !root || n > limit || values > (limit - n) / TREE_BYTES_PER_VALUE)
        return;
    memo_entry *e = wb__calloc(1, sizeof *e);
    if (!e)
        return;
    if (!(e->hdr = wb__malloc(n ? n : 1))) {
        free(e);
        return;
    }
    memcpy(e->hdr, buf, n);
    e->len = n;
    e->digest = digest_of(e->hdr, n);
    e->index = json_incref(root);
    e->counted = counted;
    e->map_entries = map_entries;
    e->bytes = sizeof *e + n + (size_t)values * TREE_BYTES_PER_VALUE;
    keep(e, 1);
}

void wb__st_memo_stats(wb_st_memo_stats *out)
{
    pthread_mutex_lock(&memo_mu);
    *out = (wb_st_memo_stats){
        .hits = memo_hits, .misses = memo_misses, .entries = memo_entries, .bytes = memo_bytes};
    pthread_mutex_unlock(&memo_mu);
}

void wb__st_memo_test_fixed_digest(uint64_t digest)
{
    atomic_store(&memo_fixed, digest);
}
