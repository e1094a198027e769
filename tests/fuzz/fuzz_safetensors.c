/* libFuzzer target: SafeTensors header parsing on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ms_tensor *t = NULL;
    int n = 0;
    uint64_t ds;
    ms_err err;
    if (ms_st_parse(data, size, size, "fuzz", &t, &n, &ds, &err) == 0) {
        for (int i = 0; i < n; i++)
            if (t[i].offset + t[i].nbytes > size) abort(); /* the parser promised in-bounds ranges */
        ms_st_free_tensors(t, n);
    }
    return 0;
}
