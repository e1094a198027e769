/* libFuzzer target: packed expert store manifest parsing on arbitrary bytes. */
#include <stdint.h>
#include <stdlib.h>

#include "io/expert_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ms_store_manifest m;
    ms_err err;
    if (ms_store_manifest_parse((const char *)data, size, "fuzz", "store", &m, &err) == 0) {
        const ms_expert_store *st = &m.st;
        /* what the parser promises: every role inside its record, records inside the stride */
        for (int li = 0; li < st->n_layers; li++) {
            if (st->store_layer[st->layer_id[li]] != li) abort();
            for (int e = 0; e < st->n_experts; e++) {
                const ms_expert_loc *l = ms_expert_store_loc(st, li, e);
                if (l->n_pieces != 1 || l->piece[0].file != li) abort();
                for (int r = 0; r < st->n_roles; r++) {
                    const ms_expert_role_info *ri = ms_expert_store_role(st, li, r);
                    if (ri->present && l->role_off[r] + ri->nbytes > l->piece[0].len) abort();
                }
            }
        }
        if (st->buf_bytes % 4096) abort();
        ms_store_manifest_free(&m);
    }
    return 0;
}
