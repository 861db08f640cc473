/* unicode.h - the bits of Unicode the tokenizers need: UTF-8 decoding and
 * encoding, category flags (letter, number, punctuation, whitespace) and
 * the GPT-2 byte <-> codepoint mapping. Internal to the engine; pure and
 * thread-safe. */
#ifndef LLM_UNICODE_H
#define LLM_UNICODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct unicode_range { uint32_t lo, hi; } unicode_range;

extern const unicode_range unicode_letters[], unicode_numbers[], unicode_punct[];
extern const size_t unicode_letters_n, unicode_numbers_n, unicode_punct_n;

enum {
    UC_LETTER = 1,
    UC_NUMBER = 2,
    UC_PUNCT = 4,
    UC_SPACE = 8,
    UC_ANY = 16, /* set for every valid codepoint: 0 flags means out of range */
};

#define UNICODE_INVALID 0xFFFD

/* Decodes one codepoint at s[*pos] (len bytes in all), advancing *pos; an
 * invalid or truncated sequence yields U+FFFD and advances one byte. */
uint32_t unicode_decode(const char *s, size_t len, size_t *pos);
/* Bytes of the UTF-8 sequence starting with lead byte c (1 for invalid). */
int unicode_seq_len(unsigned char c);
/* Writes cp as UTF-8 into out (>= 4 bytes), returns the byte count. */
int unicode_encode(uint32_t cp, char *out);
int unicode_flags(uint32_t cp);
/* GPT-2 byte-level mapping: each byte to a printable codepoint and back
 * (-1 when cp is not the image of a byte). */
uint32_t unicode_byte_to_cp(uint8_t b);
int unicode_cp_to_byte(uint32_t cp);

#endif
