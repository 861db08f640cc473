/* srv_fields.c - the table of request fields and what each endpoint does
 * with them (see srv_fields.h). */
#include "srv_fields.h"

#include <pthread.h>
#include <string.h>

#include "llm/log.h"
#include "srv.h"

/* What a field is to an endpoint. */
typedef enum fld_use {
    FLD_USED = 1,     /* parsed and honoured */
    FLD_HINT,         /* accepted; it asks for nothing an answer shows (user, metadata, store) */
    FLD_REFUSED,      /* any value but null is a 400 */
} fld_use;

typedef struct fld {
    const char *name;
    unsigned kinds;   /* bit k: known to endpoint kind k */
    fld_use use;
    const char *why;  /* FLD_REFUSED: the error's reason */
} fld;

#define K_CMPL 1u
#define K_CHAT 2u
#define K_GEN 4u
#define K_EMB 8u
#define K_OAI (K_CMPL | K_CHAT)
#define K_ALL (K_CMPL | K_CHAT | K_GEN)

static const fld fld_table[] = {
    {"model", K_ALL | K_EMB, FLD_USED, NULL},
    {"input", K_EMB, FLD_USED, NULL},
    {"encoding_format", K_EMB, FLD_USED, NULL},
    {"dimensions", K_EMB, FLD_USED, NULL},
    {"pooling", K_EMB, FLD_USED, NULL},
    {"prompt", K_CMPL, FLD_USED, NULL},
    {"messages", K_CHAT, FLD_USED, NULL},
    {"text", K_GEN, FLD_USED, NULL},
    {"max_tokens", K_ALL, FLD_USED, NULL},
    {"max_completion_tokens", K_CHAT, FLD_USED, NULL},
    {"temperature", K_ALL, FLD_USED, NULL},
    {"top_p", K_ALL, FLD_USED, NULL},
    {"top_k", K_ALL, FLD_USED, NULL},
    {"min_p", K_ALL, FLD_USED, NULL},
    {"n", K_ALL, FLD_USED, NULL},
    {"seed", K_ALL, FLD_USED, NULL},
    {"stop", K_ALL, FLD_USED, NULL},
    {"stream", K_ALL, FLD_USED, NULL},
    {"stream_options", K_ALL, FLD_USED, NULL},
    {"logprobs", K_ALL, FLD_USED, NULL},
    {"top_logprobs", K_CHAT, FLD_USED, NULL},
    {"prompt_logprobs", K_OAI, FLD_USED, NULL},
    {"presence_penalty", K_ALL, FLD_USED, NULL},
    {"frequency_penalty", K_ALL, FLD_USED, NULL},
    {"repetition_penalty", K_ALL, FLD_USED, NULL},
    {"logit_bias", K_ALL, FLD_USED, NULL},
    {"priority", K_ALL | K_EMB, FLD_USED, NULL},
    {"ignore_eos", K_ALL, FLD_USED, NULL},
    {"cache_salt", K_ALL | K_EMB, FLD_USED, NULL},
    {"speculative", K_ALL, FLD_USED, NULL},
    {"echo", K_CMPL, FLD_USED, NULL},
    {"best_of", K_CMPL, FLD_USED, NULL},
    {"suffix", K_CMPL, FLD_USED, NULL},
    {"user", K_ALL | K_EMB, FLD_HINT, NULL},
    {"metadata", K_CHAT, FLD_HINT, NULL},
    {"store", K_CHAT, FLD_HINT, NULL},
    {"service_tier", K_CHAT, FLD_HINT, NULL},
    {"parallel_tool_calls", K_CHAT, FLD_HINT, NULL},
    {"response_format", K_ALL, FLD_USED, NULL},
    {"grammar", K_ALL, FLD_USED, NULL},
    {"tools", K_CHAT, FLD_USED, NULL},
    {"tool_choice", K_CHAT, FLD_USED, NULL},
    {"functions", K_CHAT, FLD_REFUSED, "the deprecated 'functions' is not supported; use 'tools'"},
    {"function_call", K_CHAT, FLD_REFUSED, "the deprecated 'function_call' is not supported; use 'tool_choice'"},
    {"audio", K_CHAT, FLD_REFUSED, "audio output is not supported"},
    {"prediction", K_CHAT, FLD_REFUSED, "predicted outputs are not supported"},
    {"reasoning_effort", K_CHAT, FLD_REFUSED, "'reasoning_effort' is not supported with this model"},
    {"web_search_options", K_CHAT, FLD_REFUSED, "web search is not supported"},
    {"modalities", K_CHAT, FLD_USED, NULL},
    {"chat_template_kwargs", K_CHAT, FLD_USED, NULL},
    {"add_generation_prompt", K_CHAT, FLD_USED, NULL},
};

static const fld *fld_find(const char *name)
{
    for (size_t i = 0; i < sizeof fld_table / sizeof *fld_table; i++)
        if (!strcmp(fld_table[i].name, name))
            return &fld_table[i];
    return NULL;
}

/* Route and name pairs logged already ("1:name"): at most FLD_LOGGED_MAX,
 * so a client that sends fresh names forever costs bounded memory and log
 * lines. */
#define FLD_LOGGED_MAX 128
#define FLD_NAME_MAX 64
static pthread_mutex_t fld_mu = PTHREAD_MUTEX_INITIALIZER;
static char fld_logged[FLD_LOGGED_MAX][FLD_NAME_MAX + 2];
static int fld_n_logged;

/* The name as a log can show it: printable ASCII, at most 63 bytes. */
static void fld_clean(const char *name, char *out)
{
    size_t i = 0;
    for (; name[i] && i < FLD_NAME_MAX - 1; i++)
        out[i] = name[i] > 32 && name[i] < 127 ? name[i] : '?';
    out[i] = 0;
}

static void fld_log_unknown(const char *name, int kind)
{
    static const char *const path[4] = {"/v1/completions", "/v1/chat/completions", "/generate", "/v1/embeddings"};
    if (kind < 0 || kind > 3)
        return;
    char clean[FLD_NAME_MAX];
    fld_clean(name, clean);
    char key[FLD_NAME_MAX + 2] = {(char)('0' + kind), ':'}; /* once per route and name */
    memcpy(key + 2, clean, sizeof clean);
    pthread_mutex_lock(&fld_mu);
    int seen = 0;
    for (int i = 0; i < fld_n_logged && !seen; i++) seen = !strcmp(fld_logged[i], key);
    int log = !seen && fld_n_logged < FLD_LOGGED_MAX;
    if (log)
        memcpy(fld_logged[fld_n_logged++], key, sizeof key);
    pthread_mutex_unlock(&fld_mu);
    if (log)
        llm_log("llm-server", "ignoring the unknown request field '%s' (%s; logged once per name)", clean, path[kind]);
}

int srv_fields_check(json_t *body, int kind, srv_err *e)
{
    const char *name;
    json_t *v;
    void *tmp;
    json_object_foreach_safe(body, tmp, name, v) {
        const fld *f = fld_find(name);
        if (!f || !(f->kinds & (1u << kind))) {
            fld_log_unknown(name, kind);
            json_object_del(body, name);
            continue;
        }
        if (f->use == FLD_REFUSED && !json_is_null(v)) {
            srv_err_set(e, 400, f->name, "%s", f->why);
            return -1;
        }
    }
    return 0;
}
