/* hf_cache.c — offline resolution of Hugging Face repo ids and cache folders (hf_cache.h). */
#include "util/hf_cache.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* An environment value given and not empty. */
static int set(const char *s) { return s && *s; }

/* path names a directory (following links). */
static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

int ms_hf_hub_dir(const ms_hf_env *env, char *out, size_t cap, ms_err *err) {
    int n;
    if (set(env->hf_hub_cache)) n = snprintf(out, cap, "%s", env->hf_hub_cache);
    else if (set(env->hf_home)) n = snprintf(out, cap, "%s/hub", env->hf_home);
    else if (set(env->xdg_cache_home)) n = snprintf(out, cap, "%s/huggingface/hub", env->xdg_cache_home);
    else if (set(env->home)) n = snprintf(out, cap, "%s/.cache/huggingface/hub", env->home);
    else return ms_fail(err, MS_ERR_ARG, "no Hugging Face cache folder: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is set");
    if (n < 0 || (size_t)n >= cap) return ms_fail(err, MS_ERR_ARG, "Hugging Face cache path too long");
    return MS_OK;
}

/* A repo id part: what the hub allows in an owner or a name ([A-Za-z0-9._-], not "." or ".."). */
static int id_part(const char *s, size_t n) {
    if (!n || n > 96 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* refs/REF's commit (the file's first line) into sha[cap]; 0 when absent or malformed. */
static int read_ref(const char *repo, const char *ref, char *sha, size_t cap) {
    char p[4096];
    if (snprintf(p, sizeof p, "%s/refs/%s", repo, ref) >= (int)sizeof p) return 0;
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(sha, 1, cap - 1, f);
    fclose(f);
    sha[n] = 0;
    while (n && (sha[n - 1] == '\n' || sha[n - 1] == '\r' || sha[n - 1] == ' ')) sha[--n] = 0;
    return n > 0 && id_part(sha, n);
}

/* The snapshot of repo (a models--ORG--NAME folder) for rev (NULL: refs/main, else the only one). */
static int snapshot(const char *repo, const char *shown, const char *rev, char *out, size_t cap, ms_err *err) {
    char sha[256] = {0};
    const char *want = NULL;
    if (rev) { /* a ref name (refs/REV) or else a commit */
        if (!id_part(rev, strlen(rev)))
            return ms_fail(err, MS_ERR_ARG, "model %s: revision \"%s\" is not a ref name or commit", shown, rev);
        want = read_ref(repo, rev, sha, sizeof sha) ? sha : rev;
    } else if (read_ref(repo, "main", sha, sizeof sha)) {
        want = sha;
    }
    char only[256] = {0};
    if (!want) { /* no refs/main: the snapshot when there is exactly one */
        char sd[4096];
        snprintf(sd, sizeof sd, "%s/snapshots", repo);
        DIR *d = opendir(sd);
        int count = 0;
        for (struct dirent *e; d && (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            if (!count++) snprintf(only, sizeof only, "%s", e->d_name);
        }
        if (d) closedir(d);
        if (count != 1)
            return ms_fail(err, MS_ERR_IO, "model %s: %s has no refs/main and %d snapshots in %s; name one with %s@REV",
                           shown, repo, count, sd, shown);
        want = only;
    }
    int n = snprintf(out, cap, "%s/snapshots/%s", repo, want);
    if (n < 0 || (size_t)n >= cap) return ms_fail(err, MS_ERR_ARG, "model %s: path too long", shown);
    if (!is_dir(out))
        return ms_fail(err, MS_ERR_IO, "model %s: snapshot %s is missing (the cache lists revision %s; moonshine does not download)",
                       shown, out, want);
    char cfg[4096];
    if (snprintf(cfg, sizeof cfg, "%s/config.json", out) >= (int)sizeof cfg) return ms_fail(err, MS_ERR_ARG, "path too long");
    struct stat st;
    if (stat(cfg, &st) != 0)
        return ms_fail(err, MS_ERR_IO, "model %s: %s has no config.json (an incomplete download?)", shown, out);
    return MS_OK;
}

int ms_hf_resolve(const char *arg, const ms_hf_env *env, char *out, size_t cap, ms_err *err) {
    size_t n = strlen(arg);
    const char *base = strrchr(arg, '/');
    base = base ? base + 1 : arg;
    struct stat st;
    if (stat(arg, &st) == 0) { /* an existing path: a directory as is (or a file, for commands taking one) */
        char snaps[4096];
        /* a repository folder of the cache (models--ORG--NAME, with snapshots/): its current snapshot */
        if (!strncmp(base, "models--", 8) && snprintf(snaps, sizeof snaps, "%s/snapshots", arg) < (int)sizeof snaps &&
            S_ISDIR(st.st_mode) && is_dir(snaps))
            return snapshot(arg, arg, NULL, out, cap, err);
        if ((size_t)snprintf(out, cap, "%s", arg) >= cap) return ms_fail(err, MS_ERR_ARG, "model path too long");
        return MS_OK;
    }
    /* ORG/NAME[@REV] */
    const char *slash = strchr(arg, '/'), *at = strchr(arg, '@');
    size_t idn = at ? (size_t)(at - arg) : n;
    const char *slash2 = slash ? strchr(slash + 1, '/') : NULL;
    if (!slash || slash > arg + idn || (slash2 && slash2 < arg + idn) || !id_part(arg, (size_t)(slash - arg)) ||
        !id_part(slash + 1, idn - (size_t)(slash - arg) - 1) || (at && !at[1]))
        return ms_fail(err, MS_ERR_ARG,
                       "model \"%s\": no such directory, and not a Hugging Face repo id (ORG/NAME[@REV]); pass a checkpoint "
                       "directory (config.json + *.safetensors)", arg);
    char hub[4096], repo[4096], shown[256];
    if (ms_hf_hub_dir(env, hub, sizeof hub, err)) return err->code;
    snprintf(shown, sizeof shown, "%.*s", (int)idn, arg);
    int k = snprintf(repo, sizeof repo, "%s/models--%.*s--%s", hub, (int)(slash - arg), arg, shown + (slash - arg) + 1);
    if (k < 0 || (size_t)k >= sizeof repo) return ms_fail(err, MS_ERR_ARG, "model %s: cache path too long", shown);
    if (!is_dir(repo))
        return ms_fail(err, MS_ERR_IO,
                       "model %s: not a directory here, and not in the Hugging Face cache: looked for %s (the cache is "
                       "HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub). moonshine does not download: "
                       "fetch it first (e.g. `hf download %s`) or pass the checkpoint's directory",
                       shown, repo, shown);
    return snapshot(repo, shown, at ? at + 1 : NULL, out, cap, err);
}
