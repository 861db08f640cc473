/* clock.h - the monotonic clock every wait and deadline uses (not the wall
 * clock, which jumps). Thread-safe. */
#ifndef LLM_CLOCK_H
#define LLM_CLOCK_H

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
double llm_clock_mono_s(void);

#endif
