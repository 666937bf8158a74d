/* XXH3 of large buffers (tensors) through libxxhash's run-time choice of
 * vector unit (AVX2, AVX-512) where the library has one (x86): its plain
 * functions are built for the distribution's baseline, SSE2 on x86-64
 * (15 GB/s on one core of the development VM, against 41 GB/s with the
 * dispatch). A tensor's checksum is one sequential chain, so its speed
 * bounds how fast a large tensor is loaded, verified or compared. The
 * digests are the same whichever unit computes them. CMake defines
 * WB_HAVE_XXH_DISPATCH where the dispatch header and functions exist. */
#ifndef WB_COMMON_XXH_H
#define WB_COMMON_XXH_H

#include <xxhash.h>
#ifdef WB_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h>
#endif

#endif
