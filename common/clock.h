/* The clocks every program reads: monotonic time for deadlines, intervals
 * and durations, and wall-clock (Unix) time for what reports show. Code
 * that tests drive on a clock of their own takes one of these as a function
 * pointer (wb_broker.now_ms, wb__client_clock). */
#ifndef WB_CLOCK_H
#define WB_CLOCK_H

#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in whole milliseconds. */
int64_t wb__clock_mono_ms(void);

/* CLOCK_MONOTONIC in whole microseconds (systemd's MONOTONIC_USEC). */
int64_t wb__clock_mono_us(void);

/* CLOCK_MONOTONIC in seconds, for durations measured and reported. */
double wb__clock_mono_s(void);

/* CLOCK_MONOTONIC `ns` nanoseconds from now (ns >= 0), as the deadline of a
 * pthread_cond_timedwait on a condition variable whose clock is
 * CLOCK_MONOTONIC (pthread_condattr_setclock). */
struct timespec wb__clock_mono_deadline(int64_t ns);

/* CLOCK_REALTIME in seconds since the Unix epoch. */
double wb__clock_wall(void);

#endif
