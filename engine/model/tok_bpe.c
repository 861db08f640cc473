/* tok_bpe.c - byte-level BPE: a pre-tokenizer splits the text into words
 * (hand-written equivalents of the reference regular expressions, one per
 * tokenizer.ggml.pre family), each word's bytes are mapped to printable
 * codepoints, and adjacent symbols are merged in merge-rank order. */
#include <string.h>

#include "tok_heap.h"
#include "tokenizer_impl.h"
#include "unicode.h"

#define OOR 0xFFFFFFFFu

/* The text as codepoints, seen through the window [a, b). */
typedef struct cp_text {
    const uint32_t *cp;
    const int *fl;
    const size_t *off; /* byte offset of each codepoint, off[n] = byte length */
    size_t a, b;
} cp_text;

typedef void (*word_fn)(void *ctx, size_t start, size_t end);

static uint32_t cp_at(const cp_text *t, size_t i) { return i < t->b ? t->cp[i] : OOR; }
static int fl_at(const cp_text *t, size_t i) { return i < t->b ? t->fl[i] : 0; }
static int lower(uint32_t c) { return c < 128 && c >= 'A' && c <= 'Z' ? (int)(c + 32) : (int)c; }

/* 's 't 're 've 'm 'll 'd (case-insensitive when ci); returns length or 0. */
static size_t contraction(const cp_text *t, size_t pos, int ci)
{
    if (cp_at(t, pos) != '\'')
        return 0;
    int c1 = (int)cp_at(t, pos + 1), c2 = (int)cp_at(t, pos + 2);
    if (cp_at(t, pos + 1) == OOR)
        return 0;
    if (ci) {
        c1 = lower((uint32_t)c1);
        c2 = lower((uint32_t)c2);
    }
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd')
        return 2;
    if (cp_at(t, pos + 2) != OOR && ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')))
        return 3;
    return 0;
}

#define IS(f, m) (((f) & (m)) != 0)
#define SLN (UC_SPACE | UC_LETTER | UC_NUMBER)

/* Whitespace tail shared by both families: \s+(?!\S) then \s+. */
static size_t split_spaces(const cp_text *t, size_t pos)
{
    size_t n = 0;
    while (IS(fl_at(t, pos + n), UC_SPACE)) n++;
    if (n > 1 && cp_at(t, pos + n) != OOR)
        return pos + n - 1;
    return pos + (n ? n : 1);
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static void split_gpt2(const cp_text *t, word_fn fn, void *ctx)
{
    for (size_t pos = t->a; pos < t->b;) {
        size_t start = pos, c = contraction(t, pos, 0);
        uint32_t cpt = cp_at(t, pos);
        int f2 = cpt == ' ' ? fl_at(t, pos + 1) : fl_at(t, pos);
        if (c) {
            pos += c;
        } else if (IS(f2, UC_LETTER) || IS(f2, UC_NUMBER)) {
            int want = IS(f2, UC_LETTER) ? UC_LETTER : UC_NUMBER;
            pos += cpt == ' ';
            while (IS(fl_at(t, pos), want)) pos++;
        } else if (!IS(f2, SLN) && f2) {
            pos += cpt == ' ';
            while (!IS(fl_at(t, pos), SLN) && fl_at(t, pos)) pos++;
        } else {
            pos = split_spaces(t, pos);
        }
        fn(ctx, start, pos);
    }
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
 *  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t llama3_word(const cp_text *t, size_t pos, int max_digits)
{
    uint32_t cpt = cp_at(t, pos);
    int f = fl_at(t, pos);
    size_t c = contraction(t, pos, 1);
    if (c)
        return pos + c;
    if (!(cpt == '\r' || cpt == '\n' || IS(f, UC_NUMBER)) && (IS(f, UC_LETTER) || IS(fl_at(t, pos + 1), UC_LETTER))) {
        pos++;
        while (IS(fl_at(t, pos), UC_LETTER)) pos++;
        return pos;
    }
    if (IS(f, UC_NUMBER)) {
        for (int i = 0; i < max_digits && IS(fl_at(t, pos), UC_NUMBER); i++) pos++;
        return pos;
    }
    int f2 = cpt == ' ' ? fl_at(t, pos + 1) : f;
    if (!IS(f2, SLN) && f2) {
        pos += cpt == ' ';
        while (!IS(fl_at(t, pos), SLN) && fl_at(t, pos)) pos++;
        while (cp_at(t, pos) == '\r' || cp_at(t, pos) == '\n') pos++;
        return pos;
    }
    size_t n = 0, last_nl = 0;
    for (; IS(fl_at(t, pos + n), UC_SPACE); n++)
        if (cp_at(t, pos + n) == '\r' || cp_at(t, pos + n) == '\n')
            last_nl = pos + n + 1;
    if (last_nl)
        return last_nl;
    return split_spaces(t, pos);
}

static void split_llama3(const cp_text *t, int max_digits, word_fn fn, void *ctx)
{
    for (size_t pos = t->a; pos < t->b;) {
        size_t end = llama3_word(t, pos, max_digits);
        fn(ctx, pos, end);
        pos = end;
    }
}

/* \p{N} first (each digit alone), then gpt-2 on what lies between. */
static void split_starcoder(const cp_text *t, word_fn fn, void *ctx)
{
    size_t a = t->a;
    for (size_t pos = t->a; pos <= t->b; pos++) {
        if (pos < t->b && !IS(t->fl[pos], UC_NUMBER))
            continue;
        cp_text sub = *t;
        sub.a = a;
        sub.b = pos;
        split_gpt2(&sub, fn, ctx);
        if (pos < t->b)
            fn(ctx, pos, pos + 1);
        a = pos + 1;
    }
}

/* ---- merging ------------------------------------------------------------- */

typedef struct bpe_ctx {
    const llm_vocab *v;
    const char *text;
    tok_out *o;
    char *buf;  /* byte-mapped word */
    tok_sym *sym;
    tok_heap h;
    char *pair; /* "left right" lookup key */
} bpe_ctx;

static int32_t merge_rank(bpe_ctx *c, const tok_sym *l, const tok_sym *r)
{
    memcpy(c->pair, l->text, l->n);
    c->pair[l->n] = ' ';
    memcpy(c->pair + l->n + 1, r->text, r->n);
    return llm_strmap_get(&c->v->merges, c->pair, l->n + 1 + r->n);
}

static void add_bigram(bpe_ctx *c, int l, int r)
{
    if (l < 0 || r < 0)
        return;
    int32_t rank = merge_rank(c, &c->sym[l], &c->sym[r]);
    if (rank >= 0)
        tok_heap_push(&c->h, (tok_bigram){(double)rank, l, r, c->sym[l].n + c->sym[r].n});
}

static void emit_symbol(bpe_ctx *c, const tok_sym *s)
{
    int32_t id = llm_strmap_get(&c->v->tokens, s->text, s->n);
    if (id >= 0) {
        tok_push(c->o, id);
        return;
    }
    for (size_t i = 0; i < s->n; i++) { /* as the reference: single bytes that are tokens */
        int32_t b = llm_strmap_get(&c->v->tokens, s->text + i, 1);
        if (b >= 0)
            tok_push(c->o, b);
    }
}

static void merge_word(bpe_ctx *c, size_t n)
{
    int ns = 0;
    for (size_t pos = 0; pos < n; ns++) {
        size_t cl = (size_t)llm_utf8_seq_len((unsigned char)c->buf[pos]);
        if (cl > n - pos)
            cl = n - pos;
        c->sym[ns] = (tok_sym){ns - 1, ns + 1, c->buf + pos, cl};
        pos += cl;
    }
    c->sym[ns - 1].next = -1;
    c->h.n = 0;
    for (int i = 1; i < ns; i++) add_bigram(c, i - 1, i);
    while (c->h.n) {
        tok_bigram b = tok_heap_pop(&c->h);
        tok_sym *l = &c->sym[b.left], *r = &c->sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size || l->next != b.right)
            continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            c->sym[r->next].prev = b.left;
        add_bigram(c, l->prev, b.left);
        add_bigram(c, b.left, l->next);
    }
    c->o->oom |= c->h.oom;
    for (int i = 0; i >= 0; i = c->sym[i].next) emit_symbol(c, &c->sym[i]);
}

/* Maps the word's bytes [b0, b1) to GPT-2 codepoints and merges them. */
static void on_word(void *ctx, size_t b0, size_t b1)
{
    bpe_ctx *c = ctx;
    size_t n = 0;
    for (size_t i = b0; i < b1; i++)
        n += (size_t)llm_utf8_encode(unicode_byte_to_cp((uint8_t)c->text[i]), c->buf + n);
    if (n == 0)
        return;
    int32_t whole = c->v->ignore_merges ? llm_strmap_get(&c->v->tokens, c->buf, n) : -1;
    if (whole >= 0)
        tok_push(c->o, whole);
    else
        merge_word(c, n);
}

typedef struct split_state {
    uint32_t *cp;
    int *fl;
    size_t *off;
} split_state;

static void split_free(split_state *s)
{
    free(s->cp);
    free(s->fl);
    free(s->off);
}

/* Decodes text and runs the vocab's pre-tokenizer; fn gets codepoint spans. */
static int split_text(const llm_vocab *v, const char *text, size_t len, split_state *s, word_fn fn, void *ctx)
{
    s->cp = malloc(sizeof *s->cp * (len + 1));
    s->fl = malloc(sizeof *s->fl * (len + 1));
    s->off = malloc(sizeof *s->off * (len + 1));
    if (!s->cp || !s->fl || !s->off)
        return -1;
    size_t n = 0;
    for (size_t pos = 0; pos < len; n++) {
        s->off[n] = pos;
        s->cp[n] = llm_utf8_decode(text, len, &pos);
        s->fl[n] = unicode_flags(s->cp[n]);
    }
    s->off[n] = len;
    cp_text t = {s->cp, s->fl, s->off, 0, n};
    if (v->pre == PRE_LLAMA3 || v->pre == PRE_QWEN2)
        split_llama3(&t, v->pre == PRE_LLAMA3 ? 3 : 1, fn, ctx);
    else if (v->pre == PRE_STARCODER)
        split_starcoder(&t, fn, ctx);
    else
        split_gpt2(&t, fn, ctx);
    return 0;
}

typedef struct span_ctx {
    split_state *s;
    void (*fn)(void *, size_t, size_t);
    void *ctx;
} span_ctx;

static void on_span(void *ctx, size_t start, size_t end)
{
    span_ctx *c = ctx;
    c->fn(c->ctx, c->s->off[start], c->s->off[end]);
}

int tok_bpe_split(const llm_vocab *v, const char *text, size_t len, void (*fn)(void *, size_t, size_t), void *ctx)
{
    split_state s = {0};
    span_ctx c = {&s, fn, ctx};
    int rc = split_text(v, text, len, &s, on_span, &c);
    split_free(&s);
    return rc;
}

void tok_bpe(const llm_vocab *v, const char *text, size_t len, tok_out *o)
{
    /* a mapped byte takes at most 2 UTF-8 bytes; a pair key two words + 1 */
    bpe_ctx c = {v, text, o, malloc(2 * len + 1), malloc(sizeof(tok_sym) * (2 * len + 1)), {0}, malloc(4 * len + 2)};
    if (!c.buf || !c.sym || !c.pair || tok_bpe_split(v, text, len, on_word, &c))
        o->oom = 1;
    free(c.h.a);
    free(c.pair);
    free(c.sym);
    free(c.buf);
}
