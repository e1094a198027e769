/* libFuzzer target: config.json parsing (every architecture's configure). */
#include <stdint.h>
#include <stdlib.h>

#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ms_config c;
    ms_err err;
    (void)ms_config_parse((const char *)data, size, "fuzz", &c, &err);
    return 0;
}
