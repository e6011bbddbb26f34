/* TCP counters of a connected socket (Linux TCP_INFO), for the network stage's loss ratio. */
#ifndef AMDT_TCPINFO_H
#define AMDT_TCPINFO_H

#include <stdint.h>

/* Adds the socket's segments sent and segments retransmitted so far to *segs and *retrans.
 * Returns 0, or -1 (not a TCP socket, or an older kernel: nothing added). Non-blocking. */
int amdt_tcp_counters(int fd, uint64_t *segs, uint64_t *retrans);

#endif
