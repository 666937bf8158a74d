/* Non-temporal copies (stage_ntcopy.h). Each kind copies a head with memcpy up to
 * the first aligned destination address, the body in aligned streaming
 * stores (unaligned loads: the source's alignment is the file's), the tail
 * with memcpy, then fences. Short copies are plain memcpy: streaming a few
 * lines saves nothing and costs a fence. */
#include "stage_ntcopy.h"
#include "stage.h"

#include <stdatomic.h>

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WB_NT_X86 1
#endif

/* Below this many bytes a copy is a memcpy. */
#define NT_MIN 256

static void copy_memcpy(void *dst, const void *src, size_t n)
{
    if (n)
        memcpy(dst, src, n);
}

#ifdef WB_NT_X86
/* Bytes to copy before dst is `align`-byte aligned (at most n). */
static size_t head_len(const void *dst, size_t align, size_t n)
{
    size_t h = (size_t)(-(uintptr_t)dst & (align - 1));
    return h < n ? h : n;
}

__attribute__((target("sse2"))) static void copy_sse2(void *dst, const void *src, size_t n)
{
    if (n < NT_MIN) {
        copy_memcpy(dst, src, n);
        return;
    }
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t h = head_len(d, 16, n);
    memcpy(d, s, h);
    d += h;
    s += h;
    n -= h;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    for (; n >= 16; n -= 16, d += 16, s += 16)
        _mm_stream_si128((__m128i *)(void *)d, _mm_loadu_si128((const __m128i *)(const void *)s));
    if (n)
        memcpy(d, s, n);
    _mm_sfence();
}

__attribute__((target("avx2"))) static void copy_avx2(void *dst, const void *src, size_t n)
{
    if (n < NT_MIN) {
        copy_memcpy(dst, src, n);
        return;
    }
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t h = head_len(d, 32, n);
    memcpy(d, s, h);
    d += h;
    s += h;
    n -= h;
    for (; n >= 128; n -= 128, d += 128, s += 128) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)s);
        __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(s + 32));
        __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(s + 64));
        __m256i e = _mm256_loadu_si256((const __m256i *)(const void *)(s + 96));
        _mm256_stream_si256((__m256i *)(void *)d, a);
        _mm256_stream_si256((__m256i *)(void *)(d + 32), b);
        _mm256_stream_si256((__m256i *)(void *)(d + 64), c);
        _mm256_stream_si256((__m256i *)(void *)(d + 96), e);
    }
    for (; n >= 32; n -= 32, d += 32, s += 32)
        _mm256_stream_si256((__m256i *)(void *)d,
                            _mm256_loadu_si256((const __m256i *)(const void *)s));
    if (n)
        memcpy(d, s, n);
    _mm_sfence();
}
#endif

wb_stage_ntcopy_fn wb__stage_ntcopy_get(const char *kind)
{
    if (strcmp(kind, "memcpy") == 0)
        return copy_memcpy;
#ifdef WB_NT_X86
    __builtin_cpu_init();
    if (strcmp(kind, "sse2") == 0 && __builtin_cpu_supports("sse2"))
        return copy_sse2;
    if (strcmp(kind, "avx2") == 0 && __builtin_cpu_supports("avx2"))
        return copy_avx2;
#endif
    return NULL;
}

static wb_stage_ntcopy_fn chosen;
static const char *chosen_kind;
static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
    static const char *const kinds[] = {"avx2", "sse2", "memcpy"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if ((chosen = wb__stage_ntcopy_get(kinds[i])) != NULL) {
            chosen_kind = kinds[i];
            return;
        }
    }
}

void wb__stage_ntcopy(void *dst, const void *src, size_t n)
{
    pthread_once(&choose_once, choose);
    chosen(dst, src, n);
}

const char *wb__stage_ntcopy_kind(void)
{
    pthread_once(&choose_once, choose);
    return chosen_kind;
}

/* ---- CLDEMOTE ---- */

#if defined(__x86_64__)
#include <cpuid.h>

static int demote_probe(void)
{
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (c >> 25) & 1; /* CPUID.(EAX=7,ECX=0):ECX[25] */
}
#else
static int demote_probe(void)
{
    return 0;
}
#endif

static atomic_int demote_known; /* 0: not probed, 1: no, 2: yes */

int wb__stage_can_demote(void)
{
    int k = atomic_load_explicit(&demote_known, memory_order_relaxed);
    if (!k) {
        k = demote_probe() ? 2 : 1;
        atomic_store_explicit(&demote_known, k, memory_order_relaxed);
    }
    return k == 2;
}

void wb__stage_demote(const void *p, size_t n)
{
#if defined(__x86_64__)
    if (!n || !wb__stage_can_demote())
        return;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)63, end = (uintptr_t)p + n;
    /* The encoding of CLDEMOTE (0F 1C /0), which older assemblers lack. */
    for (; a < end; a += 64)
        __asm__ volatile(".byte 0x0f, 0x1c, 0x00" ::"a"(a) : "memory");
#else
    (void)p;
    (void)n;
#endif
}
