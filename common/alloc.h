/* The one way production code allocates: every malloc, calloc, realloc and
 * strdup of broker/, client/, common/ and tools/ is a wb__ call below, and
 * protobuf-c's and jansson's allocations are routed through the same
 * functions, so that a test can make any one of them fail (the hook below).
 * Memory from them is freed with free(); free is not wrapped, as freeing
 * cannot fail and the hook counts allocations only. The allocators are
 * thread-safe; unarmed, the hook costs one relaxed atomic load per call.
 * The test lint.alloc_calls (scripts/alloc_calls.py) fails on a direct
 * call anywhere else; `scripts/alloc_calls.py --fix` renames them. */
#ifndef WB_ALLOC_H
#define WB_ALLOC_H

#include <protobuf-c/protobuf-c.h>

#include <stdarg.h>
#include <stddef.h>

/* As their libc namesakes; NULL (errno ENOMEM) when the hook fails them. */
void *wb__malloc(size_t n);
void *wb__calloc(size_t n, size_t size);
void *wb__realloc(void *p, size_t n);
char *wb__strdup(const char *s);
char *wb__strndup(const char *s, size_t n);
/* As vasprintf: the length, or -1 with *out unspecified (NULL here). */
int wb__vasprintf(char **out, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* What every *__unpack and *__free_unpacked of ours passes: protobuf-c's
 * allocations through wb__malloc (never NULL, the library's default). */
extern ProtobufCAllocator wb__protobuf_allocator;

/* Makes jansson allocate through wb__malloc (json_set_alloc_funcs, which is
 * process-wide): called by programs that own their process (wbrokerd, wbctl)
 * and by tests, never by libwbclient, whose host may have set its own. */
void wb__alloc_use_for_jansson(void);
/* Allocations of jansson's that failed on the calling thread so far: jansson
 * reports most of them as a syntax error ("string or '}' expected"), so a
 * parser compares this before and after a NULL from json_loadb to tell the
 * two apart. Stays 0 where jansson does not allocate through us. */
unsigned long wb__alloc_jansson_failures(void);

/* The test hook: internal, for unit tests only.
 *
 * wb__alloc_fail_after(n, flags) arms it: from then on allocations are
 * counted (0, 1, 2, ...) and the one numbered n fails (returns NULL, errno
 * ENOMEM); with WB_ALLOC_STICKY every later one fails too, as a process
 * truly out of memory sees it, while without it only that one does, which
 * also finds code that carries on after a failure it ignored. n < 0 counts
 * and fails nothing. WB_ALLOC_THIS_THREAD counts and fails only the arming
 * thread's allocations (a test's fake broker thread allocates freely).
 * Arming again restarts the count; wb__alloc_hook_off disarms (the counts
 * stay readable until the next arming).
 *
 * The pattern of an out-of-memory test (tests/unit/oom.h runs it):
 *
 *     for (long n = 0;; n++) {
 *         wb__alloc_fail_after(n, WB_ALLOC_STICKY);
 *         int rc = operation(&result);
 *         long failed = wb__alloc_failures();
 *         wb__alloc_hook_off();
 *         if (failed == 0) {            // every allocation it makes was made
 *             ck_assert_int_eq(rc, WB_OK);
 *             check_and_free(result);
 *             break;                    // n allocation points covered
 *         }
 *         ck_assert_int_eq(rc, WB_ENOMEM);  // or the defined error
 *         check_nothing_left(result);       // and, under ASan, no leak
 *     }
 */
#define WB_ALLOC_STICKY      1u
#define WB_ALLOC_THIS_THREAD 2u

void wb__alloc_fail_after(long n, unsigned flags);
void wb__alloc_hook_off(void);
/* Allocations counted since the hook was last armed. */
long wb__alloc_count(void);
/* Of those, the ones the hook failed. */
long wb__alloc_failures(void);
/* The return address of the first allocation the hook failed since it was
 * armed (NULL: none): in the function that called wb__malloc and friends, or
 * in protobuf-c or jansson for theirs. Tests count distinct sites with it. */
const void *wb__alloc_failed_site(void);

#endif
