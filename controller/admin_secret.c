/* admin_secret.c - the colocated canary's admin token; see admin_secret.h. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "admin_secret.h"
#include "desired.h"
#include "reconcile.h"

static const char *str2(json_t *o, const char *a, const char *b)
{
    return json_string_value(json_object_get(json_object_get(o, a), b));
}

static void path_of(json_t *d, char *out, size_t n)
{
    snprintf(out, n, "/api/v1/namespaces/%s/secrets/%s" DES_ADMIN_SUFFIX, str2(d, "metadata", "namespace"),
             str2(d, "metadata", "name"));
}

/* Whether Secret s is this LLMDeployment's own: labelled as ours and
 * owned (controller reference) by d's uid - a label alone anyone who may
 * create Secrets could add to one whose token they know. */
static int ours(json_t *s, json_t *d)
{
    json_t *md = json_object_get(s, "metadata"), *ref;
    const char *by = json_string_value(json_object_get(json_object_get(md, "labels"), REC_MANAGED_BY));
    const char *uid = str2(d, "metadata", "uid");
    size_t i;
    if (!by || strcmp(by, REC_CONTROLLER) || !uid)
        return 0;
    json_array_foreach(json_object_get(md, "ownerReferences"), i, ref) {
        const char *u = json_string_value(json_object_get(ref, "uid"));
        if (u && !strcmp(u, uid) && json_is_true(json_object_get(ref, "controller")))
            return 1;
    }
    return 0;
}

/* The token of Secret s into out, or an error naming the Secret and the rule. */
static llm_status token_of(json_t *s, json_t *d, char out[65], llm_error *err)
{
    const char *name = str2(d, "metadata", "name");
    if (!ours(s, d))
        return llm_errf(err, LLM_ERR_INVALID_ARG,
                        "Secret %s" DES_ADMIN_SUFFIX " exists and is not this LLMDeployment's (label %s=%s and its "
                        "ownerReference): llm-controller neither uses nor overwrites it; delete it", name,
                        REC_MANAGED_BY, REC_CONTROLLER);
    const char *b64 = str2(s, "data", DES_ADMIN_KEY);
    unsigned char raw[100];
    size_t blen = b64 ? strlen(b64) : 0;
    int n = blen && blen <= 88 ? EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)blen) : -1;
    /* EVP_DecodeBlock counts base64 padding as bytes: 64 characters encode in 88 with 2 '=' */
    int ok = n == 66 && b64[blen - 1] == '=' && b64[blen - 2] == '=';
    for (int i = 0; ok && i < 64; i++) ok = isxdigit(raw[i]) != 0;
    if (!ok)
        return llm_errf(err, LLM_ERR_INVALID_ARG,
                        "Secret %s" DES_ADMIN_SUFFIX ": key " DES_ADMIN_KEY " is not 64 hex digits; delete the "
                        "Secret and llm-controller makes a new one", name);
    memcpy(out, raw, 64);
    out[64] = 0;
    return LLM_OK;
}

llm_status admin_secret_token(kube_client *k, json_t *d, char out[65], llm_error *err)
{
    char path[1024];
    path_of(d, path, sizeof path);
    json_t *s = NULL;
    llm_status st = kube_request(k, "GET", path, NULL, NULL, &s, err);
    if (!st)
        st = token_of(s, d, out, err);
    json_decref(s);
    return st;
}

/* Posts a new Secret with a random token; a concurrent create (409) is
 * read back and judged as any other. */
static llm_status create(kube_client *k, json_t *d, llm_error *err)
{
    unsigned char raw[32];
    char tok[65];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot make the admin token: OpenSSL's RAND_bytes failed");
    for (int i = 0; i < 32; i++) snprintf(tok + 2 * i, 3, "%02x", raw[i]);
    json_t *want = des_admin_secret(d, tok);
    OPENSSL_cleanse(tok, sizeof tok);
    if (!want)
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build Secret %s" DES_ADMIN_SUFFIX, str2(d, "metadata", "name"));
    char coll[512];
    snprintf(coll, sizeof coll, "/api/v1/namespaces/%s/secrets", str2(d, "metadata", "namespace"));
    llm_status st = kube_request(k, "POST", coll, want, NULL, NULL, err);
    json_decref(want);
    return st == LLM_ERR_CONFLICT ? admin_secret_token(k, d, tok, err) : st;
}

llm_status admin_secret_ensure(kube_client *k, json_t *d, llm_error *err)
{
    char tok[65];
    llm_status st = admin_secret_token(k, d, tok, err);
    OPENSSL_cleanse(tok, sizeof tok);
    return st == LLM_ERR_NOT_FOUND ? create(k, d, err) : st;
}
