/* prom_text.c - sums of series in Prometheus text; see prom_text.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prom_text.h"

double prom_text_value(const char *text, const char *name, int *found)
{
    size_t n = strlen(name);
    double sum = 0;
    *found = 0;
    for (const char *p = text; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        if (*p != '#' && len > n && !strncmp(p, name, n) && (p[n] == ' ' || p[n] == '{')) {
            /* within this line only: a label set left open must not send the search down the page
             * (quadratic on a big one), nor the number be read off the next line */
            const char *v = p[n] == '{' ? memchr(p + n, '}', len - n) : p + n;
            char num[64], *end;
            size_t k = v ? len - (size_t)(v + 1 - p) : 0;
            double x = NAN;
            if (v && k > 0 && k < sizeof num) {
                memcpy(num, v + 1, k);
                num[k] = 0;
                x = strtod(num, &end);
                x = end != num && isfinite(x) ? x : NAN;
            }
            if (isfinite(x)) {
                sum += x;
                *found = 1;
            }
        }
        p = eol ? eol + 1 : NULL;
    }
    return sum;
}
