/* server_conn.c — connection accounting and limits: per-socket state (the caps on open connections,
 * overall and per address), the watchdog thread (hang-ups, header and body deadlines), and the checks
 * on a request's headers before its body is read (Host, Origin/CORS, API key, method, Content-Type,
 * Content-Length). */
#include <arpa/inet.h>
#include <ctype.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include "server/server_int.h"

/* ---------------- the watchdog ---------------- */
void *ms_srv_watch_main(void *arg) {
    ms_server *s = arg;
    double hto = s->o.header_timeout_s, bto = s->o.body_timeout_s;
    for (;;) {
        pthread_mutex_lock(&s->wmu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&s->wcv, &s->wmu, &ts);
        pthread_mutex_unlock(&s->wmu);
        pthread_mutex_lock(&s->mu);
        int stop = s->stopping;
        /* queued and running requests whose client hung up (the worker frees their slots at the next step) */
        int woke = 0;
        for (int i = 0; i <= s->n_slots; i++)
            for (job *j = i < s->n_slots ? s->slot_job[i] : s->head; j; j = i < s->n_slots ? NULL : j->next) {
                pthread_mutex_lock(&j->mu);
                if (!j->done && !j->cancelled && ms_srv_peer_gone(j->fd)) {
                    j->cancelled = 1;
                    ms_srv_job_wake(j);
                    woke = 1;
                }
                pthread_mutex_unlock(&j->mu);
            }
        if (woke) pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (stop) break;
        /* header and body deadlines: shut the socket down, libmicrohttpd then closes it */
        double t = now_s();
        int killed = 0;
        pthread_mutex_lock(&s->smu);
        for (sock *k = s->socks; k; k = k->next) {
            if (k->killed || k->stage == 2) continue;
            if (t - k->t0 > (k->stage == 0 ? hto : bto)) {
                shutdown(k->fd, SHUT_RDWR);
                k->killed = 1;
                killed++;
            }
        }
        pthread_mutex_unlock(&s->smu);
        if (killed) {
            pthread_mutex_lock(&s->mmu);
            s->m.timeouts += (uint64_t)killed;
            pthread_mutex_unlock(&s->mmu);
        }
    }
    return NULL;
}

void ms_srv_on_socket(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    ms_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        sock *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (!k) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        k->t0 = now_s();
        const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        const struct sockaddr *sa = ai ? ai->client_addr : NULL;
        if (sa && sa->sa_family == AF_INET) {
            k->fam = AF_INET;
            memcpy(k->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
        } else if (sa && sa->sa_family == AF_INET6) {
            k->fam = AF_INET6;
            memcpy(k->addr, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
        }
        pthread_mutex_lock(&s->smu);
        k->over = s->n_socks >= s->o.max_connections;
        if (s->o.max_connections_per_ip > 0 && k->fam) { /* the peer's open connections (at most the cap + 64 to scan) */
            int same = 0;
            for (sock *o = s->socks; o; o = o->next)
                same += o->fam == k->fam && !memcmp(o->addr, k->addr, k->fam == AF_INET ? 4 : 16);
            k->over_ip = same >= s->o.max_connections_per_ip;
        }
        s->n_socks++;
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->smu);
        if (k->over || k->over_ip) {
            pthread_mutex_lock(&s->mmu);
            s->m.refused_connections++;
            s->m.refused_per_ip += !k->over && k->over_ip;
            pthread_mutex_unlock(&s->mmu);
        }
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        sock *k = *socket_context;
        if (!k) return;
        pthread_mutex_lock(&s->smu);
        if (k->prev) k->prev->next = k->next;
        else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        s->n_socks--;
        pthread_mutex_unlock(&s->smu);
        free(k);
        *socket_context = NULL;
    }
}

sock *ms_srv_sock_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void ms_srv_sock_stage(ms_server *s, struct MHD_Connection *c, int stage) {
    sock *k = ms_srv_sock_of(c);
    if (!k) return;
    pthread_mutex_lock(&s->smu);
    k->stage = stage;
    k->t0 = now_s();
    pthread_mutex_unlock(&s->smu);
}

/* A loopback name or the bound address (DNS rebinding: a page on evil.example that resolves to 127.0.0.1
 * still sends "Host: evil.example"). */
static int host_ok(const ms_server *s, const char *h) {
    if (!s->loopback || !h) return 1;
    char name[256];
    size_t n = strlen(h);
    if (n >= sizeof name) return 0;
    if (h[0] == '[') {
        const char *e = strchr(h, ']');
        if (!e || (e[1] && e[1] != ':')) return 0;
        n = (size_t)(e - h - 1);
        memcpy(name, h + 1, n);
    } else {
        const char *colon = strchr(h, ':');
        if (colon && strchr(colon + 1, ':')) return 0; /* bare IPv6 is not a Host */
        n = colon ? (size_t)(colon - h) : n;
        memcpy(name, h, n);
    }
    name[n] = 0;
    for (size_t i = 0; i < n; i++) name[i] = (char)tolower((unsigned char)name[i]);
    if (n && name[n - 1] == '.') name[--n] = 0;
    if (!strcmp(name, "localhost") || (n > 10 && !strcmp(name + n - 10, ".localhost"))) return 1;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, name, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127 || !strcmp(name, s->host_str);
    if (inet_pton(AF_INET6, name, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6) || !strcmp(name, s->host_str);
    return 0;
}

static int json_ctype(const char *ct) {
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, "application/json", 16)) return 0;
    char e = ct[16];
    return e == 0 || e == ';' || e == ' ' || e == '\t';
}

/* auth: the Authorization header ("Bearer KEY") or, when xkey, the x-api-key header (Anthropic's). */
static int key_ok(const ms_server *s, const char *auth, int xkey) {
    if (!auth || (!xkey && strncasecmp(auth, "Bearer ", 7))) return 0;
    const char *k = xkey ? auth : auth + 7;
    while (*k == ' ') k++;
    unsigned char h[32];
    unsigned int hl = 0;
    if (!EVP_Digest(k, strlen(k), h, &hl, EVP_sha256(), NULL) || hl != 32) return 0;
    return CRYPTO_memcmp(h, s->key_hash, 32) == 0; /* constant time, and the key's length does not show */
}

/* Checks on the headers, before any body is read: exposure (Host, Origin/CORS, key), the connection cap,
 * method, Content-Type and Content-Length. Returns 1 when it answered. */
int ms_srv_precheck(ms_server *s, struct MHD_Connection *c, const char *url, const char *method, conn *cn,
                    enum MHD_Result *rc) {
    ms_api_error e;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (!host_ok(s, host)) {
        ms_api_fail(&e, 403, "invalid_request_error", NULL, "host_not_allowed",
                    "the Host header '%.100s' is not this server's loopback address (a DNS-rebinding guard); "
                    "use localhost, 127.0.0.1 or [::1]", host);
        *rc = ms_srv_send_error(s, c, cn, &e);
        return 1;
    }
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    int preflight = !strcmp(method, "OPTIONS");
    if (origin && host && !preflight) { /* the built-in page's own requests: Origin is this server (Host) */
        const char *o = !strncmp(origin, "http://", 7) ? origin + 7 : NULL;
        if (o && !strcmp(o, host)) origin = NULL;
    }
    if (origin) {
        if (s->cors && (!strcmp(s->cors, "*") || !strcmp(s->cors, origin)) && strlen(origin) < sizeof cn->origin) {
            cn->cors_ok = 1;
            snprintf(cn->origin, sizeof cn->origin, "%s", origin);
        } else {
            ms_api_fail(&e, 403, "invalid_request_error", NULL, "cors_refused",
                        s->cors ? "cross-origin requests from '%.100s' are refused (this server allows only --cors-origin)"
                                : "cross-origin requests from '%.100s' are refused: CORS is off (start the server "
                                  "with --cors-origin ORIGIN to allow a web page at ORIGIN)",
                        origin);
            *rc = ms_srv_send_error(s, c, cn, &e);
            return 1;
        }
    }
    if (preflight) {
        if (!cn->cors_ok) {
            ms_api_fail(&e, 403, "invalid_request_error", NULL, "cors_refused",
                        "CORS preflight refused: %s", s->cors ? "the request has no allowed Origin" : "CORS is off (see --cors-origin)");
            *rc = ms_srv_send_error(s, c, cn, &e);
            return 1;
        }
        const char *h[] = {"Access-Control-Allow-Methods", "GET, POST, OPTIONS", "Access-Control-Allow-Headers",
                           "Authorization, Content-Type, x-api-key, anthropic-version", "Access-Control-Max-Age", "600", NULL};
        *rc = ms_srv_send_body(s, c, cn, 204, "", 0, "text/plain", h);
        return 1;
    }
    sock *k = ms_srv_sock_of(c);
    if (k && (k->over || k->over_ip) && cn->ep != EP_HEALTH) {
        if (k->over)
            ms_api_fail(&e, 503, "server_error", NULL, "too_many_connections",
                        "the server has too many open connections (--max-connections %d); retry later", s->o.max_connections);
        else
            ms_api_fail(&e, 503, "server_error", NULL, "too_many_connections",
                        "your address has too many open connections (--max-connections-per-ip %d); close some, or retry later",
                        s->o.max_connections_per_ip);
        const char *h[] = {"Retry-After", "1", "Connection", "close", NULL};
        *rc = ms_srv_send_error_h(s, c, cn, &e, h);
        return 1;
    }
    const char *xk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (s->has_key && cn->ep != EP_HEALTH && cn->ep != EP_ROOT &&
        !key_ok(s, MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"), 0) && !key_ok(s, xk, 1)) {
        int given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization") != NULL || xk;
        ms_api_fail(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                    given ? "Incorrect API key provided"
                          : "You didn't provide an API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')");
        const char *h[] = {"WWW-Authenticate", "Bearer", NULL};
        *rc = ms_srv_send_error_h(s, c, cn, &e, h);
        return 1;
    }
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    if (cn->ep == EP_OTHER) {
        ms_api_fail(&e, 404, "invalid_request_error", NULL, "not_found", "no endpoint %s %.200s", method, url);
        *rc = ms_srv_send_error(s, c, cn, &e);
        return 1;
    }
    if (ms_srv_is_post_ep(cn->ep) && !post) {
        *rc = ms_srv_method_not_allowed(s, c, cn, method, url, "POST");
        return 1;
    }
    if (!ms_srv_is_post_ep(cn->ep) && !get) {
        *rc = ms_srv_method_not_allowed(s, c, cn, method, url, "GET, HEAD");
        return 1;
    }
    if (post) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!json_ctype(ct)) {
            ms_api_fail(&e, 415, "invalid_request_error", NULL, "unsupported_media_type",
                        "Content-Type must be application/json, got %s%.100s%s", ct ? "'" : "", ct ? ct : "none", ct ? "'" : "");
            *rc = ms_srv_send_error(s, c, cn, &e);
            return 1;
        }
        /* a body past the limit is read and dropped, then 413 (answering before the client has sent it
         * makes many clients see a reset instead of the answer); past limit + 64 MiB it is answered at
         * once and the connection closed */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        unsigned long long clv = cl ? strtoull(cl, NULL, 10) : 0;
        if (clv > s->o.max_body) cn->too_large = 1;
        if (clv > (unsigned long long)s->o.max_body + (64u << 20)) {
            ms_api_fail(&e, 413, "invalid_request_error", NULL, "request_too_large",
                        "the request body exceeds the limit of %zu bytes (Content-Length %.30s)", s->o.max_body, cl);
            *rc = ms_srv_send_error(s, c, cn, &e);
            return 1;
        }
    }
    return 0;
}
