/* split_name.c - llama.cpp's names for the parts of a split GGUF. */
#include "llm/split_name.h"

#include <stdio.h>
#include <string.h>

int llm_split_path(const char *path, uint32_t k, char *buf, size_t n)
{
    /* PREFIX-KKKKK-of-NNNNN.gguf: 20 characters after the prefix */
    size_t len = strlen(path);
    if (len < 20)
        return 0;
    const char *t = path + len - 20;
    unsigned no = 0, count = 0;
    for (int i = 0; i < 5; i++) {
        if (t[1 + i] < '0' || t[1 + i] > '9' || t[10 + i] < '0' || t[10 + i] > '9')
            return 0;
        no = no * 10 + (unsigned)(t[1 + i] - '0');
        count = count * 10 + (unsigned)(t[10 + i] - '0');
    }
    if (t[0] != '-' || memcmp(t + 6, "-of-", 4) || memcmp(t + 15, ".gguf", 5) || no < 1 || no > count)
        return 0;
    if (buf && (k < 1 || k > count ||
                snprintf(buf, n, "%.*s-%05u-of-%05u.gguf", (int)(len - 20), path, k, count) >= (int)n))
        return 0;
    return (int)count;
}
