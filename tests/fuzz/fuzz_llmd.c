/* fuzz_llmd.c - libFuzzer target for llm-controller's desired state: any
 * JSON as an LLMDeployment's spec (the API server guarantees only the
 * metadata; a schema can be changed or bypassed) must give children or a
 * clear refusal, never a crash, leak or UB (ASan + UBSan). Also Kubernetes
 * quantities from arbitrary text. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "desired.h"

static void check(json_t *o)
{
    if (o && !json_is_string(json_object_get(json_object_get(o, "metadata"), "name")))
        abort();
    json_decref(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    long long q = des_quantity(text);
    if (q < -1)
        abort();
    json_t *spec = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    free(text);
    if (!spec)
        return 0;
    json_t *d = json_pack("{s:s,s:s,s:{s:s,s:s,s:s,s:i},s:o}", "apiVersion", "llmk8s.io/v1alpha1", "kind",
                          "LLMDeployment", "metadata", "name", "fz", "namespace", "default", "uid", "u-1", "generation",
                          1, "spec", spec);
    if (!d)
        return 0;
    char msg[512] = "", hash[17];
    json_t *cm = des_configmap(d, msg, sizeof msg);
    if (!cm && !msg[0])
        abort(); /* a refusal says why */
    des_hash(cm, hash);
    check(cm);
    msg[0] = 0;
    json_t *dep = des_deployment(d, "0123456789abcdef", msg, sizeof msg);
    if (!dep && !msg[0])
        abort();
    check(dep);
    check(des_service(d));
    check(des_pdb(d));
    json_decref(d);
    return 0;
}
