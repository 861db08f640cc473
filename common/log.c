/* log.c - llm_log (log.h). */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "llm/log.h"

void llm_log(const char *prog, const char *fmt, ...)
{
    char when[32], msg[2048];
    time_t t = time(NULL);
    struct tm tm;
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s %s: %s\n", when, prog, msg);
}
