/* unicase.c — lookups in the generated case-mapping table. */
#include "text/unicase.h"

const uc_entry *uc_lookup(uint32_t cp) {
    size_t lo = 0, hi = uc_table_len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (uc_table[mid].cp < cp) lo = mid + 1;
        else hi = mid;
    }
    return lo < uc_table_len && uc_table[lo].cp == cp ? &uc_table[lo] : 0;
}

const char *uc_expand(uint32_t cp, char kind) {
    for (size_t i = 0; i < uc_multi_len; i++)
        if (uc_multi_table[i].cp == cp && uc_multi_table[i].kind == kind) return uc_multi_table[i].utf8;
    return 0;
}
