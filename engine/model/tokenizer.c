/* tokenizer.c - vocab loading from GGUF, special-token splitting, and
 * detokenization. The per-family algorithms are in tok_spm.c / tok_bpe.c. */
#include <string.h>

#include "tokenizer_impl.h"
#include "unicode.h"

void tok_push(tok_out *o, int32_t id)
{
    if (o->oom)
        return;
    if (o->n == o->cap) {
        int cap = o->cap ? o->cap * 2 : 64;
        int32_t *p = (size_t)cap <= LLM_TOKENIZE_MAX_BYTES ? realloc(o->ids, sizeof(int32_t) * (size_t)cap) : NULL;
        if (!p) {
            o->oom = 1;
            return;
        }
        o->ids = p;
        o->cap = cap;
    }
    o->ids[o->n++] = id;
}

/* ---- loading ------------------------------------------------------------- */

static const gguf_kv *find_array(const gguf_file *f, const char *key, gguf_type t, uint64_t n, llm_error *err,
                                 llm_status *st)
{
    const gguf_kv *kv = gguf_find(f, key);
    *st = LLM_OK;
    if (!kv)
        return NULL;
    if (kv->type != GGUF_TYPE_ARRAY || kv->arr_type != t || (n && kv->arr_n != n)) {
        *st = llm_errf(err, LLM_ERR_FORMAT, "%s: %s must be an array of %llu %s (has %s of %llu %s)", gguf_name(f),
                       key, (unsigned long long)n, gguf_type_name(t), gguf_type_name(kv->type),
                       (unsigned long long)kv->arr_n, gguf_type_name(kv->arr_type));
        return NULL;
    }
    return kv;
}

static int32_t get_id(const gguf_file *f, const char *key, int32_t def, int n, llm_status *st, llm_error *err)
{
    uint64_t x;
    llm_status s = gguf_get_u64(f, key, &x, err);
    if (s == LLM_ERR_INVALID_ARG)
        return def;
    if (s) {
        *st = s;
        return -1;
    }
    /* 0xFFFFFFFF and other out-of-range ids mean "none" in real files */
    return x < (uint64_t)n ? (int32_t)x : -1;
}

static int get_flag(const gguf_file *f, const char *key, int def)
{
    int b;
    return gguf_get_bool(f, key, &b, NULL) == LLM_OK ? b : def;
}

static llm_status load_pre(llm_vocab *v, const gguf_file *f, llm_error *err)
{
    static const struct { const char *name; tok_pre pre; } names[] = {
        {"gpt-2", PRE_GPT2}, {"gpt2", PRE_GPT2}, {"mpt", PRE_GPT2}, {"olmo", PRE_GPT2}, {"jais", PRE_GPT2},
        {"phi-2", PRE_GPT2}, {"roberta-bpe", PRE_GPT2}, {"starcoder", PRE_STARCODER},
        {"refact", PRE_STARCODER}, {"command-r", PRE_STARCODER}, {"smollm", PRE_STARCODER},
        {"codeshell", PRE_STARCODER}, {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3},
        {"llama-bpe", PRE_LLAMA3}, {"smaug-bpe", PRE_LLAMA3}, {"falcon3", PRE_LLAMA3},
        {"qwen2", PRE_QWEN2}, {"deepseek-r1-qwen", PRE_QWEN2},
    };
    gguf_str pre = {0, ""};
    llm_status st = gguf_get_str(f, "tokenizer.ggml.pre", &pre, err);
    if (st && st != LLM_ERR_INVALID_ARG)
        return st;
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (gguf_str_eq(pre, names[i].name)) {
            v->pre = names[i].pre;
            v->pre_name = names[i].name;
            v->ignore_merges = v->pre == PRE_LLAMA3;
            return LLM_OK;
        }
    return llm_errf(err, LLM_ERR_UNSUPPORTED,
                    "%s: BPE pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported; supported: gpt-2, mpt, "
                    "olmo, starcoder, refact, smollm, command-r, llama3/llama-bpe, qwen2", gguf_name(f),
                    (int)pre.len, pre.data);
}

static llm_status load_model_type(llm_vocab *v, const gguf_file *f, llm_error *err)
{
    gguf_str model;
    llm_status st = gguf_get_str(f, "tokenizer.ggml.model", &model, err);
    if (st == LLM_ERR_INVALID_ARG)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: missing tokenizer.ggml.model", gguf_name(f));
    if (st)
        return st;
    if (gguf_str_eq(model, "llama")) {
        v->type = LLM_VOCAB_SPM;
        v->pre = PRE_SPM;
        v->pre_name = "spm";
        return LLM_OK;
    }
    if (gguf_str_eq(model, "gpt2")) {
        v->type = LLM_VOCAB_BPE;
        return load_pre(v, f, err);
    }
    return llm_errf(err, LLM_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' not supported (llama, gpt2)",
                    gguf_name(f), (int)model.len, model.data);
}

static llm_status load_arrays(llm_vocab *v, const gguf_file *f, llm_error *err)
{
    llm_status st;
    const gguf_kv *toks = find_array(f, "tokenizer.ggml.tokens", GGUF_TYPE_STRING, 0, err, &st);
    if (st)
        return st;
    if (!toks || toks->arr_n == 0 || toks->arr_n > (1u << 24))
        return llm_errf(err, LLM_ERR_FORMAT, "%s: tokenizer.ggml.tokens missing or of bad size", gguf_name(f));
    v->n = (int)toks->arr_n;
    v->text = toks->strs;
    const gguf_kv *sc = find_array(f, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, toks->arr_n, err, &st);
    if (st)
        return st;
    const gguf_kv *ty = find_array(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, toks->arr_n, err, &st);
    if (st)
        return st;
    v->scores = calloc((size_t)v->n, sizeof(float));
    v->types = malloc(sizeof(int32_t) * (size_t)v->n);
    if (!v->scores || !v->types || llm_strmap_init(&v->tokens, (size_t)v->n))
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for %d tokens", gguf_name(f), v->n);
    if (sc)
        memcpy(v->scores, sc->arr_data, sizeof(float) * (size_t)v->n);
    for (int i = 0; i < v->n; i++) {
        if (ty)
            memcpy(&v->types[i], (const char *)ty->arr_data + 4 * (size_t)i, 4);
        else
            v->types[i] = LLM_TOKEN_NORMAL;
        llm_strmap_put(&v->tokens, v->text[i].data, v->text[i].len, i);
    }
    return LLM_OK;
}

static llm_status load_merges(llm_vocab *v, const gguf_file *f, llm_error *err)
{
    llm_status st;
    const gguf_kv *m = find_array(f, "tokenizer.ggml.merges", GGUF_TYPE_STRING, 0, err, &st);
    if (st)
        return st;
    if (!m)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: BPE vocab without tokenizer.ggml.merges", gguf_name(f));
    if (llm_strmap_init(&v->merges, m->arr_n))
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for merges", gguf_name(f));
    for (uint64_t i = 0; i < m->arr_n; i++) {
        gguf_str s = m->strs[i];
        if (!memchr(s.data, ' ', s.len))
            return llm_errf(err, LLM_ERR_FORMAT, "%s: merge %llu ('%.*s') has no space separator", gguf_name(f),
                            (unsigned long long)i, (int)(s.len > 40 ? 40 : s.len), s.data);
        llm_strmap_put(&v->merges, s.data, s.len, (int32_t)i);
    }
    return LLM_OK;
}

static void load_byte_tokens(llm_vocab *v)
{
    for (int b = 0; b < 256; b++) {
        char buf[8];
        int n;
        if (v->type == LLM_VOCAB_SPM)
            n = snprintf(buf, sizeof buf, "<0x%02X>", b);
        else
            n = llm_utf8_encode(unicode_byte_to_cp((uint8_t)b), buf);
        v->byte_tok[b] = llm_strmap_get(&v->tokens, buf, (size_t)n);
    }
}

/* A trie node: one byte of a special token's text. */
struct tok_trie {
    int32_t child, sibling; /* first child, next sibling (0: none; the root is no one's child) */
    int32_t token;          /* the token whose text ends here, -1 when none */
    uint8_t byte;
};

static int is_special(const llm_vocab *v, int i)
{
    int t = v->types[i];
    return (t == LLM_TOKEN_CONTROL || t == LLM_TOKEN_USER_DEFINED || t == LLM_TOKEN_UNKNOWN) && v->text[i].len;
}

/* The child of node k for byte b, made when missing (the caller sized the
 * trie for every byte of every text). */
static int32_t trie_child(llm_vocab *v, int32_t k, uint8_t b)
{
    int32_t c = k ? v->trie[k].child : v->trie_first[b];
    while (c && v->trie[c].byte != b) c = v->trie[c].sibling;
    if (c)
        return c;
    c = v->n_trie++;
    v->trie[c] = (struct tok_trie){.child = 0, .sibling = k ? v->trie[k].child : 0, .token = -1, .byte = b};
    if (k)
        v->trie[k].child = c;
    else
        v->trie_first[b] = c;
    return c;
}

/* Builds the trie of the special tokens' texts. A text that two tokens
 * share keeps the lower id (the first, as the reference's list order). */
static llm_status load_specials(llm_vocab *v, llm_error *err)
{
    size_t nodes = 1;
    for (int i = 0; i < v->n; i++)
        if (is_special(v, i))
            nodes += v->text[i].len;
    if (nodes > INT32_MAX || !(v->trie = malloc(sizeof *v->trie * nodes)))
        return llm_errf(err, LLM_ERR_NOMEM, "vocab: no memory for the special tokens' trie (%zu nodes)", nodes);
    v->trie[0] = (struct tok_trie){.token = -1};
    v->n_trie = 1;
    for (int i = 0; i < v->n; i++) {
        if (!is_special(v, i))
            continue;
        int32_t k = 0;
        for (uint64_t j = 0; j < v->text[i].len; j++) k = trie_child(v, k, (uint8_t)v->text[i].data[j]);
        if (v->trie[k].token < 0)
            v->trie[k].token = i;
    }
    return LLM_OK;
}

static llm_status load_ids(llm_vocab *v, const gguf_file *f, llm_error *err)
{
    llm_status st = LLM_OK;
    int spm = v->type == LLM_VOCAB_SPM;
    v->bos = get_id(f, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, v->n, &st, err);
    v->eos = get_id(f, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, v->n, &st, err);
    v->unk = get_id(f, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, v->n, &st, err);
    v->eot = get_id(f, "tokenizer.ggml.eot_token_id", -1, v->n, &st, err);
    v->eom = get_id(f, "tokenizer.ggml.eom_token_id", -1, v->n, &st, err);
    v->pad = get_id(f, "tokenizer.ggml.padding_token_id", -1, v->n, &st, err);
    v->add_bos = get_flag(f, "tokenizer.ggml.add_bos_token", spm);
    v->add_eos = get_flag(f, "tokenizer.ggml.add_eos_token", 0);
    v->add_space_prefix = get_flag(f, "tokenizer.ggml.add_space_prefix", spm);
    return st;
}

/* The most bytes of text one token stands for: its longest piece, and at
 * least a whole UTF-8 character (an unknown one becomes one token). */
static void load_max_piece(llm_vocab *v)
{
    char buf[8];
    v->max_piece = 4;
    for (int i = 0; i < v->n; i++) {
        int k = llm_token_to_piece(v, i, 1, buf, sizeof buf);
        if (k > v->max_piece)
            v->max_piece = k;
    }
}

uint32_t llm_vocab_byte_cp(uint8_t b) { return unicode_byte_to_cp(b); }

size_t llm_vocab_min_tokens(const llm_vocab *v, size_t bytes)
{
    return bytes / (size_t)v->max_piece + (bytes % (size_t)v->max_piece != 0);
}

llm_status llm_vocab_load(const gguf_file *f, llm_vocab **out, llm_error *err)
{
    *out = NULL;
    llm_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return llm_errf(err, LLM_ERR_NOMEM, "vocab: no memory");
    llm_status st;
    if ((st = load_model_type(v, f, err)) || (st = load_arrays(v, f, err)) ||
        (v->type == LLM_VOCAB_BPE && (st = load_merges(v, f, err))) || (st = load_ids(v, f, err)) ||
        (st = load_specials(v, err))) {
        llm_vocab_free(v);
        return st;
    }
    load_byte_tokens(v);
    load_max_piece(v);
    *out = v;
    return LLM_OK;
}

void llm_vocab_free(llm_vocab *v)
{
    if (!v)
        return;
    free(v->scores);
    free(v->types);
    free(v->trie);
    llm_strmap_free(&v->tokens);
    llm_strmap_free(&v->merges);
    free(v);
}

int llm_vocab_n(const llm_vocab *v) { return v->n; }
llm_vocab_type llm_vocab_kind(const llm_vocab *v) { return v->type; }
const char *llm_vocab_pre_name(const llm_vocab *v) { return v->pre_name; }
int32_t llm_vocab_bos(const llm_vocab *v) { return v->bos; }
int32_t llm_vocab_eos(const llm_vocab *v) { return v->eos; }
int llm_vocab_add_bos(const llm_vocab *v) { return v->add_bos && v->bos >= 0; }
int llm_vocab_add_eos(const llm_vocab *v) { return v->add_eos && v->eos >= 0; }
int llm_vocab_token_type(const llm_vocab *v, int32_t id) { return id >= 0 && id < v->n ? v->types[id] : 0; }
int32_t llm_vocab_find(const llm_vocab *v, const char *text, size_t len) { return llm_strmap_get(&v->tokens, text, len); }

gguf_str llm_vocab_text(const llm_vocab *v, int32_t id)
{
    gguf_str none = {0, ""};
    return id >= 0 && id < v->n ? v->text[id] : none;
}

int llm_vocab_is_eog(const llm_vocab *v, int32_t id)
{
    static const char *eog_texts[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                      "<|eom_id|>", "<EOT>"};
    if (id < 0 || id >= v->n)
        return 0;
    if (id == v->eos || id == v->eot || id == v->eom)
        return 1;
    if (v->types[id] != LLM_TOKEN_CONTROL && v->types[id] != LLM_TOKEN_USER_DEFINED)
        return 0;
    for (size_t i = 0; i < sizeof eog_texts / sizeof *eog_texts; i++)
        if (gguf_str_eq(v->text[id], eog_texts[i]))
            return 1;
    return 0;
}

/* ---- tokenize ------------------------------------------------------------ */

/* Finds the longest special token text at text[pos]; -1 if none.
 * User-defined tokens (added words, whitespace runs) always match, as in the
 * reference; control tokens only when parse_special. A walk down the trie:
 * at most the longest special text's bytes per position. */
static int32_t special_at(const llm_vocab *v, const char *text, size_t len, size_t pos, int parse_special)
{
    int32_t best = -1, k = v->trie_first[(unsigned char)text[pos]];
    for (size_t i = pos; k; ) {
        int32_t t = v->trie[k].token;
        if (t >= 0 && (parse_special || v->types[t] == LLM_TOKEN_USER_DEFINED))
            best = t;
        if (++i == len)
            break;
        for (k = v->trie[k].child; k && v->trie[k].byte != (uint8_t)text[i];) k = v->trie[k].sibling;
    }
    return best;
}

static void tok_fragment(const llm_vocab *v, const char *text, size_t len, int after_special, tok_out *o)
{
    if (len == 0)
        return;
    if (v->type == LLM_VOCAB_SPM)
        tok_spm(v, text, len, v->add_space_prefix && after_special, o);
    else
        tok_bpe(v, text, len, o);
}

static llm_status tokenize(const llm_vocab *v, const char *text, size_t len, int add_special, int parse_special,
                           const llm_span *plain, int n_plain, int32_t **ids, int *n, llm_error *err);

/* Whether [pos, end) touches one of the spans (sorted); *at is where the
 * search starts and moves forward with pos. */
static int in_spans(const llm_span *sp, int n, int *at, size_t pos, size_t end)
{
    while (*at < n && sp[*at].end <= pos)
        (*at)++;
    return *at < n && sp[*at].start < end;
}

llm_status llm_tokenize(const llm_vocab *v, const char *text, size_t len, int add_special, int parse_special,
                        int32_t **ids, int *n, llm_error *err)
{
    return parse_special ? llm_tokenize_guarded(v, text, len, add_special, NULL, 0, ids, n, err)
                         : tokenize(v, text, len, add_special, 0, NULL, 0, ids, n, err);
}

llm_status llm_tokenize_guarded(const llm_vocab *v, const char *text, size_t len, int add_special, const llm_span *plain,
                                int n_plain, int32_t **ids, int *n, llm_error *err)
{
    return tokenize(v, text, len, add_special, 1, plain, n_plain, ids, n, err);
}

static llm_status tokenize(const llm_vocab *v, const char *text, size_t len, int add_special, int parse_special,
                           const llm_span *plain, int n_plain, int32_t **ids, int *n, llm_error *err)
{
    *ids = NULL;
    *n = 0;
    if (len > LLM_TOKENIZE_MAX_BYTES)
        return llm_errf(err, LLM_ERR_TOO_LONG, "tokenize: text of %zu bytes exceeds the limit of %u", len,
                        LLM_TOKENIZE_MAX_BYTES);
    tok_out o = {0};
    if (add_special && llm_vocab_add_bos(v))
        tok_push(&o, v->bos);
    size_t start = 0;
    int after_special = 1, at = 0; /* SPM adds its space prefix only at a text start */
    for (size_t pos = 0; pos < len; pos++) {
        int32_t sp = special_at(v, text, len, pos, parse_special);
        if (sp >= 0 && v->types[sp] != LLM_TOKEN_USER_DEFINED && in_spans(plain, n_plain, &at, pos, pos + v->text[sp].len))
            sp = special_at(v, text, len, pos, 0); /* in a plain span: only what parse_special 0 would find */
        if (sp < 0)
            continue;
        tok_fragment(v, text + start, pos - start, after_special, &o);
        tok_push(&o, sp);
        pos += v->text[sp].len - 1;
        start = pos + 1;
        after_special = 1;
    }
    if (start < len)
        tok_fragment(v, text + start, len - start, after_special, &o);
    if (add_special && llm_vocab_add_eos(v))
        tok_push(&o, v->eos);
    if (o.oom) {
        free(o.ids);
        return llm_errf(err, LLM_ERR_NOMEM, "tokenize: no memory for the tokens of %zu bytes", len);
    }
    *ids = o.ids;
    *n = o.n;
    return LLM_OK;
}

/* ---- detokenize ---------------------------------------------------------- */

static size_t put(char *buf, size_t cap, size_t at, const char *s, size_t n)
{
    if (at < cap)
        memcpy(buf + at, s, at + n <= cap ? n : cap - at);
    return at + n;
}

/* SentencePiece text: U+2581 becomes a space. */
static size_t piece_spm(gguf_str s, char *buf, size_t cap)
{
    size_t at = 0;
    for (size_t i = 0; i < s.len;) {
        if (s.len - i >= 3 && !memcmp(s.data + i, "\xe2\x96\x81", 3)) {
            at = put(buf, cap, at, " ", 1);
            i += 3;
        } else {
            at = put(buf, cap, at, s.data + i, 1);
            i++;
        }
    }
    return at;
}

/* Byte-level BPE text: each codepoint maps back to one byte. */
static size_t piece_bpe(gguf_str s, char *buf, size_t cap)
{
    size_t at = 0, pos = 0;
    while (pos < s.len) {
        size_t p0 = pos;
        int b = unicode_cp_to_byte(llm_utf8_decode(s.data, s.len, &pos));
        if (b >= 0) {
            char c = (char)b;
            at = put(buf, cap, at, &c, 1);
        } else { /* not a mapped byte: keep the text as is */
            at = put(buf, cap, at, s.data + p0, pos - p0);
        }
    }
    return at;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int llm_token_to_piece(const llm_vocab *v, int32_t id, int special, char *buf, size_t cap)
{
    if (id < 0 || id >= v->n)
        return -1;
    gguf_str s = v->text[id];
    switch (v->types[id]) {
    case LLM_TOKEN_CONTROL:
        return special ? (int)put(buf, cap, 0, s.data, s.len) : 0;
    case LLM_TOKEN_USER_DEFINED:
        return (int)put(buf, cap, 0, s.data, s.len);
    case LLM_TOKEN_UNKNOWN:
        return v->type == LLM_VOCAB_SPM ? (int)put(buf, cap, 0, " \xe2\x81\x87 ", 5) : (int)put(buf, cap, 0, s.data, s.len);
    case LLM_TOKEN_BYTE:
        if (v->type == LLM_VOCAB_SPM && s.len == 6 && hexval(s.data[3]) >= 0 && hexval(s.data[4]) >= 0) {
            char c = (char)(hexval(s.data[3]) * 16 + hexval(s.data[4]));
            return (int)put(buf, cap, 0, &c, 1);
        }
        return (int)put(buf, cap, 0, s.data, s.len);
    case LLM_TOKEN_UNUSED:
        return 0;
    default:
        return (int)(v->type == LLM_VOCAB_SPM ? piece_spm(s, buf, cap) : piece_bpe(s, buf, cap));
    }
}

char *llm_detokenize(const llm_vocab *v, const int32_t *ids, int n, int special, size_t *len, llm_error *err)
{
    size_t cap = 256, at = 0;
    int strip = v->type == LLM_VOCAB_SPM && v->add_space_prefix;
    char *out = malloc(cap);
    if (!out) {
        llm_errf(err, LLM_ERR_NOMEM, "detokenize: no memory");
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        int k = llm_token_to_piece(v, ids[i], special, out + at, cap - at - 1);
        if (k < 0) {
            free(out);
            llm_errf(err, LLM_ERR_INVALID_ARG, "detokenize: token id %d at index %d not in [0, %d)", ids[i], i, v->n);
            return NULL;
        }
        if (at + (size_t)k + 1 > cap) {
            while (at + (size_t)k + 1 > cap) cap *= 2;
            char *p = realloc(out, cap);
            if (!p) {
                free(out);
                llm_errf(err, LLM_ERR_NOMEM, "detokenize: no memory");
                return NULL;
            }
            out = p;
            k = llm_token_to_piece(v, ids[i], special, out + at, cap - at - 1);
        }
        /* the tokenizer added this space; the text did not have it */
        if (strip && k > 0) {
            strip = 0;
            if (out[at] == ' ') {
                memmove(out + at, out + at + 1, (size_t)k - 1);
                k--;
            }
        }
        at += (size_t)k;
    }
    out[at] = 0;
    if (len)
        *len = at;
    return out;
}

typedef struct pretok_ctx {
    const char *text;
    void (*fn)(void *, const char *, size_t);
    void *ctx;
} pretok_ctx;

static void pretok_word(void *ctx, size_t b0, size_t b1)
{
    pretok_ctx *c = ctx;
    c->fn(c->ctx, c->text + b0, b1 - b0);
}

llm_status llm_vocab_pretokenize(const llm_vocab *v, const char *text, size_t len,
                                 void (*fn)(void *ctx, const char *word, size_t n), void *ctx, llm_error *err)
{
    if (v->type == LLM_VOCAB_SPM) {
        fn(ctx, text, len);
        return LLM_OK;
    }
    pretok_ctx c = {text, fn, ctx};
    if (tok_bpe_split(v, text, len, pretok_word, &c))
        return llm_errf(err, LLM_ERR_NOMEM, "pretokenize: no memory for %zu bytes", len);
    return LLM_OK;
}
