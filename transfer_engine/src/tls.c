/* Optional TLS 1.3 on the data connections (see tls.h). */
#include "tls.h"
#include "common.h"

#include <openssl/bio.h>
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
    int batch; /* sender: records go out through an amdt_wbuf; receiver: read-ahead */
    uint8_t key[AMDT_TLS_KEY_LEN];
};

/* The sender's write side: OpenSSL writes each record (16 KiB at most) to its BIO as soon as it
 * is sealed, which on a socket is one send() per record. The sender's links write into this
 * buffer instead, and amdt_link_send2 hands all records of one SSL_write to the socket in one
 * send(). The buffer holds one SSL_write's records (flushed before the next SSL_write). */
#define AMDT_TLS_WBUF (AMDT_TLS_MAX_WRITE + 64 * 1024)

typedef struct amdt_wbuf {
    int fd;
    size_t len, sent;
    ssize_t accepted; /* plaintext bytes of the SSL_write whose records are still in data */
    uint8_t data[AMDT_TLS_WBUF];
} amdt_wbuf;

/* Send the buffered records: 1 when all went, 0 with errno (EAGAIN: the socket's send timeout
 * expired; the rest stays for the next call). */
static int amdt_wbuf_flush(amdt_wbuf *b)
{
    while (b->sent < b->len) {
        ssize_t n = send(b->fd, b->data + b->sent, b->len - b->sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return 0;
        b->sent += (size_t)n;
    }
    b->len = b->sent = 0;
    return 1;
}

static int amdt_wbuf_write(BIO *bio, const char *data, int len)
{
    amdt_wbuf *b = BIO_get_data(bio);
    BIO_clear_retry_flags(bio);
    if (len <= 0)
        return 0;
    if ((size_t)len > sizeof(b->data) - b->len) {
        BIO_set_retry_write(bio); /* (not reached: flushed before each SSL_write) */
        return -1;
    }
    memcpy(b->data + b->len, data, (size_t)len);
    b->len += (size_t)len;
    return len;
}

static long amdt_wbuf_ctrl(BIO *bio, int cmd, long num, void *ptr)
{
    (void)num;
    (void)ptr;
    amdt_wbuf *b = BIO_get_data(bio);
    switch (cmd) {
    case BIO_CTRL_FLUSH: /* the handshake's flights and alerts: a few hundred bytes */
        for (int tries = 0; tries < 3; tries++) { /* each try waits one send timeout at most */
            if (amdt_wbuf_flush(b))
                return 1;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return 0;
        }
        return 0;
    case BIO_CTRL_WPENDING:
        return (long)(b->len - b->sent);
    default:
        return 0;
    }
}

static int amdt_wbuf_destroy(BIO *bio)
{
    free(BIO_get_data(bio));
    BIO_set_data(bio, NULL);
    return 1;
}

static BIO_METHOD *amdt_wbuf_method;
static pthread_once_t amdt_wbuf_once = PTHREAD_ONCE_INIT;

static void amdt_wbuf_method_init(void)
{
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "automdt-wbuf");
    if (m != NULL &&
        (!BIO_meth_set_write(m, amdt_wbuf_write) || !BIO_meth_set_ctrl(m, amdt_wbuf_ctrl) ||
         !BIO_meth_set_destroy(m, amdt_wbuf_destroy))) {
        BIO_meth_free(m);
        m = NULL;
    }
    amdt_wbuf_method = m; /* kept for the life of the process */
}

/* Make the client's SSL write through an amdt_wbuf on fd. 0, or ENOMEM. */
static int amdt_wbuf_attach(SSL *ssl, int fd)
{
    pthread_once(&amdt_wbuf_once, amdt_wbuf_method_init);
    amdt_wbuf *b = amdt_wbuf_method != NULL ? malloc(sizeof(*b)) : NULL;
    BIO *bio = b != NULL ? BIO_new(amdt_wbuf_method) : NULL;
    if (bio == NULL) {
        free(b);
        return ENOMEM;
    }
    b->fd = fd;
    b->len = b->sent = 0;
    b->accepted = 0;
    BIO_set_data(bio, b);
    BIO_set_init(bio, 1);
    SSL_set0_wbio(ssl, bio); /* the socket BIO stays the read side */
    return 0;
}

/* The link's write buffer, or NULL (a plain socket BIO: the receiver). */
static amdt_wbuf *amdt_link_wbuf(const amdt_link *l)
{
    BIO *w = SSL_get_wbio(l->ssl);
    return w != NULL && BIO_method_type(w) != BIO_TYPE_SOCKET ? BIO_get_data(w) : NULL;
}

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

amdt_tls *amdt_tls_new(int server, const uint8_t *key, int batch, char *err, size_t errlen)
{
    amdt_tls *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    t->server = server;
    t->batch = batch != 0;
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
        /* Read ahead into OpenSSL's default buffer (one record and a bit): one read() per
         * record instead of two (its header, then its body). A large buffer is slower: OpenSSL
         * moves what is left behind each record back to the buffer's start. */
        if (t->batch)
            SSL_CTX_set_read_ahead(t->ctx, 1);
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
    if (ssl == NULL || !SSL_set_fd(ssl, l->fd) ||
        (!t->server && t->batch && amdt_wbuf_attach(ssl, l->fd) != 0)) {
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
    amdt_wbuf *w = amdt_link_wbuf(l);
    if (w != NULL && w->len > 0) { /* the records of the last call did not all go */
        if (!amdt_wbuf_flush(w))
            return -1;
        ssize_t done = w->accepted;
        w->accepted = 0;
        if (done > 0)
            return done; /* that call's bytes: the caller's loop moves on past them */
    }
    /* SSL_MODE_ENABLE_PARTIAL_WRITE: each SSL_write returns after one record; with the buffer,
     * seal them all and send them together. */
    ssize_t n = 0;
    do {
        ERR_clear_error();
        errno = 0;
        ssize_t k = amdt_ssl_result(
            l->ssl, SSL_write(l->ssl, (const uint8_t *)buf + n, (int)(len - (size_t)n)), 0);
        if (k < 0 && n == 0)
            return -1;
        if (k < 0)
            break; /* send what is sealed; the error comes back on the next call */
        n += k;
    } while (w != NULL && (size_t)n < len);
    if (w != NULL && !amdt_wbuf_flush(w)) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        w->accepted = n; /* sealed, partly sent: reported once the rest has gone */
        errno = EAGAIN;
        return -1;
    }
    return n;
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
    amdt_wbuf *w = amdt_link_wbuf(l);
    if (w != NULL)
        (void)amdt_wbuf_flush(w); /* best effort, as the shutdown itself */
    ERR_clear_error();
    SSL_free(l->ssl);
    l->ssl = NULL;
}
