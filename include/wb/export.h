/* Symbol visibility for weightbroker's public API.
 *
 * Every target is compiled with -fvisibility=hidden; only declarations marked
 * WB_EXPORT are visible from the shared library. */
#ifndef WB_EXPORT_H
#define WB_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define WB_EXPORT __attribute__((visibility("default")))
#else
#define WB_EXPORT
#endif

#endif
