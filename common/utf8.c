/* utf8.c - UTF-8 decoding and encoding (llm/utf8.h). */
#include "llm/utf8.h"

#include <stdlib.h>
#include <string.h>

int llm_utf8_seq_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1;
}

uint32_t llm_utf8_decode(const char *s, size_t len, size_t *pos)
{
    const unsigned char *p = (const unsigned char *)s + *pos;
    size_t left = len - *pos;
    int n = llm_utf8_seq_len(p[0]);
    if (n == 1) {
        (*pos)++;
        return p[0] < 0x80 ? p[0] : LLM_UTF8_INVALID;
    }
    if ((size_t)n > left)
        goto bad;
    uint32_t cp = p[0] & (0xff >> (n + 1));
    for (int i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            goto bad;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    *pos += (size_t)n;
    return cp;
bad:
    (*pos)++;
    return LLM_UTF8_INVALID;
}

int llm_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xc0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 0x3f)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xe0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (unsigned char)(0xf0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t llm_utf8_valid_len(const unsigned char *s, size_t n)
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

char *llm_utf8_dup_valid(const char *s, size_t n, size_t *out_len)
{
    if (n > (SIZE_MAX - 1) / 3)
        return NULL;
    char *d = malloc(3 * n + 1), *p = d;
    if (!d)
        return NULL;
    for (size_t i = 0; i < n;) {
        size_t k = llm_utf8_valid_len((const unsigned char *)s + i, n - i);
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
