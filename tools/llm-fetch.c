/* llm-fetch - brings a model into the cache and prints its local path:
 * what llm-server does before loading a hf://, s3:// or https:// model,
 * on its own (to fill a shared cache ahead of the pods, or to try a
 * source). Progress goes to stderr every few seconds. Exit status: 0, 2
 * usage, 3 not found, 4 access denied, 5 checksum mismatch, 1 otherwise. */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "fetch.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: llm-fetch SOURCE [--cache DIR] [--sha256 HEX] [--hf-endpoint URL] [--stall-seconds N]\n"
               "                 [--retries N] [--lock-stale-seconds N] [--verify-cached]\n"
               "       SOURCE: hf://ORG/REPO/PATH.gguf[@REV], hf://ORG/REPO:QUANT[@REV], s3://BUCKET/KEY, https://...\n"
               "       environment: HF_TOKEN, HF_ENDPOINT, HF_HUB_CACHE, HF_HOME, AWS_ACCESS_KEY_ID,\n"
               "       AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL(_S3), LLM_FETCH_BEARER_TOKEN(_FILE)\n");
}

static void progress(void *ctx, const fetch_progress *p)
{
    double *last = ctx, now = cli_now();
    if (now - *last < 3.0 && strcmp(p->phase, "done"))
        return;
    *last = now;
    if (p->total)
        fprintf(stderr, "llm-fetch: %s %s (part %d of %d): %.1f of %.1f MB (%.0f%%), %.1f MB/s\n", p->phase, p->file,
                p->part, p->n_parts, p->done / 1e6, p->total / 1e6, 100.0 * (double)p->done / (double)p->total,
                p->rate / 1e6);
    else
        fprintf(stderr, "llm-fetch: %s %s (part %d of %d): %.1f MB, %.1f MB/s\n", p->phase, p->file, p->part,
                p->n_parts, p->done / 1e6, p->rate / 1e6);
}

int main(int argc, char **argv)
{
    const char *src = NULL;
    double last = 0;
    fetch_options o = {.progress = progress, .ctx = &last};
    for (int i = 1; i < argc; i++) {
        long v;
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--cache") && i + 1 < argc)
            o.cache_dir = argv[++i];
        else if (!strcmp(argv[i], "--sha256") && i + 1 < argc)
            o.sha256 = argv[++i];
        else if (!strcmp(argv[i], "--hf-endpoint") && i + 1 < argc)
            o.hf_endpoint = argv[++i];
        else if (!strcmp(argv[i], "--verify-cached")) /* a cache others write: hash what is found */
            o.verify_cached = 1;
        else if (!strcmp(argv[i], "--lock-stale-seconds") && i + 1 < argc) {
            if (cli_int("--lock-stale-seconds", argv[++i], 1, 86400, &v))
                return 2;
            o.lock_stale_s = v;
        } else if (!strcmp(argv[i], "--retries") && i + 1 < argc) {
            if (cli_int("--retries", argv[++i], 1, 100, &v))
                return 2;
            o.max_retries = (int)v;
        } else if (!strcmp(argv[i], "--stall-seconds") && i + 1 < argc) {
            if (cli_int("--stall-seconds", argv[++i], 1, 3600, &v))
                return 2;
            o.stall_s = v;
        } else if (argv[i][0] != '-' && !src)
            src = argv[i];
        else {
            fprintf(stderr, "llm-fetch: unknown or incomplete argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!src) {
        usage(stderr);
        return 2;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        fprintf(stderr, "llm-fetch: libcurl does not start\n");
        return 1;
    }
    char path[4096];
    llm_error err = {0};
    fetch_reason why = FETCH_OK;
    if (fetch_model(src, &o, path, sizeof path, &why, &err)) {
        fprintf(stderr, "llm-fetch: %s: %s\n", fetch_reason_name(why), err.msg);
        curl_global_cleanup();
        return why == FETCH_NOT_FOUND ? 3 : why == FETCH_DENIED ? 4 : why == FETCH_CHECKSUM ? 5 : 1;
    }
    printf("%s\n", path);
    curl_global_cleanup();
    return 0;
}
