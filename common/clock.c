/* clock.c - the monotonic and wall clocks (clock.h). */
#include <time.h>

#include "llm/clock.h"

void llm_clock_rfc3339(double unix_s, char out[32])
{
    time_t t = (time_t)unix_s;
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", &tm))
        out[0] = 0; /* a year past 9999: no timestamp rather than garbage */
}

double llm_clock_wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double llm_clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC with a valid pointer */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
