/* libFuzzer target: sha256sum checksum files (inspect --verify-sha256 SUMS) on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/checksum.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ms_sums s;
    ms_err err;
    if (ms_sums_parse((const char *)data, size, "fuzz", &s, &err) == 0) {
        /* what the parser promises: relative names without "..", none twice, each findable */
        for (int i = 0; i < s.n; i++) {
            const char *n = s.e[i].name;
            if (!n[0] || n[0] == '/' || !strcmp(n, "..") || !strncmp(n, "../", 3) || strstr(n, "/../")) abort();
            size_t l = strlen(n);
            if (l >= 3 && !strcmp(n + l - 3, "/..")) abort();
            if (ms_sums_find(&s, n) != &s.e[i]) abort();
        }
        ms_sums_free(&s);
    } else if (s.n || s.e) {
        abort(); /* a refusal leaves nothing behind */
    }
    return 0;
}
