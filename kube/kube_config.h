/* kube_config.h - where the Kubernetes API server is and how to log in:
 * a kubeconfig file (its current context: server, CA, bearer token or
 * client certificate) or the in-cluster service account (token, CA and
 * namespace files; the token is re-read when the file changes, as
 * projected tokens rotate).
 *
 * Choice: an explicit path (--kubeconfig or $KUBECONFIG) wins; else
 * in-cluster when $KUBERNETES_SERVICE_HOST is set (files from
 * $KUBESIM_SERVICEACCOUNT_DIR or /var/run/secrets/kubernetes.io/serviceaccount);
 * else ~/.kube/config.
 *
 * Ownership: caller-owned struct filled by kube_config_load, released by
 * kube_config_free. Thread-safety: after loading, the fields are only read,
 * except the token, which kube_config_token re-reads and copies out under
 * the config's own lock (every client and watch thread shares one config). */
#ifndef KUBE_CONFIG_H
#define KUBE_CONFIG_H

#include <pthread.h>
#include <stddef.h>
#include <time.h>

#include "llm/status.h"

typedef struct kube_config {
    char *server;            /* https://host:port */
    char *token;             /* bearer token or NULL */
    char *token_file;        /* in-cluster: the file to re-read */
    struct timespec token_mtime; /* and inode: a rotation replaces the file */
    unsigned long token_ino;
    char *ca_pem;            /* CA bundle (PEM) or NULL: system CAs */
    size_t ca_len;
    char *cert_pem, *key_pem; /* client certificate, or NULL */
    size_t cert_len, key_len;
    char *ns;                /* default namespace */
    char source[512];        /* where it came from, for messages */
    char agent[600];         /* User-Agent: the API server names our writes after its first word (managedFields);
                              * "llm-k8s" unless the program sets its own after loading */
    pthread_mutex_t mu;      /* guards token and token_mtime */
} kube_config;

llm_status kube_config_load(const char *kubeconfig, kube_config *c, llm_error *err);
void kube_config_free(kube_config *c);
/* The current token (re-read from token_file when it changed), copied
 * into out; NULL when there is none (or it does not fit). */
const char *kube_config_token(kube_config *c, char *out, size_t n);

#endif
