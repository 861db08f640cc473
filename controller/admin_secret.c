/* admin_secret.c - the colocated canary's admin token; see admin_secret.h. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "admin_secret.h"
#include "desired.h"
#include "kube_json.h"

#define KEY_FIELD "key"

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_ns[254] = "default", g_name[254] = "llm-controller-admin-key";
static unsigned char g_key[32];
static int g_have;
static time_t g_loaded; /* re-read after KEY_TTL_S: a deleted or replaced key takes over within it */
#define KEY_TTL_S 60

void admin_secret_key(const char *ns, const char *name)
{
    pthread_mutex_lock(&g_mu);
    snprintf(g_ns, sizeof g_ns, "%s", ns && *ns ? ns : "default");
    snprintf(g_name, sizeof g_name, "%s", name && *name ? name : "llm-controller-admin-key");
    g_have = 0;
    pthread_mutex_unlock(&g_mu);
}

/* The key out of the key Secret s (base64 of 32 bytes, labelled ours). */
static llm_status key_of(json_t *s, llm_error *err)
{
    const char *b64 = kube_json_str(s, "data", KEY_FIELD);
    const char *by = json_string_value(json_object_get(json_object_get(json_object_get(s, "metadata"), "labels"),
                                                       DESIRED_MANAGED_BY));
    if (!by || strcmp(by, DESIRED_CONTROLLER))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "Secret %s/%s is not labelled %s=%s: llm-controller makes its key "
                        "itself; delete that Secret", g_ns, g_name, DESIRED_MANAGED_BY, DESIRED_CONTROLLER);
    unsigned char raw[64];
    size_t n = b64 ? strlen(b64) : 0;
    /* 32 bytes encode in 44 characters, one '=': EVP_DecodeBlock counts it as a byte */
    if (n != 44 || b64[43] != '=' || b64[42] == '=' || EVP_DecodeBlock(raw, (const unsigned char *)b64, 44) != 33)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "Secret %s/%s: key '" KEY_FIELD "' is not 32 bytes of base64; "
                        "delete the Secret and llm-controller makes a new key", g_ns, g_name);
    memcpy(g_key, raw, 32);
    OPENSSL_cleanse(raw, sizeof raw);
    g_have = 1;
    g_loaded = time(NULL);
    return LLM_OK;
}

/* Posts a new random key; a concurrent create (another replica) is read back. */
static llm_status make_key(kube_client *k, const char *path, llm_error *err)
{
    unsigned char raw[32];
    char b64[48];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot make the admin key: OpenSSL's RAND_bytes failed");
    EVP_EncodeBlock((unsigned char *)b64, raw, sizeof raw);
    OPENSSL_cleanse(raw, sizeof raw);
    char coll[400];
    snprintf(coll, sizeof coll, "/api/v1/namespaces/%s/secrets", g_ns);
    json_t *want = json_pack("{s:s,s:s,s:{s:s,s:s,s:{s:s}},s:s,s:{s:s}}", "apiVersion", "v1", "kind", "Secret", "metadata",
                             "name", g_name, "namespace", g_ns, "labels", DESIRED_MANAGED_BY, DESIRED_CONTROLLER, "type", "Opaque",
                             "data", KEY_FIELD, b64);
    OPENSSL_cleanse(b64, sizeof b64);
    if (!want)
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build Secret %s/%s", g_ns, g_name);
    json_t *made = NULL;
    llm_status st = kube_client_request(k, "POST", coll, want, NULL, &made, err);
    json_decref(want);
    if (st == KUBE_ERR_CONFLICT)
        st = kube_client_request(k, "GET", path, NULL, NULL, &made, err);
    if (!st)
        st = key_of(made, err);
    json_decref(made);
    return st;
}

/* The key into key: read (or made) at first and again after KEY_TTL_S. */
static llm_status load_key(kube_client *k, unsigned char key[32], llm_error *err)
{
    pthread_mutex_lock(&g_mu);
    llm_status st = LLM_OK;
    if (!g_have || time(NULL) - g_loaded >= KEY_TTL_S) {
        g_have = 0;
        char path[600];
        snprintf(path, sizeof path, "/api/v1/namespaces/%s/secrets/%s", g_ns, g_name);
        json_t *s = NULL;
        st = kube_client_request(k, "GET", path, NULL, NULL, &s, err);
        st = st == LLM_ERR_NOT_FOUND ? make_key(k, path, err) : st ? st : key_of(s, err);
        json_decref(s);
    }
    if (!st)
        memcpy(key, g_key, 32);
    pthread_mutex_unlock(&g_mu);
    return st;
}

/* HMAC-SHA256(key, what "/" uid) as hex into out (2 x bytes digits). */
static int mac_hex(const unsigned char key[32], const char *what, const char *uid, char *out, int bytes)
{
    char msg[400];
    unsigned char md[32];
    unsigned int len = 0;
    int n = snprintf(msg, sizeof msg, "%s/%s", what, uid);
    if (n < 0 || n >= (int)sizeof msg || !HMAC(EVP_sha256(), key, 32, (unsigned char *)msg, (size_t)n, md, &len))
        return -1;
    for (int i = 0; i < bytes; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
    OPENSSL_cleanse(md, sizeof md);
    return 0;
}

llm_status admin_secret_derive(kube_client *k, json_t *d, char name[300], char token[65], llm_error *err)
{
    const char *uid = kube_json_str(d, "metadata", "uid"), *n = kube_json_str(d, "metadata", "name");
    if (!uid || !n)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the LLMDeployment has no uid or name yet");
    unsigned char key[32];
    llm_status st = load_key(k, key, err);
    if (st)
        return st;
    char h[21];
    int bad = (name && mac_hex(key, "name", uid, h, 5)) || (token && mac_hex(key, "token", uid, token, 32));
    OPENSSL_cleanse(key, sizeof key);
    if (bad)
        return llm_errf(err, LLM_ERR_INTERNAL, "HMAC-SHA256 failed for %s", n);
    if (name)
        snprintf(name, 300, "%s" DESIRED_ADMIN_SUFFIX "-%s", n, h);
    return LLM_OK;
}

/* Secrets made or found here lately, by name: not posted again for
 * CONFIRM_S (each reconcile of a colocated canary would post one; a
 * deleted one is made again after at most that). */
#define CONFIRMED 256
#define CONFIRM_S 60
static struct {
    char name[300];
    time_t at;
} g_confirmed[CONFIRMED];

static int confirmed(const char *name, int set)
{
    time_t now = time(NULL);
    int slot = 0;
    pthread_mutex_lock(&g_mu);
    int i = 0;
    while (i < CONFIRMED && strcmp(g_confirmed[i].name, name)) {
        if (g_confirmed[i].at < g_confirmed[slot].at)
            slot = i; /* the oldest goes, when name has no entry */
        i++;
    }
    if (i < CONFIRMED)
        slot = i;
    int fresh = i < CONFIRMED && now - g_confirmed[i].at < CONFIRM_S;
    if (set) {
        snprintf(g_confirmed[slot].name, sizeof g_confirmed[slot].name, "%s", name);
        g_confirmed[slot].at = now;
    }
    pthread_mutex_unlock(&g_mu);
    return fresh && !set;
}

llm_status admin_secret_ensure(kube_client *k, json_t *d, llm_error *err)
{
    char name[300], token[65];
    llm_status st = admin_secret_derive(k, d, name, token, err);
    if (!st && confirmed(name, 0)) {
        OPENSSL_cleanse(token, sizeof token);
        return LLM_OK;
    }
    json_t *want = st ? NULL : desired_admin_secret(d, name, token);
    OPENSSL_cleanse(token, sizeof token);
    if (st)
        return st;
    if (!want)
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build Secret %s", name);
    char coll[512];
    snprintf(coll, sizeof coll, "/api/v1/namespaces/%s/secrets", kube_json_str(d, "metadata", "namespace"));
    st = kube_client_request(k, "POST", coll, want, NULL, NULL, err);
    json_decref(want);
    if (st == KUBE_ERR_CONFLICT) /* there already: its name is ours alone to know */
        st = LLM_OK;
    if (!st)
        confirmed(name, 1);
    return st;
}
