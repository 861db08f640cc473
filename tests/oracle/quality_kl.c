/* quality_kl.c - the canary quality gate's estimate (controller/quality.c)
 * for the Python tests, which hold it against llm-perplexity's exact KL.
 * Usage: quality_kl < {"stable": [LIST, ...], "canary": [LIST, ...]}
 * where each LIST is a prompt_logprobs list (vLLM's form; null entries are
 * skipped). Prints "mean KL X max Y top1 A of N"; exit 2 on bad input. */
#include <stdio.h>

#include <jansson.h>

#include "quality.h"

int main(void)
{
    json_error_t je;
    json_t *in = json_loadf(stdin, 0, &je);
    json_t *a = json_object_get(in, "stable"), *b = json_object_get(in, "canary");
    if (!json_is_array(a) || !json_is_array(b) || json_array_size(a) != json_array_size(b)) {
        printf("error: want {\"stable\": [...], \"canary\": [...]} of as many lists\n");
        return 2;
    }
    quality_sum s = {0};
    char why[256];
    for (size_t i = 0; i < json_array_size(a); i++)
        if (quality_add(&s, json_array_get(a, i), json_array_get(b, i), why, sizeof why)) {
            printf("error: list %zu: %s\n", i, why);
            return 2;
        }
    printf("mean KL %.9g max %.9g top1 %ld of %ld\n", s.positions ? s.kl / (double)s.positions : 0.0, s.kl_max,
           s.top1_same, s.positions);
    json_decref(in);
    return 0;
}
