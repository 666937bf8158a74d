/* The clocks every program reads: monotonic time for deadlines, intervals
 * and durations, and wall-clock (Unix) time for what reports show. Code
 * that tests drive on a clock of their own takes one of these as a function
 * pointer (wb_broker.now_ms, wb__client_clock). */
#ifndef WB_CLOCK_H
#define WB_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in whole milliseconds. */
int64_t wb__clock_mono_ms(void);

/* CLOCK_REALTIME in seconds since the Unix epoch. */
double wb__clock_wall(void);

#endif
