/* libFuzzer target: tokenizer.json loading on arbitrary bytes; whatever loads
 * must encode and decode without crashing. */
#include <stdint.h>
#include <stdlib.h>

#include "text/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ms_tokenizer *t = NULL;
    ms_err err = {0};
    if (ms_tok_load_hf_json((const char *)data, size, NULL, 0, &t, &err) != MS_OK) return 0;
    static const char text[] = "Hello <|im_start|>wörld e\xcc\x81 12345  \n\n\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x91\x8d";
    ms_tok_ids ids = {0};
    if (ms_tok_encode(t, text, sizeof text - 1, MS_TOK_ENCODE_SPECIAL, &ids, &err) == MS_OK) {
        char *dec;
        size_t n;
        if (ms_tok_decode(t, ids.ids, ids.n, 0, &dec, &n, &err) == MS_OK) free(dec);
    }
    ms_tok_ids_free(&ids);
    ms_tok_free(t);
    return 0;
}
