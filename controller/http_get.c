/* http_get.c - a bounded GET or JSON POST; see http_get.h. */
#include <stdlib.h>
#include <string.h>

#include "http_get.h"

size_t http_body_write(char *d, size_t sz, size_t nm, void *arg)
{
    http_body *b = arg;
    size_t add = sz * nm;
    if (b->n + add > b->max) {
        b->over = 1;
        return 0; /* aborts the transfer */
    }
    if (b->n + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + add + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->nomem = 1;
            return 0;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, add);
    b->n += add;
    b->p[b->n] = 0;
    return add;
}

long http_get(CURL *h, const char *url, long timeout_ms, size_t max, char **body)
{
    return http_request(h, url, NULL, NULL, timeout_ms, max, body);
}

long http_request(CURL *h, const char *url, const char *bearer, const char *json, long timeout_ms, size_t max,
                  char **body)
{
    *body = NULL;
    CURL *c = h ? h : curl_easy_init();
    if (!c)
        return 0;
    if (h)
        curl_easy_reset(c);
    http_body b = {.max = max};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    struct curl_slist *hdr = NULL;
    char auth[600];
    if (bearer && snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer) < (int)sizeof auth)
        hdr = curl_slist_append(hdr, auth);
    if (json) {
        struct curl_slist *t = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = t ? t : hdr;
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    long code = 0;
    if (curl_easy_perform(c) != CURLE_OK || curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        code = 0;
    curl_slist_free_all(hdr);
    if (!h)
        curl_easy_cleanup(c);
    if (!code) {
        free(b.p);
        return 0;
    }
    *body = b.p ? b.p : calloc(1, 1);
    return *body ? code : 0;
}
