/* clock.h - the monotonic clock every wait and deadline uses (not the wall
 * clock, which jumps). Thread-safe. */
#ifndef LLM_CLOCK_H
#define LLM_CLOCK_H

/* Seconds since an arbitrary fixed point (CLOCK_MONOTONIC). */
double llm_clock_mono_s(void);

/* Unix time in seconds (CLOCK_REALTIME): for what several processes must
 * agree on (the gateway replicas' shared minutes), never for a wait. */
double llm_clock_wall_s(void);

/* unix_s (wall-clock seconds, UTC) as RFC 3339 "2026-12-02T21:00:00Z" into
 * out: the form Kubernetes' timestamps take. */
void llm_clock_rfc3339(double unix_s, char out[32]);

#endif
