/* cli.h - small helpers shared by the command-line tools: checked number
 * parsing and a monotonic clock. Header-only; tools are single files. */
#ifndef LLM_TOOLS_CLI_H
#define LLM_TOOLS_CLI_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline int cli_int(const char *flag, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s ? s : "", &end, 10);
    if (!s || errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "error: %s expects an integer in [%ld, %ld], got '%s'\n", flag, lo, hi, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static inline int cli_float(const char *flag, const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s ? s : "", &end);
    if (!s || errno || *end || end == s || !(v >= lo && v <= hi)) {
        fprintf(stderr, "error: %s expects a number in [%g, %g], got '%s'\n", flag, lo, hi, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static inline double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
