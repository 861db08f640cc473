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
