/* kube_config.c - kubeconfig (libyaml document API) and in-cluster
 * credentials; see kube_config.h. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <openssl/evp.h>
#include <yaml.h>

#include "kube_config.h"

#define SA_DIR "/var/run/secrets/kubernetes.io/serviceaccount"
#define MAX_FILE (4u << 20)

/* Whole file, NUL-terminated; NULL with err set. */
static char *read_file(const char *path, size_t *len, llm_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        llm_errf(err, LLM_ERR_IO, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(MAX_FILE + 1);
    size_t n = buf ? fread(buf, 1, MAX_FILE + 1, f) : 0;
    fclose(f);
    if (!buf || n > MAX_FILE) {
        free(buf);
        llm_errf(err, buf ? LLM_ERR_TOO_LONG : LLM_ERR_NOMEM, "%s: %s", path, buf ? "over 4 MiB" : "no memory");
        return NULL;
    }
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

/* Decodes base64 with OpenSSL's codec (the one the programs share), as
 * kubectl takes it: whitespace ignored, padding optional. NULL if invalid
 * or out of memory; *out_len bytes, NUL-terminated. */
static char *b64_decode(const char *s, size_t *out_len)
{
    size_t n = strlen(s), k = 0, given = 0, pad = 0;
    if (n > (size_t)INT_MAX - 4)
        return NULL;
    char *text = malloc(n + 4), *out = malloc(n / 4 * 3 + 4);
    if (!text || !out)
        goto bad;
    for (size_t i = 0; i < n; i++)
        if (s[i] != '\n' && s[i] != '\r' && s[i] != ' ')
            text[k++] = s[i];
    while (given < k && given < 3 && text[k - 1 - given] == '=')
        given++;
    /* EVP_DecodeBlock wants whole groups of 4 and counts padding as bytes */
    if (k % 4)
        pad = 4 - k % 4;
    if (given + pad > 2 || memchr(text, '=', k - given))
        goto bad;
    memset(text + k, '=', pad);
    int got = k + pad ? EVP_DecodeBlock((unsigned char *)out, (const unsigned char *)text, (int)(k + pad)) : 0;
    if (got < 0 || (size_t)got < given + pad)
        goto bad;
    free(text);
    *out_len = (size_t)got - given - pad;
    out[*out_len] = 0;
    return out;
bad:
    free(text);
    free(out);
    return NULL;
}

/* ---- YAML document navigation -------------------------------------------------- */

static yaml_node_t *map_get(yaml_document_t *d, yaml_node_t *m, const char *key)
{
    if (!m || m->type != YAML_MAPPING_NODE)
        return NULL;
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start; p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(d, p->key);
        if (k && k->type == YAML_SCALAR_NODE && !strcmp((const char *)k->data.scalar.value, key))
            return yaml_document_get_node(d, p->value);
    }
    return NULL;
}

static const char *scalar(yaml_node_t *n)
{
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The `what` entry of list `seq` named `name` (clusters, users, contexts). */
static yaml_node_t *named(yaml_document_t *d, yaml_node_t *root, const char *seq, const char *name, const char *what)
{
    yaml_node_t *s = map_get(d, root, seq);
    if (!s || s->type != YAML_SEQUENCE_NODE || !name)
        return NULL;
    for (yaml_node_item_t *i = s->data.sequence.items.start; i < s->data.sequence.items.top; i++) {
        yaml_node_t *e = yaml_document_get_node(d, *i);
        const char *n = scalar(map_get(d, e, "name"));
        if (n && !strcmp(n, name))
            return map_get(d, e, what);
    }
    return NULL;
}

/* A credential given inline (base64 "-data") or as a file path. */
static llm_status blob(yaml_document_t *d, yaml_node_t *m, const char *key, char **out, size_t *len, llm_error *err)
{
    char k[64];
    snprintf(k, sizeof k, "%s-data", key);
    const char *data = scalar(map_get(d, m, k)), *file = scalar(map_get(d, m, key));
    if (data) {
        if (!(*out = b64_decode(data, len)))
            return llm_errf(err, LLM_ERR_FORMAT, "kubeconfig: %s is not valid base64", k);
        return LLM_OK;
    }
    if (file && !(*out = read_file(file, len, err)))
        return err ? err->code : LLM_ERR_IO;
    return LLM_OK;
}

static llm_status dup_str(const char *s, char **out, llm_error *err)
{
    if (s && !(*out = strdup(s)))
        return llm_errf(err, LLM_ERR_NOMEM, "no memory");
    return LLM_OK;
}

static llm_status from_document(yaml_document_t *d, kube_config *c, llm_error *err)
{
    yaml_node_t *root = yaml_document_get_root_node(d);
    const char *ctx_name = scalar(map_get(d, root, "current-context"));
    yaml_node_t *ctx = named(d, root, "contexts", ctx_name, "context");
    if (!ctx)
        return llm_errf(err, LLM_ERR_FORMAT, "kubeconfig %s: current-context '%s' not found", c->source,
                        ctx_name ? ctx_name : "(none)");
    yaml_node_t *cl = named(d, root, "clusters", scalar(map_get(d, ctx, "cluster")), "cluster");
    yaml_node_t *us = named(d, root, "users", scalar(map_get(d, ctx, "user")), "user");
    const char *server = scalar(map_get(d, cl, "server")), *ns = scalar(map_get(d, ctx, "namespace"));
    if (!server)
        return llm_errf(err, LLM_ERR_FORMAT, "kubeconfig %s: context '%s' has no cluster server", c->source, ctx_name);
    llm_status st = dup_str(server, &c->server, err);
    if (!st)
        st = dup_str(ns ? ns : "default", &c->ns, err);
    if (!st)
        st = dup_str(scalar(map_get(d, us, "token")), &c->token, err);
    if (!st)
        st = blob(d, cl, "certificate-authority", &c->ca_pem, &c->ca_len, err);
    if (!st)
        st = blob(d, us, "client-certificate", &c->cert_pem, &c->cert_len, err);
    if (!st)
        st = blob(d, us, "client-key", &c->key_pem, &c->key_len, err);
    return st;
}

static llm_status load_kubeconfig(const char *path, kube_config *c, llm_error *err)
{
    snprintf(c->source, sizeof c->source, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f)
        return llm_errf(err, LLM_ERR_IO, "kubeconfig %s: %s", path, strerror(errno));
    yaml_parser_t p;
    yaml_document_t d;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_file(&p, f);
    llm_status st = yaml_parser_load(&p, &d) ? LLM_OK
                  : llm_errf(err, LLM_ERR_FORMAT, "kubeconfig %s line %zu: %s", path, p.problem_mark.line + 1,
                             p.problem ? p.problem : "malformed YAML");
    if (!st) {
        st = from_document(&d, c, err);
        yaml_document_delete(&d);
    }
    yaml_parser_delete(&p);
    fclose(f);
    return st;
}

static llm_status load_in_cluster(kube_config *c, llm_error *err)
{
    const char *dir = getenv("KUBESIM_SERVICEACCOUNT_DIR") ? getenv("KUBESIM_SERVICEACCOUNT_DIR") : SA_DIR;
    const char *host = getenv("KUBERNETES_SERVICE_HOST"), *port = getenv("KUBERNETES_SERVICE_PORT");
    char path[1024], url[512];
    snprintf(c->source, sizeof c->source, "in-cluster service account (%s)", dir);
    snprintf(url, sizeof url, strchr(host, ':') ? "https://[%s]:%s" : "https://%s:%s", host, port ? port : "443");
    snprintf(path, sizeof path, "%s/ca.crt", dir);
    if (!(c->server = strdup(url)) || !(c->ca_pem = read_file(path, &c->ca_len, err)))
        return err && err->code ? err->code : LLM_ERR_NOMEM;
    snprintf(path, sizeof path, "%s/namespace", dir);
    char *ns = read_file(path, NULL, NULL);
    if (ns)
        ns[strcspn(ns, "\r\n")] = 0;
    c->ns = ns ? ns : strdup("default");
    snprintf(path, sizeof path, "%s/token", dir);
    char probe[8192];
    if (!(c->token_file = strdup(path)) || !kube_config_token(c, probe, sizeof probe))
        return llm_errf(err, LLM_ERR_IO, "in-cluster: cannot read the service-account token %s", path);
    return LLM_OK;
}

llm_status kube_config_load(const char *kubeconfig, kube_config *c, llm_error *err)
{
    memset(c, 0, sizeof *c);
    pthread_mutex_init(&c->mu, NULL);
    snprintf(c->agent, sizeof c->agent, "llm-k8s");
    const char *env = getenv("KUBECONFIG"), *home = getenv("HOME");
    llm_status st;
    if (kubeconfig || (env && *env)) {
        st = load_kubeconfig(kubeconfig ? kubeconfig : env, c, err);
    } else if (getenv("KUBERNETES_SERVICE_HOST")) {
        st = load_in_cluster(c, err);
    } else {
        char path[1024];
        snprintf(path, sizeof path, "%s/.kube/config", home ? home : ".");
        st = load_kubeconfig(path, c, err);
    }
    if (st)
        kube_config_free(c);
    return st;
}

const char *kube_config_token(kube_config *c, char *out, size_t n)
{
    struct stat sb;
    pthread_mutex_lock(&c->mu);
    if (c->token_file && stat(c->token_file, &sb) == 0 &&
        (!c->token || sb.st_mtim.tv_sec != c->token_mtime.tv_sec || sb.st_mtim.tv_nsec != c->token_mtime.tv_nsec ||
         (unsigned long)sb.st_ino != c->token_ino)) {
        char *t = read_file(c->token_file, NULL, NULL);
        if (t) {
            t[strcspn(t, "\r\n")] = 0;
            free(c->token);
            c->token = t;
            c->token_mtime = sb.st_mtim;
            c->token_ino = (unsigned long)sb.st_ino;
        }
    }
    int ok = c->token && strlen(c->token) < n;
    if (ok)
        memcpy(out, c->token, strlen(c->token) + 1);
    pthread_mutex_unlock(&c->mu);
    return ok ? out : NULL;
}

void kube_config_free(kube_config *c)
{
    free(c->server);
    free(c->token);
    free(c->token_file);
    free(c->ca_pem);
    free(c->cert_pem);
    free(c->key_pem);
    free(c->ns);
    pthread_mutex_destroy(&c->mu);
    memset(c, 0, sizeof *c);
}
