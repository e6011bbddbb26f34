/* Optional TLS 1.3 on the data connections (see tls.h). */
#include "tls.h"
#include "common.h"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <sys/uio.h>

/* TLS_AES_128_GCM_SHA256: both offered suites hash with SHA-256, so the key fits either. */
static const unsigned char amdt_suite_id[2] = {0x13, 0x01};
static const char amdt_psk_identity[] = "automdt-data-1";
#define AMDT_TLS_SUITES "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256"
#define AMDT_TLS_MAX_WRITE (256 * 1024) /* progress is counted per write */

struct amdt_tls {
    SSL_CTX *ctx;
    int server;
    uint8_t key[AMDT_TLS_KEY_LEN];
};

static SSL_SESSION *amdt_psk_session(SSL *ssl)
{
    amdt_tls *t = SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl));
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, amdt_suite_id);
    SSL_SESSION *sess = cipher != NULL ? SSL_SESSION_new() : NULL;
    if (sess == NULL)
        return NULL;
    if (!SSL_SESSION_set1_master_key(sess, t->key, sizeof(t->key)) ||
        !SSL_SESSION_set_cipher(sess, cipher) ||
        !SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION)) {
        SSL_SESSION_free(sess);
        return NULL;
    }
    return sess;
}

static int amdt_psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                        SSL_SESSION **sess)
{
    *sess = NULL;
    SSL_SESSION *s = amdt_psk_session(ssl);
    if (s == NULL)
        return 0;
    if (md != NULL && SSL_CIPHER_get_handshake_digest(SSL_SESSION_get0_cipher(s)) != md) {
        SSL_SESSION_free(s); /* another hash after a retry: the key does not apply */
        return 1;
    }
    *sess = s;
    *id = (const unsigned char *)amdt_psk_identity;
    *idlen = sizeof(amdt_psk_identity) - 1;
    return 1;
}

static int amdt_psk_find(SSL *ssl, const unsigned char *id, size_t idlen, SSL_SESSION **sess)
{
    *sess = NULL;
    if (idlen != sizeof(amdt_psk_identity) - 1 || memcmp(id, amdt_psk_identity, idlen) != 0)
        return 1; /* unknown identity: no key, and without a certificate the handshake fails */
    *sess = amdt_psk_session(ssl);
    return *sess != NULL;
}

amdt_tls *amdt_tls_new(int server, const uint8_t *key, char *err, size_t errlen)
{
    amdt_tls *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->server = server;
    memcpy(t->key, key, AMDT_TLS_KEY_LEN);
    t->ctx = SSL_CTX_new(server ? TLS_server_method() : TLS_client_method());
    if (t->ctx == NULL || !SSL_CTX_set_min_proto_version(t->ctx, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(t->ctx, AMDT_TLS_SUITES)) {
        unsigned long e = ERR_get_error();
        snprintf(err, errlen, "TLS set-up failed: %s", e ? ERR_reason_error_string(e) : "unknown");
        amdt_tls_free(t);
        return NULL;
    }
    SSL_CTX_set_app_data(t->ctx, t);
    SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    /* A connection that ends without close_notify (the sender's engine shut its sockets at
     * close) ends like plain TCP: frames are whole and verified or dropped, never spliced. */
    SSL_CTX_set_options(t->ctx, SSL_OP_IGNORE_UNEXPECTED_EOF);
    if (server) {
        SSL_CTX_set_psk_find_session_callback(t->ctx, amdt_psk_find);
        SSL_CTX_set_num_tickets(t->ctx, 0); /* the sender never reads: no tickets to pile up */
        /* (Reading ahead into a large buffer measured slower: OpenSSL moves the partial
         * record left at the end of it back to the start, a copy per buffer.) */
    } else {
        SSL_CTX_set_psk_use_session_callback(t->ctx, amdt_psk_use);
    }
    return t;
}

void amdt_tls_free(amdt_tls *t)
{
    if (t == NULL)
        return;
    if (t->ctx != NULL)
        SSL_CTX_free(t->ctx);
    OPENSSL_cleanse(t->key, sizeof(t->key));
    free(t);
}

/* Map the result of an SSL call to the send/recv convention. */
static ssize_t amdt_ssl_result(SSL *ssl, int n, int reading)
{
    if (n > 0)
        return n;
    int saved = errno;
    switch (SSL_get_error(ssl, n)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        errno = EAGAIN; /* the socket timeout expired */
        return -1;
    case SSL_ERROR_ZERO_RETURN:
        if (reading)
            return 0; /* close_notify */
        errno = EPIPE;
        return -1;
    case SSL_ERROR_SYSCALL:
        ERR_clear_error();
        if (saved == 0 && reading)
            return 0; /* end of stream without close_notify: frames are whole or refused */
        errno = saved ? saved : EPIPE;
        return -1;
    default:
        ERR_clear_error();
        errno = EPROTO;
        return -1;
    }
}

int amdt_tls_start(amdt_tls *t, amdt_link *l, const int *stop, uint64_t deadline_ns)
{
    SSL *ssl = SSL_new(t->ctx);
    if (ssl == NULL || !SSL_set_fd(ssl, l->fd)) {
        SSL_free(ssl);
        ERR_clear_error();
        return ENOMEM;
    }
    for (;;) {
        if (amdt_stopping(stop)) {
            SSL_free(ssl);
            return ECANCELED;
        }
        ERR_clear_error();
        errno = 0;
        int n = t->server ? SSL_accept(ssl) : SSL_connect(ssl);
        if (n == 1)
            break;
        int e = amdt_ssl_result(ssl, n, 1) == 0 ? ECONNRESET : errno;
        if (e == EAGAIN) {
            if (deadline_ns == 0 || amdt_now_ns() < deadline_ns)
                continue;
            e = ETIMEDOUT;
        }
        SSL_free(ssl);
        return e;
    }
    l->ssl = ssl;
    return 0;
}

ssize_t amdt_link_send2(amdt_link *l, const void *a, size_t alen, const void *b, size_t blen)
{
    if (l->ssl == NULL) {
        struct iovec iov[2] = {{.iov_base = (void *)a, .iov_len = alen},
                               {.iov_base = (void *)b, .iov_len = blen}};
        struct msghdr mh = {.msg_iov = alen ? iov : iov + 1,
                            .msg_iovlen = (alen ? 1 : 0) + (blen ? 1 : 0)};
        return sendmsg(l->fd, &mh, MSG_NOSIGNAL);
    }
    const void *buf = alen ? a : b;
    size_t len = alen ? alen : blen;
    if (len > AMDT_TLS_MAX_WRITE)
        len = AMDT_TLS_MAX_WRITE;
    ERR_clear_error();
    errno = 0;
    return amdt_ssl_result(l->ssl, SSL_write(l->ssl, buf, (int)len), 0);
}

ssize_t amdt_link_send(amdt_link *l, const void *buf, size_t len)
{
    return amdt_link_send2(l, buf, len, NULL, 0);
}

ssize_t amdt_link_recv(amdt_link *l, void *buf, size_t len)
{
    if (l->ssl == NULL)
        return recv(l->fd, buf, len, MSG_WAITALL);
    if (len > INT32_MAX)
        len = INT32_MAX;
    ERR_clear_error();
    errno = 0;
    return amdt_ssl_result(l->ssl, SSL_read(l->ssl, buf, (int)len), 1);
}

void amdt_link_end_tls(amdt_link *l)
{
    if (l->ssl == NULL)
        return;
    ERR_clear_error();
    SSL_shutdown(l->ssl); /* one close_notify, no wait for the peer's */
    ERR_clear_error();
    SSL_free(l->ssl);
    l->ssl = NULL;
}
