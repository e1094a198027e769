/* The memory plan: the ledger adds up, the engine refuses budgets that do not
 * fit, and a real run's peak RSS stays within the plan (+ stated margin). */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/plan.h"
#include "model/synth.h"
#include "test.h"

/* 2 layers, 32 experts of 512x512: ~100 MiB of experts, ~17 MiB static */
static const char *k_cfg =
    "{\"model_type\":\"qwen3_moe\",\"vocab_size\":8192,\"hidden_size\":512,\"num_hidden_layers\":2,"
    "\"num_attention_heads\":8,\"num_key_value_heads\":2,\"head_dim\":64,\"intermediate_size\":1024,"
    "\"moe_intermediate_size\":512,\"num_experts\":32,\"num_experts_per_tok\":4,\"norm_topk_prob\":true,"
    "\"rms_norm_eps\":1e-6,\"rope_theta\":10000.0,\"max_position_embeddings\":4096}";

static int run_child(char *const argv[], long *maxrss_kib) {
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execv(argv[0], argv);
        _exit(127);
    }
    int st = 0;
    struct rusage ru;
    wait4(pid, &st, 0, &ru);
    *maxrss_kib = ru.ru_maxrss;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

TEST(plan_bounds_rss) {
    char dir[] = "/tmp/ms_planXXXXXX", cfg[300];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(cfg, sizeof cfg, "%s/in.json", dir);
    FILE *f = fopen(cfg, "w");
    fputs(k_cfg, f);
    fclose(f);
    char out[300];
    snprintf(out, sizeof out, "%s/model", dir);
    ms_synth_opts so = {.config_path = cfg, .out_dir = out, .seed = 3, .dtype = MS_DT_BF16, .expert_dtype = MS_DT_BF16};
    ms_synth_result sr;
    ms_err e = {0};
    CHECK_MSG(ms_synth(&so, &sr, &e) == 0, "%s", e.msg);
    ms_model m;
    CHECK_MSG(ms_model_load(out, &m, &e) == 0, "%s", e.msg);
    ms_plan p;
    ms_plan_opts po = {.context = 256, .threads = 2, .expert_cache_bytes = -1};
    CHECK(ms_plan_make(&m, &po, &p, &e) == 0);
    CHECK(p.total == p.static_bytes + p.expert_bytes + p.state_bytes + p.workspace_bytes + p.staging_bytes + p.overhead_bytes);
    CHECK(p.state_bytes == 256 * p.state_per_token);
    CHECK(p.expert_bytes == m.expert_bytes && p.resident);
    CHECK(ms_plan_check(&p, p.total, &e) == 0);
    CHECK(ms_plan_check(&p, p.total - 1, &e) == MS_ERR_NOMEM && strstr(e.msg, "static tier"));
    { /* the device tier: its own line, not in the host total; the expert cache line is then the host RAM tier */
        ms_plan_opts pd = po;
        pd.expert_cache_bytes = 1 << 20;
        pd.device_expert_bytes = 64ull << 20;
        ms_plan q, q0;
        char buf[1200], js[1200];
        CHECK(ms_plan_make(&m, &pd, &q, &e) == 0);
        pd.device_expert_bytes = 0;
        CHECK(ms_plan_make(&m, &pd, &q0, &e) == 0);
        CHECK(q.total == q0.total && q.device_expert_bytes == 64ull << 20 && q0.device_expert_bytes == 0);
        ms_plan_format(&q, buf, sizeof buf);
        CHECK(strstr(buf, "device experts") && strstr(buf, "host RAM tier"));
        ms_plan_format(&q0, buf, sizeof buf);
        CHECK(!strstr(buf, "device experts") && strstr(buf, "bounded cache"));
        ms_plan_json(&q, js, sizeof js);
        CHECK(strstr(js, "\"device_expert_bytes\":67108864}") != NULL);
    }
    po.context = 100000; /* beyond max_position_embeddings */
    CHECK(ms_plan_make(&m, &po, &p, &e) == MS_ERR_ARG);
    po.context = 256;
    ms_plan_make(&m, &po, &p, &e);
    /* a real run stays within the plan */
    char mem[32], tiny[32];
    snprintf(mem, sizeof mem, "%llu", (unsigned long long)(p.total >> 20) + 1);
    char *argv[] = {"build/moonshine", "run", out, "--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12", "--max-new-tokens",
                    "64", "--ctx", "256", "--threads", "2", "--memory-mib", mem, NULL};
    long rss_kib = 0;
    CHECK(run_child(argv, &rss_kib) == 0);
    double margin = 1.05; /* stated margin: 5% */
    CHECK_MSG((double)rss_kib * 1024 <= (double)p.total * margin, "peak RSS %ld KiB vs plan %llu KiB", rss_kib,
              (unsigned long long)(p.total >> 10));
    /* and refuses a budget that does not fit, before allocating */
    snprintf(tiny, sizeof tiny, "%llu", (unsigned long long)(p.total >> 20) / 2);
    argv[12] = tiny;
    CHECK(run_child(argv, &rss_kib) == 1);
    CHECK((double)rss_kib * 1024 < (double)p.total / 2);
    /* streamed experts: the plan counts the expert cache instead of the experts, and a run in
     * each io mode stays within it (the arena is the cache; mapped expert pages must not pile up) */
    ms_plan_opts ps = {.context = 256, .threads = 2, .expert_cache_bytes = 16 << 20};
    ms_plan pst;
    CHECK(ms_plan_make(&m, &ps, &pst, &e) == 0);
    CHECK(!pst.resident && pst.expert_bytes <= (16u << 20) && pst.total < p.total);
    const char *modes[] = {"uring", "pread", "mmap"};
    for (int i = 0; i < 3; i++) {
        char smem[32];
        snprintf(smem, sizeof smem, "%llu", (unsigned long long)(pst.total >> 20) + 1);
        char *sargv[] = {"build/moonshine", "run", out, "--prompt-ids", "1,2,3,4,5,6,7,8,9,10,11,12", "--max-new-tokens",
                         "48", "--ctx", "256", "--threads", "2", "--memory-mib", smem, "--expert-cache-mib", "16",
                         "--io", (char *)modes[i], NULL};
        CHECK_MSG(run_child(sargv, &rss_kib) == 0, "streamed run (%s) failed", modes[i]);
        printf("streamed (%s): peak RSS %ld KiB, plan %llu KiB (resident plan %llu KiB)\n", modes[i], rss_kib,
               (unsigned long long)(pst.total >> 10), (unsigned long long)(p.total >> 10));
        CHECK_MSG((double)rss_kib * 1024 <= (double)pst.total * margin, "%s: peak RSS %ld KiB vs plan %llu KiB",
                  modes[i], rss_kib, (unsigned long long)(pst.total >> 10));
    }
    ms_model_free(&m);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST_MAIN()
