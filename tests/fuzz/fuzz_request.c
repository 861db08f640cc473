/* fuzz_request.c - libFuzzer target for llm-server's request parsing:
 * arbitrary bytes as /v1/completions and /v1/chat/completions bodies must
 * give either a request whose fields are all in range or an error with an
 * HTTP status and a message; never a crash, leak or UB (ASan + UBSan).
 * Chats render with one of the six built-in families or, for the seventh
 * value of the first byte, a Jinja template that uses tools and
 * chat_template_kwargs the way published templates do. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "srv.h"

static const char TEMPLATE[] =
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{- t | tojson }}\\n{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{- m.content | trim }}{%- endif %}{%- for c in m.tool_calls | default([]) %}"
    "{{- '<tool_call>' + (c.function | tojson) + '</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is false %}"
    "{{- '<think></think>' }}{%- endif %}{%- endif %}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static srv s;
    static char none[] = "", bos[] = "<s>";
    static srv_chat fam = {.bos = bos, .eos = none}, jinja = {.bos = bos, .eos = none};
    if (!jinja.tmpl && llm_jinja_compile(TEMPLATE, strlen(TEMPLATE), &jinja.tmpl, NULL))
        abort();
    snprintf(s.name, sizeof s.name, "m");
    s.cfg.max_answer_bytes = 1 << 26;
    int pick = size ? data[0] % 7 : 0;
    fam.family = (llm_chat_template)(pick % 6);
    const srv_chat *chat = pick == 6 ? &jinja : &fam;
    for (int is_chat = 0; is_chat < 2; is_chat++) {
        srv_completion c;
        srv_err e = {0};
        if (srv_parse_completion(&s, chat, NULL, (const char *)data, size, is_chat, &c, &e) == 0) {
            if (c.rq.n < 1 || c.rq.n > LLM_MAX_N || c.rq.n_stop > LLM_MAX_STOPS || (!c.rq.text && !c.rq.tokens))
                abort();
            if (c.rq.max_tokens < 0 || !(c.rq.sampling.temperature >= 0) || !(c.rq.sampling.top_p > 0))
                abort();
        } else if (e.status < 400 || e.status > 599 || !e.msg[0]) {
            abort();
        } else {
            char *body = srv_err_body(&e);
            free(body);
        }
        srv_completion_free(&c);
    }
    return 0;
}
