/* fetch.h - a model from anywhere onto local disk: hf://, s3://, https://
 * sources (or a local path, returned as it is), resumable and verified,
 * into a cache several processes may share.
 *
 * Sources:
 *   hf://ORG/REPO/PATH.gguf[@REV]  one file of a Hugging Face repository
 *   hf://ORG/REPO:QUANT[@REV]      the .gguf whose name carries QUANT
 *                                  (Q4_K_M, ...), found in the file list
 *   s3://BUCKET/KEY                AWS SigV4 (libcurl's signing)
 *   https://HOST/PATH              optional bearer token
 * A name of a split set's part (-0000K-of-0000N.gguf) brings every part.
 *
 * The hub's protocol is the one huggingface_hub speaks: HEAD of
 * ENDPOINT/ORG/REPO/resolve/REV/PATH (the token only to ENDPOINT's host),
 * its commit (X-Repo-Commit), the file's sha256 and size (X-Linked-Etag,
 * X-Linked-Size) and its redirect to a CDN host, then a GET there with
 * Range to resume. Its cache is huggingface_hub's: CACHE/models--ORG--REPO/
 * {blobs/ETAG, snapshots/COMMIT/PATH -> ../../blobs/ETAG, refs/REV}, the
 * partial file blobs/ETAG.incomplete, the lock .locks/models--ORG--REPO/
 * ETAG.lock (flock), so either reuses what the other fetched. Other
 * sources: CACHE/urls/KEY/NAME, KEY from the source and the expected
 * digest; such a file is taken as immutable (an object rewritten under the
 * same key is not fetched again; give sha256 to pin it). A presigned
 * https URL's query is sent for every part of a split set.
 *
 * Every transfer: written to a partial file, sha256 computed as bytes
 * arrive (a resumed file's prefix read once), checked against the given
 * digest or else the hub's sha256, renamed into place only when complete
 * and verified; a file that is not GGUF, or whose digest differs, is
 * deleted. Cuts resume with Range; 408, 429 and 5xx are retried with
 * back-off (1, 2, 4 ... 32 s, or Retry-After up to 300 s), at most
 * max_retries times in a row without 1 MiB of progress; a transfer
 * below 1 KiB/s for stall_s is cut and resumed.
 * Redirects are followed by hand: at most 5, never to another scheme than
 * https (http only from http), the Authorization header never to another
 * host. Free space is checked before writing. Processes sharing the cache
 * wait on the file's lock (reported as "waiting"); a lock whose holder
 * died is released by the kernel and its partial file resumed (when a
 * digest will judge it); a holder whose file grows slower than 1 KiB/s
 * over lock_stale_s is left behind: the waiter downloads into a partial
 * file of its own and renames over it (the verified content is the same).
 *
 * Ownership: the caller's strings are borrowed for the call. Threads:
 * fetch_model may run on any thread, several at once (in one process or
 * several); curl_global_init must have been called by the program. */
#ifndef FETCH_H
#define FETCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "llm/status.h"

/* Why a fetch failed, for a status a person can act on (the controller's
 * condition reasons). */
typedef enum fetch_reason {
    FETCH_OK = 0,
    FETCH_NOT_FOUND,  /* 404: no such repository, file, revision, bucket or key */
    FETCH_DENIED,     /* 401/403: the token or keys are missing or wrong */
    FETCH_CHECKSUM,   /* the bytes are not the ones expected */
    FETCH_FAILED,     /* anything else: network, disk, a bad URI, not GGUF */
} fetch_reason;

const char *fetch_reason_name(fetch_reason r); /* "ModelNotFound", ... */

typedef struct fetch_progress {
    const char *phase;     /* a string literal: "resolving", "downloading", "waiting" (on another process),
                            * "verifying", "done" */
    const char *file;      /* the file in hand (its name in the source) */
    int part, n_parts;     /* 1-based */
    uint64_t done, total;  /* bytes of every file of the source (total 0: not known yet) */
    double rate;           /* bytes per second over the last seconds */
} fetch_progress;

typedef void (*fetch_progress_fn)(void *ctx, const fetch_progress *p);

typedef struct fetch_options {
    const char *cache_dir;   /* NULL: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub */
    const char *hf_endpoint; /* NULL: $HF_ENDPOINT, else https://huggingface.co */
    const char *hf_token;    /* NULL: $HF_TOKEN, else the file $HF_TOKEN_PATH or $HF_HOME/token */
    const char *bearer_token; /* https:// sources; NULL: $LLM_FETCH_BEARER_TOKEN, else the file
                               * $LLM_FETCH_BEARER_TOKEN_FILE names (its first line) */
    const char *s3_endpoint; /* NULL: $AWS_ENDPOINT_URL_S3, $AWS_ENDPOINT_URL, else AWS's (virtual-hosted) */
    const char *s3_region;   /* NULL: $AWS_REGION, $AWS_DEFAULT_REGION, else us-east-1 */
    const char *sha256;      /* expected digest (64 hex digits); a split set: one per part, comma-separated in
                              * part order; NULL or "" none */
    long stall_s;            /* 0: 30 */
    int max_retries;         /* retries in a row without 1 MiB of progress; 0: 6 */
    long lock_stale_s;       /* 0: 120 */
    int verify_cached;       /* 1: a file already in the cache is hashed against the source's digest (the hub's
                              * sha256, or sha256) before it is used, and one with no digest to judge it is
                              * downloaded again: for a cache others can write (a node's folder); 0: trusted
                              * by its name and size unless sha256 is given */
    fetch_progress_fn progress; /* may be NULL; called at most a few times a second */
    void (*log)(void *ctx, const char *line); /* retries, resumes, fallbacks; NULL: stderr */
    void *ctx;                  /* of progress and log */
    const _Atomic int *abort; /* may be NULL; set: the fetch stops with LLM_ERR_CANCELLED */
} fetch_options;

/* 1 when uri names a remote source (hf://, s3://, http(s)://), else 0 (a
 * local path). */
int fetch_is_remote(const char *uri);

/* Checks uri's form as fetch_model would, without a request: a local
 * path, or a source whose every name is confined, with as many digests in
 * o->sha256 (o may be NULL) as it has files (LLM_ERR_INVALID_ARG naming
 * what is wrong). */
llm_status fetch_check(const char *uri, const fetch_options *o, llm_error *err);

/* The cache folder o names (o may be NULL; the default from the
 * environment) into out. */
void fetch_cache_dir(const fetch_options *o, char *out, size_t n);

#define FETCH_SHA256_HEX 65
/* The SHA-256 of the file at path as 64 lowercase hex digits in hex (""
 * on failure): how a file in the cache is judged, and how llm-server
 * checks model_sha256. nofollow: a symbolic link at path is refused (the
 * cache's own blobs). Reads 4 MiB at a time into a buffer of its own,
 * looking at *abort (may be NULL) between reads. LLM_ERR_CANCELLED when
 * set, LLM_ERR_IO (open or read; the path and the cause), LLM_ERR_NOMEM,
 * LLM_ERR_INTERNAL (OpenSSL). Thread-safety: reentrant. */
/* Lower-case hex of n bytes into out (2n + 1 bytes): a digest as the
 * sources, the pins and the messages write it. */
void fetch_hex(const unsigned char *d, unsigned int n, char *out);
llm_status fetch_file_sha256(const char *path, int nofollow, const _Atomic int *abort, char hex[FETCH_SHA256_HEX],
                             llm_error *err);

/* Brings uri's file(s) into the cache and writes the local path of the
 * model (a split set's first part) into path[n]. A local path is copied as
 * it is. On failure: the status, err naming the source and the cause (a
 * token's value never), *why (may be NULL) the reason. */
llm_status fetch_model(const char *uri, const fetch_options *o, char *path, size_t n, fetch_reason *why,
                       llm_error *err);

#endif
