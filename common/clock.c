#include "clock.h"

static struct timespec mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts;
}

int64_t wb__clock_mono_ms(void)
{
    struct timespec ts = mono();
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t wb__clock_mono_us(void)
{
    struct timespec ts = mono();
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

double wb__clock_mono_s(void)
{
    struct timespec ts = mono();
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct timespec wb__clock_mono_deadline(int64_t ns)
{
    struct timespec ts = mono();
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec += (long)(ns % 1000000000);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

double wb__clock_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}
