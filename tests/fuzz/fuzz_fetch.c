/* fuzz_fetch.c - what the fetch module reads before any byte of a model:
 * a source's URI (from an LLMDeployment or a command line) and the header
 * lines of a server's answers. The first byte picks which; neither may
 * read out of bounds, and a URI that passes must name no empty, "." or
 * ".." segment. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_impl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *s = malloc(size);
    if (!s)
        return 0;
    memcpy(s, data + 1, size - 1);
    s[size - 1] = 0;
    if (data[0] & 1) {
        fetch_resp r;
        memset(&r, 0, sizeof r);
        for (char *line = s, *end; *line; line = end) { /* one call per line, as libcurl makes them */
            end = strchr(line, '\n');
            end = end ? end + 1 : line + strlen(line);
            fetch_http_header_line(&r, line, (size_t)(end - line));
        }
        /* every field stays a terminated string inside its buffer, Retry-After within its cap */
        if (strnlen(r.location, sizeof r.location) == sizeof r.location || strnlen(r.etag, sizeof r.etag) == sizeof r.etag ||
            strnlen(r.next, sizeof r.next) == sizeof r.next || strnlen(r.commit, sizeof r.commit) == sizeof r.commit ||
            r.retry_after > 300)
            abort();
    } else {
        llm_error err = {0};
        int ok = fetch_check(s, NULL, &err) == LLM_OK;
        s[strcspn(s, "?#")] = 0; /* what names the file: not a query or a fragment */
        if (ok && fetch_is_remote(s) && !strchr(s, '@') &&
            (strstr(s, "/../") || strstr(s, "/./") || strstr(s, "://../") || strstr(s, "://./")))
            abort(); /* a confined source must not name a parent folder */
    }
    free(s);
    return 0;
}
