/* TCP_INFO counters (see tcpinfo.h). Kept apart: <linux/tcp.h> has the newer fields
 * (tcpi_segs_out) but clashes with <netinet/tcp.h> used elsewhere. */
#include "tcpinfo.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

int amdt_tcp_counters(int fd, uint64_t *segs, uint64_t *retrans)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);
    memset(&ti, 0, sizeof(ti));
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_segs_out) + sizeof(ti.tcpi_segs_out))
        return -1;
    *segs += ti.tcpi_segs_out;
    *retrans += ti.tcpi_total_retrans;
    return 0;
}
