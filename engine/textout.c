/* textout.c - see textout.h. */
#include <string.h>

#include "llm/sampler.h"
#include "textout.h"

void textout_init(textout *t, const char *const *stops, int n_stops)
{
    memset(t, 0, sizeof *t);
    t->stops = stops;
    t->n_stops = n_stops;
}

void textout_free(textout *t)
{
    llm_strbuf_free(&t->text);
}

/* Length of the longest prefix of b[0, n) that does not end inside a
 * UTF-8 character (a lead byte whose continuation bytes are not all there). */
static size_t utf8_complete(const char *b, size_t n)
{
    for (size_t k = 1; k <= 4 && k <= n; k++) {
        unsigned char c = (unsigned char)b[n - k];
        if ((c & 0xc0) == 0x80)
            continue; /* continuation byte: keep looking for its lead */
        size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return want > k ? n - k : n;
    }
    return n; /* not UTF-8 at all: do not hold it forever */
}

int textout_push(textout *t, const char *piece, size_t len, const char **out, size_t *n)
{
    *out = "";
    *n = 0;
    if (t->stopped)
        return 1;
    if (llm_strbuf_append(&t->text, piece, len))
        return -1;
    const char *buf = t->text.p;
    /* a match can only start in the unsent part: sent bytes were never a
     * possible stop prefix */
    size_t hold = 0;
    long at = llm_stop_find(buf + t->sent, t->text.len - t->sent, t->stops, t->n_stops, &hold);
    size_t end = at >= 0 ? t->sent + (size_t)at : t->text.len - hold;
    if (at < 0)
        end = t->sent + utf8_complete(buf + t->sent, end - t->sent);
    *out = buf + t->sent;
    *n = end - t->sent;
    t->sent = end;
    if (at >= 0)
        t->stopped = 1;
    return at >= 0;
}

void textout_flush(textout *t, const char **out, size_t *n)
{
    *out = t->stopped || !t->text.p ? "" : t->text.p + t->sent;
    *n = t->stopped ? 0 : t->text.len - t->sent;
    t->sent += *n;
}

/* Length of the valid UTF-8 character at s (n bytes left), 0 if invalid:
 * no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_char(const unsigned char *s, size_t n)
{
    if (s[0] < 0x80)
        return 1;
    size_t k = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (k == 0 || k > n || s[0] > 0xf4)
        return 0;
    for (size_t i = 1; i < k; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    if ((s[0] == 0xe0 && s[1] < 0xa0) || (s[0] == 0xed && s[1] >= 0xa0) || (s[0] == 0xf0 && s[1] < 0x90) ||
        (s[0] == 0xf4 && s[1] >= 0x90))
        return 0;
    return k;
}

char *textout_utf8_dup(const char *s, size_t n, size_t *out_len)
{
    char *d = malloc(3 * n + 1), *p = d;
    if (!d)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_char((const unsigned char *)s + i, n - i);
        if (k) {
            memcpy(p, s + i, k);
            p += k;
            i += k;
        } else { /* U+FFFD for each byte that starts no valid character */
            memcpy(p, "\xef\xbf\xbd", 3);
            p += 3;
            i++;
        }
    }
    *p = 0;
    *out_len = (size_t)(p - d);
    return d;
}
