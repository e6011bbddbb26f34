/*
 * Optional encryption of the data connections: TLS 1.3 (OpenSSL) with an external
 * pre-shared key and an ephemeral (EC)DHE exchange, no certificates.
 *
 * The 32-byte key is derived by the control channel from the session's shared secret and
 * both handshake nonces (automdt/protocol.py), so only the two authenticated ends of one
 * session can complete the handshake, and every session has its own key. psk_dhe_ke gives
 * forward secrecy: a secret leaked later does not decrypt recorded sessions.
 *
 * An amdt_link is one data connection: a socket and, when encrypted, its SSL object. The
 * send/recv calls behave like send(2)/recv(2) on a blocking socket with SO_SNDTIMEO /
 * SO_RCVTIMEO: they return -1 with errno EAGAIN when the timeout expires, so the callers'
 * loops keep re-checking their stop flags exactly as on a plain socket.
 */
#ifndef AMDT_TLS_H
#define AMDT_TLS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "constants.h" /* AMDT_TLS_KEY_LEN */

typedef struct amdt_tls amdt_tls; /* one per engine: the SSL_CTX and the key */

typedef struct amdt_link {
    int fd;
    void *ssl; /* SSL *, or NULL on a plain connection */
} amdt_link;

/* server: 1 on the receiver (accepting side); batch: records go out through one buffer per
 * connection (sender) or are read ahead (receiver), 0: one socket call per record (for
 * comparisons). Returns NULL with err set on failure. */
amdt_tls *amdt_tls_new(int server, const uint8_t *key, int batch, char *err, size_t errlen);
void amdt_tls_free(amdt_tls *t);

/* Start TLS on a connected socket (with SO_RCVTIMEO and SO_SNDTIMEO set). Retries while
 * the socket times out, until *stop is set (ECANCELED) or deadline_ns passes (ETIMEDOUT;
 * 0 = none). Returns 0, or an errno (EPROTO: the peer does not hold the key or does not
 * speak TLS). On failure l->ssl is NULL and the socket is left to the caller. */
int amdt_tls_start(amdt_tls *t, amdt_link *l, const int *stop, uint64_t deadline_ns);

/* Like send(2) with MSG_NOSIGNAL, of the first buffer only on an encrypted link. */
ssize_t amdt_link_send(amdt_link *l, const void *buf, size_t len);
/* Like sendmsg(2) of two buffers (the second may be empty); encrypted links send the first
 * non-empty one only, the caller's loop sends the rest. */
ssize_t amdt_link_send2(amdt_link *l, const void *a, size_t alen, const void *b, size_t blen);
/* Like recv(2): >0 bytes, 0 at end of stream, -1 with errno. */
ssize_t amdt_link_recv(amdt_link *l, void *buf, size_t len);
/* Send TLS close_notify (best effort) and free the SSL object; the socket stays open. */
void amdt_link_end_tls(amdt_link *l);

#endif
