/* unicode.h - the bits of Unicode the tokenizers need beyond UTF-8 coding
 * (llm/utf8.h): category flags (letter, number, punctuation, whitespace) and
 * the GPT-2 byte <-> codepoint mapping. Internal to the engine; pure and
 * thread-safe. */
#ifndef LLM_UNICODE_H
#define LLM_UNICODE_H

#include <stddef.h>
#include <stdint.h>

#include "llm/utf8.h"

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

int unicode_flags(uint32_t cp);
/* GPT-2 byte-level mapping: each byte to a printable codepoint and back
 * (-1 when cp is not the image of a byte). */
uint32_t unicode_byte_to_cp(uint8_t b);
int unicode_cp_to_byte(uint32_t cp);

#endif
