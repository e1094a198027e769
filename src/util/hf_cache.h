/* hf_cache.h — a model argument as a Hugging Face repo id or cache folder, resolved offline.
 *
 * The Hugging Face hub cache (huggingface_hub's layout) keeps a repository ORG/NAME under
 *   HUB/models--ORG--NAME/{refs/REF, snapshots/COMMIT/...}
 * where HUB is $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
 * $HOME/.cache/huggingface/hub, and refs/main holds the commit the snapshot of the default branch is
 * stored under. Nothing here downloads: an absent model is an error naming where it was looked for. */
#ifndef MS_HF_CACHE_H
#define MS_HF_CACHE_H

#include <stddef.h>

#include "util/err.h"

/* The environment the resolution reads, passed in (the library reads no environment itself); NULL or
 * "" members are unset. */
typedef struct ms_hf_env {
    const char *hf_hub_cache, *hf_home, *xdg_cache_home, *home;
} ms_hf_env;

/* The hub cache folder env selects (see above) into out[cap]. MS_ERR_ARG when no variable gives one
 * (no HOME either) or it does not fit. */
int ms_hf_hub_dir(const ms_hf_env *env, char *out, size_t cap, ms_err *err);

/* Resolve arg to a model directory in out[cap]:
 *   - an existing path: itself (a snapshot folder .../snapshots/REV is a directory like any other);
 *   - a repository folder of the cache (.../models--ORG--NAME): its refs/main snapshot;
 *   - "ORG/NAME" or "ORG/NAME@REV" (REV a ref name under refs/ or a commit): that snapshot in the hub
 *     cache; without @REV, refs/main, else the only snapshot when there is exactly one.
 * The snapshot must hold config.json. MS_ERR_IO with a message naming every path looked for (and that
 * nothing is downloaded) when absent; MS_ERR_ARG when arg is neither a directory nor a repo id. */
int ms_hf_resolve(const char *arg, const ms_hf_env *env, char *out, size_t cap, ms_err *err);

#endif
