/* fuzz_request.c - libFuzzer target for llm-server's request parsing:
 * arbitrary bytes as /v1/completions and /v1/chat/completions bodies must
 * give either a request whose fields are all in range or an error with an
 * HTTP status and a message; never a crash, leak or UB (ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "srv.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static srv s;
    snprintf(s.name, sizeof s.name, "m");
    s.cfg.max_answer_bytes = 1 << 26;
    s.chat_tmpl = size ? data[0] % 6 : 0;
    for (int chat = 0; chat < 2; chat++) {
        srv_completion c;
        srv_err e = {0};
        if (srv_parse_completion(&s, s.chat_tmpl, NULL, (const char *)data, size, chat, &c, &e) == 0) {
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
