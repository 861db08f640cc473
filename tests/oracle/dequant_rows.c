/* dequant_rows.c - reads n elements of tensor type T (ggml numbering) from
 * stdin and writes them dequantized by the engine as float32 to stdout:
 * the engine's side of tests/integration/test_quant_oracle.py, which holds
 * it against llama.cpp's own decoders (the `gguf` package).
 * Usage: dequant_rows TYPE N < blocks > floats */
#include <stdio.h>
#include <stdlib.h>

#include "llm/quant.h"

int main(int argc, char **argv)
{
    if (argc != 3)
        return 2;
    unsigned long t = strtoul(argv[1], NULL, 10), n = strtoul(argv[2], NULL, 10);
    if (t >= QT_COUNT || !quant_supported((quant_type)t) || n == 0 || n > (1ul << 24))
        return 2;
    size_t rb = quant_row_bytes((quant_type)t, n);
    unsigned char *b = malloc(rb ? rb : 1);
    float *y = malloc(n * sizeof(float));
    int rc = 1;
    if (rb && b && y && fread(b, 1, rb, stdin) == rb) {
        quant_init();
        quant_dequantize_row((quant_type)t, b, y, n);
        rc = fwrite(y, sizeof(float), n, stdout) == n ? 0 : 1;
    }
    free(b);
    free(y);
    return rc;
}
