/* tok_spm.c - SentencePiece-style tokenization: start from UTF-8
 * characters, repeatedly merge the adjacent pair whose concatenation is the
 * highest-scoring vocab entry (leftmost on ties), then emit each symbol's id,
 * falling back to <0xXX> byte tokens for symbols not in the vocab. */
#include <string.h>

#include "tok_heap.h"
#include "tokenizer_impl.h"
#include "unicode.h"

static void add_bigram(const llm_vocab *v, tok_sym *sym, int l, int r, tok_heap *h)
{
    if (l < 0 || r < 0)
        return;
    int32_t id = llm_strmap_get(&v->tokens, sym[l].text, sym[l].n + sym[r].n);
    if (id < 0)
        return;
    tok_heap_push(h, (tok_bigram){-(double)v->scores[id], l, r, sym[l].n + sym[r].n});
}

static void emit(const llm_vocab *v, const tok_sym *s, tok_out *o)
{
    int32_t id = llm_strmap_get(&v->tokens, s->text, s->n);
    if (id >= 0) {
        tok_push(o, id);
        return;
    }
    for (size_t i = 0; i < s->n; i++) {
        int32_t b = v->byte_tok[(unsigned char)s->text[i]];
        tok_push(o, b >= 0 ? b : v->unk);
    }
}

/* Spaces become U+2581; optionally one is prepended. Returns malloc'd text. */
static char *escape(const char *text, size_t len, int prefix, size_t *out_len)
{
    size_t spaces = (size_t)prefix;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    char *e = malloc(len + 2 * spaces + 1);
    if (!e)
        return NULL;
    size_t k = 0;
    if (prefix) {
        memcpy(e, "\xe2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(e + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            e[k++] = text[i];
        }
    }
    *out_len = k;
    return e;
}

void tok_spm(const llm_vocab *v, const char *text, size_t len, int prefix_space, tok_out *o)
{
    size_t n = 0;
    char *e = escape(text, len, prefix_space, &n);
    tok_sym *sym = malloc(sizeof *sym * (n ? n : 1));
    tok_heap h = {0};
    if (!e || !sym) {
        o->oom = 1;
        goto out;
    }
    int ns = 0;
    for (size_t pos = 0; pos < n; ns++) {
        size_t cl = (size_t)llm_utf8_seq_len((unsigned char)e[pos]);
        if (cl > n - pos)
            cl = n - pos;
        sym[ns] = (tok_sym){ns - 1, ns + 1, e + pos, cl};
        pos += cl;
    }
    if (ns)
        sym[ns - 1].next = -1;
    for (int i = 1; i < ns; i++) add_bigram(v, sym, i - 1, i, &h);
    while (h.n) {
        tok_bigram b = tok_heap_pop(&h);
        tok_sym *l = &sym[b.left], *r = &sym[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size || l->next != b.right)
            continue; /* stale: one side was merged elsewhere since */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0)
            sym[r->next].prev = b.left;
        add_bigram(v, sym, l->prev, b.left, &h);
        add_bigram(v, sym, b.left, l->next, &h);
    }
    o->oom |= h.oom;
    for (int i = ns ? 0 : -1; i >= 0; i = sym[i].next) emit(v, &sym[i], o);
out:
    free(h.a);
    free(sym);
    free(e);
}
