/* tokenizer_impl.h - the vocab's internals, shared by tokenizer.c (loading,
 * special tokens, detokenization), tok_spm.c and tok_bpe.c. Not public. */
#ifndef LLM_TOKENIZER_IMPL_H
#define LLM_TOKENIZER_IMPL_H

#include "llm/strmap.h"
#include "llm/tokenizer.h"


typedef enum tok_pre {
    PRE_SPM = 0,
    PRE_GPT2,      /* gpt-2, mpt, olmo, jais, roberta-bpe, phi-2 ... */
    PRE_STARCODER, /* digits split one by one, then gpt-2 */
    PRE_LLAMA3,
    PRE_QWEN2,
} tok_pre;

struct llm_vocab {
    llm_vocab_type type;
    tok_pre pre;
    const char *pre_name;
    int n;
    const gguf_str *text;   /* borrowed from the gguf file */
    float *scores;          /* owned; NULL when absent */
    int32_t *types;         /* owned */
    llm_strmap tokens;          /* text -> id */
    llm_strmap merges;          /* "left right" -> rank (BPE) */
    int32_t bos, eos, unk, eot, eom, pad;
    int add_bos, add_eos, add_space_prefix, ignore_merges;
    /* The special (control, user-defined, unknown) tokens' texts as a trie:
     * matching at a position walks at most the longest such text, whatever
     * the number of them (Gemma 3 has 6,000+, most starting with '<'). */
    struct tok_trie *trie;  /* owned; node 0 is the root */
    int n_trie;
    int32_t trie_first[256]; /* the root's child for each first byte; 0: none */
    int32_t byte_tok[256];  /* byte fallback tokens (-1 when missing) */
    int max_piece;          /* the most bytes of text one token stands for (llm_vocab_min_tokens) */
};

/* Growable id list with a hard cap (LLM_TOKENIZE_MAX_BYTES ids). */
typedef struct tok_out { int32_t *ids; int n, cap; int oom; } tok_out;
void tok_push(tok_out *o, int32_t id);

/* Tokenize one fragment of raw text (no special tokens inside). */
void tok_spm(const llm_vocab *v, const char *text, size_t len, int prefix_space, tok_out *o);
void tok_bpe(const llm_vocab *v, const char *text, size_t len, tok_out *o);
/* The pre-tokenizer alone: fn gets each word's byte span. 0 or -1 (oom). */
int tok_bpe_split(const llm_vocab *v, const char *text, size_t len, void (*fn)(void *, size_t, size_t), void *ctx);

#endif
