/* tokenizer.h - vocabularies from GGUF metadata and the two tokenizer
 * families Llama-family models use:
 *   - SentencePiece-style (`tokenizer.ggml.model = llama`): score-driven
 *     merges over UTF-8 characters, byte fallback, "\u2581" for spaces;
 *   - byte-level BPE (`gpt2`): a pre-tokenizer chosen by
 *     `tokenizer.ggml.pre` (gpt-2, llama3, qwen2, starcoder families), then
 *     rank-ordered merges.
 *
 * Ownership: a vocab borrows strings from its gguf_file, which must outlive
 * it; llm_vocab_free accepts NULL. Token arrays and strings returned are
 * malloc'd and owned by the caller. Thread-safety: a vocab is read-only after
 * load; tokenize/detokenize may run concurrently. */
#ifndef LLM_TOKENIZER_H
#define LLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "llm/gguf.h"
#include "llm/status.h"
#include "llm/utf8.h"

typedef struct llm_vocab llm_vocab;

typedef enum llm_vocab_type { LLM_VOCAB_SPM = 1, LLM_VOCAB_BPE = 2 } llm_vocab_type;

/* Token types as stored in tokenizer.ggml.token_type. */
enum { LLM_TOKEN_NORMAL = 1, LLM_TOKEN_UNKNOWN = 2, LLM_TOKEN_CONTROL = 3,
       LLM_TOKEN_USER_DEFINED = 4, LLM_TOKEN_UNUSED = 5, LLM_TOKEN_BYTE = 6 };

/* Longest text accepted by llm_tokenize (declared bound, not a guess). */
#define LLM_TOKENIZE_MAX_BYTES (64u << 20)

llm_status llm_vocab_load(const gguf_file *f, llm_vocab **out, llm_error *err);
void llm_vocab_free(llm_vocab *v);

int llm_vocab_n(const llm_vocab *v);
llm_vocab_type llm_vocab_kind(const llm_vocab *v);
/* Name of the pre-tokenizer in use ("spm", "gpt-2", "llama3", ...). */
const char *llm_vocab_pre_name(const llm_vocab *v);
int32_t llm_vocab_bos(const llm_vocab *v); /* -1 when none */
int32_t llm_vocab_eos(const llm_vocab *v);
int llm_vocab_add_bos(const llm_vocab *v);
int llm_vocab_add_eos(const llm_vocab *v);
/* 1 for end-of-generation tokens (EOS, EOT, EOM, <|im_end|>, ...). */
int llm_vocab_is_eog(const llm_vocab *v, int32_t id);
int llm_vocab_token_type(const llm_vocab *v, int32_t id);
/* The stored token text (not NUL-terminated); len 0 for a bad id. */
gguf_str llm_vocab_text(const llm_vocab *v, int32_t id);
/* The fewest tokens a text of bytes bytes can take (no token stands for
 * more bytes than the vocabulary's longest piece): a prompt that cannot
 * fit a context is refused before it is tokenized. */
size_t llm_vocab_min_tokens(const llm_vocab *v, size_t bytes);
/* GPT-2 byte-level BPE vocabularies write byte b as this printable
 * codepoint (the model maker builds such a vocabulary). */
uint32_t llm_vocab_byte_cp(uint8_t b);
/* Id of an exact token text, or -1. */
int32_t llm_vocab_find(const llm_vocab *v, const char *text, size_t len);

/* Tokenizes len bytes of text. add_special: prepend BOS / append EOS as the
 * vocab's flags say. parse_special: recognise control-token texts
 * ("<|eot_id|>") inside the text. On success *ids (malloc'd) holds *n ids. */
llm_status llm_tokenize(const llm_vocab *v, const char *text, size_t len, int add_special, int parse_special,
                        int32_t **ids, int *n, llm_error *err);

/* Calls fn once per word of the BPE pre-tokenizer's split of text, in
 * order (SPM vocabs: one call with the whole text). For tests and debugging:
 * lets the split be compared with the reference regular expressions. */
llm_status llm_vocab_pretokenize(const llm_vocab *v, const char *text, size_t len,
                                 void (*fn)(void *ctx, const char *word, size_t n), void *ctx, llm_error *err);

/* llm_tokenize with parse_special on, except that no control token is
 * recognised whose bytes touch one of the n_plain spans (sorted, disjoint):
 * a chat's message contents, so that a user who writes "<|im_end|>" gets
 * those characters, not the control token (the template's own markup
 * still is one). Text without control-token texts in the spans tokenizes
 * exactly as with llm_tokenize(..., 1, ...). */
llm_status llm_tokenize_guarded(const llm_vocab *v, const char *text, size_t len, int add_special, const llm_span *plain,
                                int n_plain, int32_t **ids, int *n, llm_error *err);

/* Bytes of one token as text: control tokens give "" unless `special`.
 * Writes at most cap bytes to buf and returns the full length, which
 * may exceed cap (call again with a bigger buffer), or -1 for a bad id. */
int llm_token_to_piece(const llm_vocab *v, int32_t id, int special, char *buf, size_t cap);

/* Concatenated pieces of ids, NUL-terminated, malloc'd; for SentencePiece
 * vocabs the space prefix the tokenizer adds is removed from the start. NULL
 * on allocation failure or a bad id (err says which). */
char *llm_detokenize(const llm_vocab *v, const int32_t *ids, int n, int special, size_t *len, llm_error *err);

#endif
