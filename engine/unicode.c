/* unicode.c - UTF-8 coding, category lookup, GPT-2 byte mapping. */
#include "unicode.h"

int unicode_seq_len(unsigned char c)
{
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1;
}

uint32_t unicode_decode(const char *s, size_t len, size_t *pos)
{
    const unsigned char *p = (const unsigned char *)s + *pos;
    size_t left = len - *pos;
    int n = unicode_seq_len(p[0]);
    if (n == 1) {
        (*pos)++;
        return p[0] < 0x80 ? p[0] : UNICODE_INVALID;
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
    return UNICODE_INVALID;
}

int unicode_encode(uint32_t cp, char *out)
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

static int in_ranges(const unicode_range *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* The White_Space property, as the reference tokenizers use it. */
static int is_space(uint32_t cp)
{
    return (cp >= 0x9 && cp <= 0xd) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

int unicode_flags(uint32_t cp)
{
    int f = UC_ANY;
    if (cp > 0x10ffff)
        return 0;
    if (cp < 0x80) { /* fast path for ASCII */
        if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return UC_ANY | UC_LETTER;
        if (cp >= '0' && cp <= '9') return UC_ANY | UC_NUMBER;
    }
    if (is_space(cp)) f |= UC_SPACE;
    if (in_ranges(unicode_letters, unicode_letters_n, cp)) f |= UC_LETTER;
    else if (in_ranges(unicode_numbers, unicode_numbers_n, cp)) f |= UC_NUMBER;
    else if (in_ranges(unicode_punct, unicode_punct_n, cp)) f |= UC_PUNCT;
    return f;
}

/* Printable bytes map to themselves; the rest to 256, 257, ... in order. */
static int byte_is_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255); }

uint32_t unicode_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    uint32_t n = 0;
    for (int i = 0; i < b; i++) n += !byte_is_printable(i);
    return 256 + n;
}

int unicode_cp_to_byte(uint32_t cp)
{
    if (cp < 256)
        return byte_is_printable((int)cp) ? (int)cp : -1;
    uint32_t n = 256;
    for (int b = 0; b < 256; b++)
        if (!byte_is_printable(b) && n++ == cp)
            return b;
    return -1;
}
