/* clock.c - llm_clock_mono_s (clock.h). */
#include <time.h>

#include "llm/clock.h"

double llm_clock_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* cannot fail for CLOCK_MONOTONIC with a valid pointer */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
