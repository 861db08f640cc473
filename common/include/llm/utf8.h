/* utf8.h - UTF-8 coding and byte ranges of text, for every layer that reads
 * or writes text (the tokenizers, the Jinja interpreter, the model maker).
 * Pure functions, thread-safe. */
#ifndef LLM_UTF8_H
#define LLM_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* What an invalid or truncated sequence decodes to. */
#define LLM_UTF8_INVALID 0xFFFD

/* A byte range [start, end) of a text. */
typedef struct llm_span {
    size_t start, end;
} llm_span;

/* Bytes of the UTF-8 sequence starting with lead byte c (1 for invalid). */
int llm_utf8_seq_len(unsigned char c);
/* Decodes one codepoint at s[*pos] (len bytes in all), advancing *pos; an
 * invalid or truncated sequence yields LLM_UTF8_INVALID and advances one byte. */
uint32_t llm_utf8_decode(const char *s, size_t len, size_t *pos);
/* Writes cp as UTF-8 into out (>= 4 bytes), returns the byte count. */
int llm_utf8_encode(uint32_t cp, char *out);
/* Length of the valid UTF-8 character at s (n >= 1 bytes left), 0 if
 * invalid: no overlong forms, no surrogates, nothing above U+10FFFF. */
size_t llm_utf8_valid_len(const unsigned char *s, size_t n);
/* A NUL-terminated copy of s[0, n) that is valid UTF-8: each byte that
 * starts no valid character becomes U+FFFD (models can emit stray bytes).
 * *out_len gets its length. Caller frees; NULL when out of memory. */
char *llm_utf8_dup_valid(const char *s, size_t n, size_t *out_len);

#endif
