/* prom_text.c - sums of series in Prometheus text; see prom_text.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prom_text.h"

/* key's value in the label set [l, end) (quotes excluded): 0, or -1 when
 * absent or escaped. */
static int label_value(const char *l, const char *end, const char *key, const char **v, size_t *n)
{
    size_t kn = strlen(key);
    for (const char *p = l; p && p + kn + 2 < end; p = memchr(p, ',', (size_t)(end - p)), p = p ? p + 1 : NULL) {
        while (p < end && *p == ' ')
            p++;
        if ((size_t)(end - p) > kn + 2 && !strncmp(p, key, kn) && p[kn] == '=' && p[kn + 1] == '"') {
            const char *q = p + kn + 2, *close = memchr(q, '"', (size_t)(end - q));
            if (!close || memchr(q, '\\', (size_t)(close - q)) || close - q > 255)
                return -1;
            *v = q, *n = (size_t)(close - q);
            return 0;
        }
        const char *qs = memchr(p, '"', (size_t)(end - p)); /* past this label's quoted value */
        const char *qe = qs ? memchr(qs + 1, '"', (size_t)(end - qs - 1)) : NULL;
        if (!qe)
            return -1;
        p = qe;
    }
    return -1;
}

/* The sum of name's series (those whose labels hold key="value" when key
 * is given). */
static double sum_of(const char *text, const char *name, const char *key, const char *value, int *found)
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
            const char *v = p[n] == '{' ? memchr(p + n, '}', len - n) : p + n, *lv;
            size_t lvn;
            int match = !key || (v && p[n] == '{' && !label_value(p + n + 1, v, key, &lv, &lvn) && lvn == strlen(value) &&
                                 !memcmp(lv, value, lvn));
            char num[64], *end;
            size_t k = v ? len - (size_t)(v + 1 - p) : 0;
            double x = NAN;
            if (match && v && k > 0 && k < sizeof num) {
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

double prom_text_value(const char *text, const char *name, int *found)
{
    return sum_of(text, name, NULL, NULL, found);
}

double prom_text_value_where(const char *text, const char *name, const char *key, const char *value, int *found)
{
    return sum_of(text, name, key, value, found);
}

int prom_text_labels(const char *text, const char *name, const char *key, int max,
                     void (*fn)(void *ctx, const char *value, size_t n), void *ctx)
{
    size_t n = strlen(name);
    int calls = 0;
    for (const char *p = text; p && *p && calls < max;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        const char *close = len > n && *p != '#' && !strncmp(p, name, n) && p[n] == '{' ? memchr(p + n, '}', len - n) : NULL;
        const char *v;
        size_t vn;
        if (close && !label_value(p + n + 1, close, key, &v, &vn)) {
            char num[64], *end;
            size_t k = len - (size_t)(close + 1 - p);
            double x = NAN;
            if (k > 0 && k < sizeof num) {
                memcpy(num, close + 1, k);
                num[k] = 0;
                x = strtod(num, &end);
                x = end != num ? x : NAN;
            }
            if (x > 0) {
                fn(ctx, v, vn);
                calls++;
            }
        }
        p = eol ? eol + 1 : NULL;
    }
    return calls;
}
