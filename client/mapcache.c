#include "mapcache.h"

#include "shm.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct wb__map {
    struct wb__map *next;
    char key[WB_SHM_NAME_MAX];
    wb_shm shm;
    unsigned refs;
};

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static wb__map *cache_head;

int wb__mapcache_get_host(const char *shm_name, uint64_t size, wb__map **out, wb_err *err)
{
    *out = NULL;
    if (!shm_name || strlen(shm_name) >= WB_SHM_NAME_MAX)
        return wb__err_set(err, WB_EPROTO, "slab name is missing or too long");
    int rc = WB_OK;
    pthread_mutex_lock(&cache_mu);
    wb__map *m;
    for (m = cache_head; m; m = m->next) {
        if (strcmp(m->key, shm_name) == 0)
            break;
    }
    if (m) {
        if (m->shm.size != size) {
            rc = wb__err_set(err, WB_EPROTO,
                             "slab %s is mapped with %llu bytes but the broker now says %llu",
                             shm_name, (unsigned long long)m->shm.size, (unsigned long long)size);
        } else {
            m->refs++;
            *out = m;
        }
        pthread_mutex_unlock(&cache_mu);
        return rc;
    }
    m = calloc(1, sizeof *m);
    if (!m) {
        pthread_mutex_unlock(&cache_mu);
        return wb__err_set(err, WB_ENOMEM, "out of memory mapping slab %s", shm_name);
    }
    rc = wb__shm_map_ro(&m->shm, shm_name, size, err);
    if (rc != WB_OK) {
        free(m);
        pthread_mutex_unlock(&cache_mu);
        return rc;
    }
    snprintf(m->key, sizeof m->key, "%s", shm_name);
    m->refs = 1;
    m->next = cache_head;
    cache_head = m;
    *out = m;
    pthread_mutex_unlock(&cache_mu);
    return WB_OK;
}

void wb__mapcache_put(wb__map **map)
{
    if (!map || !*map)
        return;
    wb__map *m = *map;
    *map = NULL;
    pthread_mutex_lock(&cache_mu);
    if (--m->refs > 0) {
        pthread_mutex_unlock(&cache_mu);
        return;
    }
    for (wb__map **pp = &cache_head; *pp; pp = &(*pp)->next) {
        if (*pp == m) {
            *pp = m->next;
            break;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    wb__shm_unmap(&m->shm);
    free(m);
}

const void *wb__map_addr(const wb__map *map)
{
    return map ? map->shm.addr : NULL;
}

uint64_t wb__map_size(const wb__map *map)
{
    return map ? map->shm.size : 0;
}

unsigned wb__map_refs(const wb__map *map)
{
    unsigned refs = 0;
    if (map) {
        pthread_mutex_lock(&cache_mu);
        refs = map->refs;
        pthread_mutex_unlock(&cache_mu);
    }
    return refs;
}

size_t wb__mapcache_count(void)
{
    size_t n = 0;
    pthread_mutex_lock(&cache_mu);
    for (const wb__map *m = cache_head; m; m = m->next)
        n++;
    pthread_mutex_unlock(&cache_mu);
    return n;
}
