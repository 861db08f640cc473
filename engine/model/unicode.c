/* unicode.c - category lookup and the GPT-2 byte mapping (UTF-8 coding: common/utf8.c). */
#include "unicode.h"

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
