#include "alloc.h"

#include <errno.h>
#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The hook's state. `armed` is the only thing an allocation reads while the
 * hook is off; the rest is read once it is on. */
static atomic_int armed;
static atomic_long fail_at;
static atomic_uint fail_flags;
static atomic_long counted;
static atomic_long failed;
static _Atomic(const void *) first_site;
/* The arming thread, by the address of its copy of a thread-local. */
static _Thread_local char thread_tag;
static _Atomic(const char *) hook_thread;

void wb__alloc_fail_after(long n, unsigned flags)
{
    atomic_store(&armed, 0);
    atomic_store(&fail_at, n);
    atomic_store(&fail_flags, flags);
    atomic_store(&counted, 0);
    atomic_store(&failed, 0);
    atomic_store(&first_site, NULL);
    atomic_store(&hook_thread, (flags & WB_ALLOC_THIS_THREAD) ? &thread_tag : NULL);
    atomic_store(&armed, 1);
}

void wb__alloc_hook_off(void)
{
    atomic_store(&armed, 0);
}

long wb__alloc_count(void)
{
    return atomic_load(&counted);
}

long wb__alloc_failures(void)
{
    return atomic_load(&failed);
}

const void *wb__alloc_failed_site(void)
{
    return atomic_load(&first_site);
}

/* The armed hook's verdict on one allocation: 1 when it is to fail. */
static int hook_fails(const void *site)
{
    const char *only = atomic_load(&hook_thread);
    if (only && only != &thread_tag)
        return 0;
    long i = atomic_fetch_add(&counted, 1);
    long n = atomic_load(&fail_at);
    if (n < 0)
        return 0;
    int fail = (atomic_load(&fail_flags) & WB_ALLOC_STICKY) ? i >= n : i == n;
    if (!fail)
        return 0;
    atomic_fetch_add(&failed, 1);
    const void *none = NULL;
    atomic_compare_exchange_strong(&first_site, &none, site);
    errno = ENOMEM;
    return 1;
}

static inline int injected(const void *site)
{
    return __builtin_expect(atomic_load_explicit(&armed, memory_order_relaxed), 0) &&
           hook_fails(site);
}

static void *at_malloc(size_t n, const void *site)
{
    return injected(site) ? NULL : malloc(n);
}

void *wb__malloc(size_t n)
{
    return at_malloc(n, __builtin_return_address(0));
}

void *wb__calloc(size_t n, size_t size)
{
    return injected(__builtin_return_address(0)) ? NULL : calloc(n, size);
}

void *wb__realloc(void *p, size_t n)
{
    return injected(__builtin_return_address(0)) ? NULL : realloc(p, n);
}

static char *copy_n(const char *s, size_t n, const void *site)
{
    char *p = at_malloc(n + 1, site);
    if (p) {
        memcpy(p, s, n);
        p[n] = '\0';
    }
    return p;
}

char *wb__strdup(const char *s)
{
    return copy_n(s, strlen(s), __builtin_return_address(0));
}

char *wb__strndup(const char *s, size_t n)
{
    return copy_n(s, strnlen(s, n), __builtin_return_address(0));
}

int wb__vasprintf(char **out, const char *fmt, va_list ap)
{
    const void *site = __builtin_return_address(0);
    *out = NULL;
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    if (n >= 0) {
        char *p = at_malloc((size_t)n + 1, site);
        if (p) {
            vsnprintf(p, (size_t)n + 1, fmt, again);
            *out = p;
        } else {
            n = -1;
        }
    }
    va_end(again);
    return n;
}

static void *protobuf_alloc(void *data, size_t size)
{
    (void)data;
    return at_malloc(size, __builtin_return_address(0));
}

static void protobuf_free(void *data, void *p)
{
    (void)data;
    free(p);
}

ProtobufCAllocator wb__protobuf_allocator = {protobuf_alloc, protobuf_free, NULL};

static _Thread_local unsigned long jansson_failures;

static void *jansson_alloc(size_t n)
{
    void *p = at_malloc(n, __builtin_return_address(0));
    if (!p)
        jansson_failures++;
    return p;
}

unsigned long wb__alloc_jansson_failures(void)
{
    return jansson_failures;
}

void wb__alloc_use_for_jansson(void)
{
    json_set_alloc_funcs(jansson_alloc, free);
}
