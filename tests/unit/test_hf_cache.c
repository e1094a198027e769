/* test_hf_cache.c — model arguments resolved from a fake Hugging Face cache tree (util/hf_cache.h). */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "util/hf_cache.h"

static char g_root[256];

static void mk(const char *rel) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    for (char *s = p + strlen(g_root) + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            mkdir(p, 0700);
            *s = '/';
        }
    mkdir(p, 0700);
}

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", g_root, rel);
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* hub/models--acme--tiny: refs/main -> abc123 (complete), refs/dev -> def456 (complete), a snapshot
 * 0ff without config.json; hub/models--acme--solo: no refs, one snapshot. */
static void build_tree(void) {
    snprintf(g_root, sizeof g_root, "/tmp/ms_hf_test_%d", (int)getpid());
    mkdir(g_root, 0700);
    mk("hf/hub/models--acme--tiny/refs");
    mk("hf/hub/models--acme--tiny/snapshots/abc123");
    mk("hf/hub/models--acme--tiny/snapshots/def456");
    mk("hf/hub/models--acme--tiny/snapshots/0ff");
    put("hf/hub/models--acme--tiny/refs/main", "abc123\n");
    put("hf/hub/models--acme--tiny/refs/dev", "def456");
    put("hf/hub/models--acme--tiny/snapshots/abc123/config.json", "{}");
    put("hf/hub/models--acme--tiny/snapshots/def456/config.json", "{}");
    mk("hf/hub/models--acme--solo/snapshots/777");
    put("hf/hub/models--acme--solo/snapshots/777/config.json", "{}");
    mk("home/.cache/huggingface/hub/models--org--home/snapshots/1");
    mk("home/.cache/huggingface/hub/models--org--home/refs");
    put("home/.cache/huggingface/hub/models--org--home/refs/main", "1");
    put("home/.cache/huggingface/hub/models--org--home/snapshots/1/config.json", "{}");
    mk("other/hub");
}

static int ends_with(const char *s, const char *tail) {
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

TEST(repo_ids_from_hf_home_and_hub_cache) {
    build_tree();
    char hf[300], home[300], hub[300], out[1024];
    snprintf(hf, sizeof hf, "%s/hf", g_root);
    snprintf(home, sizeof home, "%s/home", g_root);
    snprintf(hub, sizeof hub, "%s/hf/hub", g_root);
    ms_err err = {0};
    ms_hf_env env = {.hf_home = hf, .home = home};
    CHECK(ms_hf_resolve("acme/tiny", &env, out, sizeof out, &err) == MS_OK);
    CHECK_MSG(ends_with(out, "/hf/hub/models--acme--tiny/snapshots/abc123"), "%s\n", out);
    CHECK(ms_hf_resolve("acme/tiny@dev", &env, out, sizeof out, &err) == MS_OK);
    CHECK(ends_with(out, "/snapshots/def456"));
    CHECK(ms_hf_resolve("acme/tiny@def456", &env, out, sizeof out, &err) == MS_OK);
    CHECK(ends_with(out, "/snapshots/def456"));
    /* a snapshot without config.json: named as incomplete */
    CHECK(ms_hf_resolve("acme/tiny@0ff", &env, out, sizeof out, &err) == MS_ERR_IO);
    CHECK(strstr(err.msg, "config.json") != NULL);
    /* a revision the cache lacks */
    CHECK(ms_hf_resolve("acme/tiny@nope", &env, out, sizeof out, &err) == MS_ERR_IO);
    CHECK(strstr(err.msg, "nope") != NULL && strstr(err.msg, "does not download") != NULL);
    /* no refs/main, one snapshot */
    CHECK(ms_hf_resolve("acme/solo", &env, out, sizeof out, &err) == MS_OK);
    CHECK(ends_with(out, "/models--acme--solo/snapshots/777"));
    /* HF_HUB_CACHE wins over HF_HOME */
    char other[300];
    snprintf(other, sizeof other, "%s/other/hub", g_root);
    ms_hf_env e2 = {.hf_hub_cache = other, .hf_home = hf, .home = home};
    CHECK(ms_hf_resolve("acme/tiny", &e2, out, sizeof out, &err) == MS_ERR_IO);
    CHECK_MSG(strstr(err.msg, "other/hub/models--acme--tiny") != NULL, "%s\n", err.msg);
    e2.hf_hub_cache = hub;
    CHECK(ms_hf_resolve("acme/tiny", &e2, out, sizeof out, &err) == MS_OK);
    /* neither set: HOME's ~/.cache/huggingface/hub */
    ms_hf_env e3 = {.home = home};
    CHECK(ms_hf_resolve("org/home", &e3, out, sizeof out, &err) == MS_OK);
    CHECK(ends_with(out, "/home/.cache/huggingface/hub/models--org--home/snapshots/1"));
    CHECK(ms_hf_resolve("acme/tiny", &e3, out, sizeof out, &err) == MS_ERR_IO);
    CHECK(strstr(err.msg, "home/.cache/huggingface/hub/models--acme--tiny") != NULL);
    /* XDG_CACHE_HOME before HOME */
    char xdg[300];
    snprintf(xdg, sizeof xdg, "%s/hf/..", g_root);
    ms_hf_env e4 = {.xdg_cache_home = xdg, .home = home};
    CHECK(ms_hf_resolve("org/home", &e4, out, sizeof out, &err) == MS_ERR_IO);
    CHECK(strstr(err.msg, "/hf/../huggingface/hub/models--org--home") != NULL);
}

TEST(paths_and_bad_ids) {
    char out[1024], p[600];
    ms_err err = {0};
    ms_hf_env env = {.home = "/nonexistent-home"};
    /* a snapshot folder is a directory: itself */
    snprintf(p, sizeof p, "%s/hf/hub/models--acme--tiny/snapshots/def456", g_root);
    CHECK(ms_hf_resolve(p, &env, out, sizeof out, &err) == MS_OK && !strcmp(out, p));
    /* a repository folder: its refs/main snapshot */
    snprintf(p, sizeof p, "%s/hf/hub/models--acme--tiny", g_root);
    CHECK(ms_hf_resolve(p, &env, out, sizeof out, &err) == MS_OK);
    CHECK(ends_with(out, "/snapshots/abc123"));
    /* a plain directory */
    CHECK(ms_hf_resolve(g_root, &env, out, sizeof out, &err) == MS_OK && !strcmp(out, g_root));
    /* not a directory and not an id */
    const char *bad[] = {"no-such-dir", "/abs/missing/dir", "a/b/c", "a/", "/no-such-dir-ms-hf-test", "org/na me", "org/name@", "../no-such-dir-ms-hf-test"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int rc = ms_hf_resolve(bad[i], &env, out, sizeof out, &err);
        CHECK_MSG(rc == MS_ERR_ARG, "%s -> %d %s\n", bad[i], rc, err.msg);
    }
    /* an id not in the cache names the folder it looked for */
    CHECK(ms_hf_resolve("Qwen/Qwen3-30B-A3B", &env, out, sizeof out, &err) == MS_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent-home/.cache/huggingface/hub/models--Qwen--Qwen3-30B-A3B") != NULL);
    ms_hf_env none = {0};
    CHECK(ms_hf_resolve("a/b", &none, out, sizeof out, &err) == MS_ERR_ARG);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    CHECK(system(cmd) == 0);
}

TEST_MAIN()
