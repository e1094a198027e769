/* test_chat_template.c — chat renders against transformers' reference strings
 * (tests/data/fixtures/text/tok_dev.json, made with apply_chat_template) and the
 * interpreter's error and limit behavior. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <string.h>

#include "test.h"
#include "text/chat_template.h"
#include "text/jinja.h"
#include "util/fs.h"
#include "util/json.h"

static char *request_for(const cJSON *chat) {
    cJSON *req = cJSON_CreateObject();
    cJSON_AddItemToObject(req, "messages", cJSON_Duplicate(cJSON_GetObjectItem(chat, "messages"), 1));
    const cJSON *tools = cJSON_GetObjectItem(chat, "tools");
    if (tools && !cJSON_IsNull(tools)) cJSON_AddItemToObject(req, "tools", cJSON_Duplicate(tools, 1));
    cJSON_AddBoolToObject(req, "add_generation_prompt", cJSON_IsTrue(cJSON_GetObjectItem(chat, "add_generation_prompt")));
    cJSON_AddItemToObject(req, "chat_template_kwargs", cJSON_Duplicate(cJSON_GetObjectItem(chat, "kwargs"), 1));
    char *s = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    return s;
}

TEST(tok_dev_chats_render_byte_identical) {
    char *buf;
    size_t len;
    ms_err err = {0};
    int rc = ms_read_file("tests/data/fixtures/text/tok_dev.json", (size_t)64 << 20, &buf, &len, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    cJSON *doc = cJSON_ParseWithLength(buf, len);
    free(buf);
    CHECK(doc != NULL);
    const cJSON *toks = cJSON_GetObjectItem(doc, "tokenizers");
    int total = 0;
    const char *names[] = {"deepseek_v3", "qwen3", "gptoss"};
    for (int k = 0; k < 3; k++) {
        const cJSON *chats = cJSON_GetObjectItem(cJSON_GetObjectItem(toks, names[k]), "chats");
        char dir[256];
        snprintf(dir, sizeof dir, "tests/data/tokenizers/%s", names[k]);
        const cJSON *chat;
        cJSON_ArrayForEach(chat, chats) {
            const cJSON *want = cJSON_GetObjectItem(chat, "rendered");
            if (!cJSON_IsString(want)) continue; /* the reference itself failed */
            char *req = request_for(chat);
            char *out = NULL;
            size_t n = 0;
            ms_err e = {0};
            rc = ms_chat_render(dir, req, strlen(req), &out, &n, &e);
            CHECK_MSG(rc == 0, "%s %s: %s", names[k], cJSON_GetObjectItem(chat, "name")->valuestring, e.msg);
            if (!rc) CHECK_MSG(n == strlen(want->valuestring) && !memcmp(out, want->valuestring, n), "%s %s:\n got %s\nwant %s",
                               names[k], cJSON_GetObjectItem(chat, "name")->valuestring, out, want->valuestring);
            free(out);
            free(req);
            total++;
        }
    }
    CHECK_MSG(total >= 32, "only %d chats in the fixture", total);
    cJSON_Delete(doc);
}

/* tests/text/transformers_renders.json.gz: made by tests/text/gen_transformers_renders.py with
 * transformers 5.17 apply_chat_template (probe of the variables passed, the construct corpus,
 * chat-style templates over many conversations), gzip -9n (1.2 MB -> 37 KB: the tree travels to
 * the GPU machine under a size limit). Unpacked into build/ like the tokenizers. */
TEST(transformers_apply_chat_template_renders) {
    char *buf;
    size_t len;
    ms_err err = {0};
    CHECK(system("mkdir -p build && gzip -dc tests/text/transformers_renders.json.gz > "
                 "build/transformers_renders.json.tmp.$$ && mv build/transformers_renders.json.tmp.$$ "
                 "build/transformers_renders.json") == 0);
    int rc = ms_read_file("build/transformers_renders.json", (size_t)64 << 20, &buf, &len, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc) return;
    cJSON *doc = cJSON_ParseWithLength(buf, len);
    free(buf);
    CHECK(doc != NULL);
    const cJSON *configs = cJSON_GetObjectItem(doc, "configs"), *r;
    int n = 0, bad = 0, errors = 0;
    cJSON_ArrayForEach(r, cJSON_GetObjectItem(doc, "renders")) {
        const char *name = cJSON_GetObjectItem(r, "name")->valuestring;
        const char *tpl = cJSON_GetObjectItem(r, "template")->valuestring;
        const char *req = cJSON_GetObjectItem(r, "request")->valuestring;
        const cJSON *cfg = cJSON_GetObjectItem(configs, cJSON_GetObjectItem(r, "config")->valuestring);
        const cJSON *want = cJSON_GetObjectItem(r, "rendered");
        char *out = NULL;
        size_t out_len = 0;
        ms_err e = {0};
        rc = ms_chat_render_jinja(tpl, cfg, req, strlen(req), &out, &out_len, &e);
        n++;
        errors += want == NULL;
        int same = want ? (rc == 0 && out_len == strlen(want->valuestring) && !memcmp(out, want->valuestring, out_len)) : rc != 0;
        if (!same && ++bad <= 10)
            fprintf(stderr, "DIFF %s\n  transformers: %.300s\n  moonshine:    %.300s\n", name,
                    want ? want->valuestring : cJSON_GetObjectItem(r, "error")->valuestring, rc ? e.msg : out);
        free(out);
    }
    CHECK_MSG(bad == 0, "%d of %d renders differ from transformers", bad, n);
    CHECK_MSG(n >= 400 && errors < n / 3, "%d renders, %d errors", n, errors);
    cJSON_Delete(doc);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) { fputs(text, f); fclose(f); }
}

static char *render_dir(const char *dir, const char *req, int *rc, ms_err *err) {
    char *out = NULL;
    size_t n = 0;
    *rc = ms_chat_render(dir, req, strlen(req), &out, &n, err);
    return out;
}

/* transformers' choice among named templates: "tool_use" when tools are given, else "default";
 * chat_template.jinja wins over tokenizer_config.json. */
TEST(template_choice_and_request_checks) {
    char dir[] = "/tmp/ms_tmpl_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cfg[256], jin[256];
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    snprintf(jin, sizeof jin, "%s/chat_template.jinja", dir);
    write_text(cfg, "{\"bos_token\": {\"content\": \"<B>\"}, \"chat_template\": ["
                    "{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ messages|length }}\"},"
                    "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
    ms_err err = {0};
    int rc;
    char *o = render_dir(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &rc, &err);
    CHECK_MSG(rc == 0 && o && !strcmp(o, "D<B>1"), "%d %s %s", rc, o ? o : "", err.msg);
    free(o);
    o = render_dir(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}, {}]}", &rc, &err);
    CHECK_MSG(rc == 0 && o && !strcmp(o, "T2"), "%d %s %s", rc, o ? o : "", err.msg);
    free(o);
    o = render_dir(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": null}", &rc, &err);
    CHECK_MSG(rc == 0 && o && !strcmp(o, "D<B>1"), "%d %s %s", rc, o ? o : "", err.msg);
    free(o);
    write_text(jin, "J{{ add_generation_prompt }}{{ x }}\n");
    o = render_dir(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [], "
                        "\"add_generation_prompt\": true, \"chat_template_kwargs\": {\"x\": 1.0}}", &rc, &err);
    CHECK_MSG(rc == 0 && o && !strcmp(o, "JTrue1.0"), "%d %s %s", rc, o ? o : "", err.msg);
    free(o);
    const char *bad[] = {"[]", "{\"messages\": {}}", "{\"messages\": []}", "{\"messages\": [1]}",
                         "{\"messages\": [{}], \"tools\": {}}", "{\"messages\": [{}], \"add_generation_prompt\": 1}",
                         "{\"messages\": [{}], \"chat_template_kwargs\": {\"messages\": 1}}",
                         "{\"messages\": [{}], \"extra\": 1}", "{\"messages\": [{}]", NULL};
    for (int i = 0; bad[i]; i++) {
        ms_err_clear(&err);
        o = render_dir(dir, bad[i], &rc, &err);
        CHECK_MSG(rc == MS_ERR_FORMAT && !o && strstr(err.msg, "request"), "%s -> %d %s", bad[i], rc, err.msg);
    }
    /* transformers' multi-template save format */
    char sub[256], tu[300];
    snprintf(sub, sizeof sub, "%s/additional_chat_templates", dir);
    snprintf(tu, sizeof tu, "%s/tool_use.jinja", sub);
    CHECK(mkdir(sub, 0755) == 0);
    write_text(tu, "TU{{ tools|length }}");
    o = render_dir(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", &rc, &err);
    CHECK_MSG(rc == 0 && o && !strcmp(o, "TU1"), "%d %s %s", rc, o ? o : "", err.msg);
    free(o);
    o = render_dir(dir, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", &rc, &err);
    CHECK_MSG(rc == 0 && o && !strcmp(o, "JFalse"), "%d %s %s", rc, o ? o : "", err.msg);
    free(o);
    remove(tu);
    rmdir(sub);
    remove(jin);
    remove(cfg);
    rmdir(dir);
}

/* The command itself: stdin JSON -> exact prompt bytes on stdout; exit 1 on a bad request, 2 on usage. */
TEST(render_command) {
    if (!ms_file_exists("build/moonshine")) return; /* only the sanitizer stage runs without it */
    const char *req = "/tmp/ms_render_req.json";
    write_text(req, "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"add_generation_prompt\": true,"
                    " \"chat_template_kwargs\": {\"enable_thinking\": false}}");
    FILE *p = popen("./build/moonshine render tests/data/tokenizers/qwen3 < /tmp/ms_render_req.json", "r");
    CHECK(p != NULL);
    if (!p) return;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = 0;
    int st = pclose(p);
    /* the reference: tok_dev.json's qwen3 "single" chat with enable_thinking=false, add_generation_prompt=true */
    char *fx;
    size_t fl;
    ms_err err = {0};
    const char *want = NULL;
    cJSON *doc = NULL;
    if (ms_read_file("tests/data/fixtures/text/tok_dev.json", (size_t)64 << 20, &fx, &fl, &err) == 0) {
        doc = cJSON_ParseWithLength(fx, fl);
        free(fx);
        const cJSON *chat;
        cJSON_ArrayForEach(chat, cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetObjectItem(doc, "tokenizers"), "qwen3"), "chats")) {
            const cJSON *kw = cJSON_GetObjectItem(chat, "kwargs");
            if (!strcmp(cJSON_GetObjectItem(chat, "name")->valuestring, "single") &&
                cJSON_IsTrue(cJSON_GetObjectItem(chat, "add_generation_prompt")) && cJSON_IsFalse(cJSON_GetObjectItem(kw, "enable_thinking")))
                want = cJSON_GetObjectItem(chat, "rendered")->valuestring;
        }
    }
    CHECK(want != NULL);
    CHECK_MSG(st == 0 && want && !strcmp(buf, want), "status %d output %s", st, buf);
    cJSON_Delete(doc);
    write_text(req, "{\"messages\": 5}");
    st = system("./build/moonshine render tests/data/tokenizers/qwen3 < /tmp/ms_render_req.json 2>/dev/null");
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status %d", st);
    st = system("./build/moonshine render < /dev/null 2>/dev/null");
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %d", st);
    remove(req);
}

TEST(gptoss_ships_no_template) {
    ms_chat_source src;
    ms_err err = {0};
    int rc = ms_chat_pick("tests/data/tokenizers/gptoss", 0, &src, &err);
    CHECK(rc == MS_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "no chat template") != NULL);
}

static int render(const char *tpl, const char *ctx, char **out, ms_err *err) {
    ms_jinja_tpl *t = NULL;
    *out = NULL;
    int rc = ms_jinja_parse(tpl, strlen(tpl), &t, err);
    if (rc) return rc;
    ms_jinja_limits lim;
    ms_jinja_default_limits(&lim);
    lim.max_output = 1 << 20;
    lim.max_iterations = 100000;
    ms_jinja_vars *v = ms_jinja_vars_new(&lim);
    rc = ms_jinja_vars_set_json(v, NULL, ctx, strlen(ctx), NULL, NULL, err);
    if (!rc) rc = ms_jinja_render(t, v, out, NULL, err);
    ms_jinja_vars_free(v);
    ms_jinja_free(t);
    return rc;
}

TEST(errors_name_the_line) {
    char *out;
    ms_err err = {0};
    int rc = render("a\nb\n{% if x %}\n{{ raise_exception('bad role: ' ~ x) }}{% endif %}", "{\"x\": \"tool\"}", &out, &err);
    CHECK(rc == MS_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "line 4") && strstr(err.msg, "bad role: tool"), "%s", err.msg);
    ms_err_clear(&err);
    rc = render("x\n{% for a in b %}", "{}", &out, &err);
    CHECK(rc == MS_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "endfor") != NULL, "%s", err.msg);
    ms_err_clear(&err);
    rc = render("{{ a.b.c }}", "{}", &out, &err);
    CHECK_MSG(rc == MS_ERR_FORMAT && strstr(err.msg, "'a' is undefined"), "%s", err.msg);
    ms_err_clear(&err);
    rc = render("{{ a|nosuchfilter }}", "{}", &out, &err);
    CHECK_MSG(rc == MS_ERR_FORMAT && strstr(err.msg, "nosuchfilter"), "%s", err.msg);
}

TEST(limits_hold) {
    char *out;
    ms_err err = {0};
    int rc = render("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}", "{}", &out, &err);
    CHECK_MSG(rc == MS_ERR_LIMIT, "%d %s", rc, err.msg);
    ms_err_clear(&err);
    rc = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", &out, &err);
    CHECK_MSG(rc == MS_ERR_LIMIT, "%d %s", rc, err.msg);
    ms_err_clear(&err);
    rc = render("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
                "{}", &out, &err);
    CHECK_MSG(rc == MS_ERR_LIMIT, "%d %s", rc, err.msg);
    ms_err_clear(&err);
    char deep[4000];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 1000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 1000; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    rc = render(deep, "{}", &out, &err);
    CHECK_MSG(rc == MS_ERR_LIMIT || rc == MS_ERR_FORMAT, "%d %s", rc, err.msg);
}

TEST_MAIN()
