/* verbs_check: RC data-path and error checks written against plain libibverbs, so they run on
 * any device: the mlx5 model (cargo xtask mlx5), rdma_rxe in the test guest, real hardware.
 * Compiled at test time, never part of the library:
 *     gcc -O2 -Wall -o target/mlx5-check/verbs_check tests/mlx5/verbs_check.c -libverbs
 *
 * Two RC endpoints: A (the requester, always in this process) and B (the responder). By
 * default B is a second device context in this process; with -S this process serves as B for
 * one peer on 127.0.0.1:<port>, and with a host argument it runs the checks as A against such
 * a server. Every operation on B goes through one request/reply function (serve()), called
 * directly or over TCP, so both modes run the same checks.
 *
 * Each check prints one PASS or FAIL line (FAIL says what was seen); the last line is
 * "verbs_check: N passed, M failed", and the exit status is 0 iff M is 0. Every wait has a
 * deadline (-t). Where a device may answer differently from the verbs spec and a known
 * driver does (rdma_rxe), the check says so on its line instead of hiding it. */
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define BUF_LEN (64 * 1024)
#define MAX_DATA 8192 /* largest read-back of B's memory in one reply */
#define MAX_PUT 64    /* largest exact write into B's memory in one request */
#define MAX_WC 32
#define MAGIC 0x76636b31u /* "vck1" */
#define RXE_VENDOR_ID 0xffffff

/* QP and CQ shape of one connection. */
struct opts {
	int cq_size, max_send_wr, max_recv_wr;
	uint8_t rnr_retry, min_rnr_timer;
};

static const struct opts DEFAULT_OPTS = {
	.cq_size = 64, .max_send_wr = 64, .max_recv_wr = 64, .rnr_retry = 7, .min_rnr_timer = 12,
};

/* What a peer needs to reach an endpoint's QP and memory. */
struct ep_info {
	uint32_t qpn;
	uint16_t lid;
	uint8_t gid[16];
	uint64_t addr;
	uint32_t rkey;
};

/* One endpoint: a device context with one registered buffer and the current CQ and QP. */
struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *buf;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_port_attr port;
	union ibv_gid gid;
};

/* Requests to B and its replies (both processes run this same binary: raw structs). */
enum op { OP_SETUP = 1, OP_CONNECT, OP_FILL, OP_PUT, OP_GET, OP_RECV, OP_POLL, OP_TO_ERR, OP_QUIT };

struct msg {
	uint32_t magic, op;
	struct opts o;
	struct ep_info info;
	uint64_t off, len, wr_id;
	uint32_t n, seed;
	int32_t ms;
	uint8_t data[MAX_PUT];
};

struct reply {
	int32_t ok;
	uint32_t n;
	struct ep_info info;
	char why[512];
	struct ibv_wc wc[MAX_WC];
	uint8_t data[MAX_DATA];
};

static const char *dev_name;
static int ib_port = 1, gid_index, timeout_ms = 10000;
static const char *only; /* comma-separated check names, or NULL for all */
static struct side A, B;
static int peer_fd = -1;
static int passed, failed;
static char why[2048]; /* why the running check failed */
static uint32_t vendor_id;

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	return 0;
}

/* Prefixes `why` with "what: "; returns 0. */
static int context(const char *what)
{
	char w[sizeof(why)];
	memcpy(w, why, sizeof(w));
	snprintf(why, sizeof(why), "%s: %.*s", what, (int)(sizeof(why) / 2), w);
	return 0;
}

static void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void info(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("  info: ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
}

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A short sleep between empty polls, leaving the CPU to a device model on a small machine. */
static void pause_briefly(void)
{
	struct timespec t = { 0, 50 * 1000 };
	nanosleep(&t, NULL);
}

static uint8_t pattern(uint32_t seed, uint64_t i)
{
	return seed ? (uint8_t)(seed * 131 + i * 7 + (i >> 8)) : 0;
}

static int is_rxe(void)
{
	return vendor_id == RXE_VENDOR_ID;
}

/* Whether the running kernel is major.minor or newer (uname's release). */
static int kernel_at_least(unsigned major, unsigned minor)
{
	struct utsname u;
	unsigned ma = 0, mi = 0;
	if (uname(&u) != 0 || sscanf(u.release, "%u.%u", &ma, &mi) != 2)
		return 0;
	return ma > major || (ma == major && mi >= minor);
}

static const char *fmt_wc(const struct ibv_wc *wc)
{
	static char s[8][160];
	static int k;
	char *p = s[k++ % 8];
	snprintf(p, 160, "{wr_id %llu, %s, opcode %d, flags %#x, byte_len %u, imm %#x, qp %#x}",
		 (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status), wc->opcode,
		 wc->wc_flags, wc->byte_len, ntohl(wc->imm_data), wc->qp_num);
	return p;
}

static void fmt_wcs(char *out, size_t len, const struct ibv_wc *wc, int n)
{
	size_t used = 0;
	out[0] = 0;
	for (int i = 0; i < n && used < len; i++)
		used += snprintf(out + used, len - used, "%s%s", i ? " " : "", fmt_wc(&wc[i]));
	if (!n)
		snprintf(out, len, "none");
}

/* Polls until `n` completions or `ms` pass; returns how many it got (at most `n`). */
static int poll_for(struct ibv_cq *cq, struct ibv_wc *wc, int n, int ms)
{
	int got = 0;
	int64_t end = now_ms() + ms;
	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return got;
		got += r;
		if (got < n) {
			if (now_ms() > end)
				break;
			pause_briefly();
		}
	}
	return got;
}

/* ---- One side: open, QP setup, connect. Failures return 0 with `why` set. ---- */

static int side_open(struct side *s)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || !num)
		return fail("no RDMA device (ibv_get_device_list: %s)", list ? "empty" : strerror(errno));
	struct ibv_device *dev = NULL;
	for (int i = 0; i < num; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name)) {
			dev = list[i];
			break;
		}
	if (!dev) {
		ibv_free_device_list(list);
		return fail("no device named %s", dev_name);
	}
	s->ctx = ibv_open_device(dev);
	ibv_free_device_list(list);
	if (!s->ctx)
		return fail("ibv_open_device: %s", strerror(errno));
	if (ibv_query_port(s->ctx, ib_port, &s->port))
		return fail("ibv_query_port %d: %s", ib_port, strerror(errno));
	if (s->port.state != IBV_PORT_ACTIVE)
		return fail("port %d is %s, not ACTIVE", ib_port, ibv_port_state_str(s->port.state));
	if (s->port.link_layer == IBV_LINK_LAYER_ETHERNET && ibv_query_gid(s->ctx, ib_port, gid_index, &s->gid))
		return fail("ibv_query_gid index %d: %s", gid_index, strerror(errno));
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		return fail("ibv_alloc_pd: %s", strerror(errno));
	s->buf = aligned_alloc(4096, BUF_LEN);
	if (!s->buf)
		return fail("out of memory");
	memset(s->buf, 0, BUF_LEN);
	s->mr = ibv_reg_mr(s->pd, s->buf, BUF_LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!s->mr)
		return fail("ibv_reg_mr: %s", strerror(errno));
	return 1;
}

static void side_drop_qp(struct side *s)
{
	if (s->qp)
		ibv_destroy_qp(s->qp);
	if (s->cq)
		ibv_destroy_cq(s->cq);
	s->qp = NULL;
	s->cq = NULL;
}

static void side_close(struct side *s)
{
	side_drop_qp(s);
	if (s->mr)
		ibv_dereg_mr(s->mr);
	if (s->pd)
		ibv_dealloc_pd(s->pd);
	if (s->ctx)
		ibv_close_device(s->ctx);
	free(s->buf);
	memset(s, 0, sizeof(*s));
}

/* A fresh CQ and RC QP in INIT; `out` says how to reach them. */
static int side_setup(struct side *s, const struct opts *o, struct ep_info *out)
{
	side_drop_qp(s);
	s->cq = ibv_create_cq(s->ctx, o->cq_size, NULL, NULL, 0);
	if (!s->cq)
		return fail("ibv_create_cq(%d): %s", o->cq_size, strerror(errno));
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = o->max_send_wr, .max_recv_wr = o->max_recv_wr,
			 .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64 },
	};
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->qp)
		return fail("ibv_create_qp: %s", strerror(errno));
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = ib_port, .pkey_index = 0,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC,
	};
	int e = ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	if (e)
		return fail("modify to INIT: %s", strerror(e));
	memset(out, 0, sizeof(*out));
	out->qpn = s->qp->qp_num;
	out->lid = s->port.lid;
	memcpy(out->gid, s->gid.raw, 16);
	out->addr = (uintptr_t)s->buf;
	out->rkey = s->mr->rkey;
	return 1;
}

/* QP `qp` of side `s` from INIT to RTR to RTS towards `peer`: LIDs on InfiniBand, GIDs (index
 * -g) on RoCE. */
static int qp_connect(struct side *s, struct ibv_qp *qp, const struct opts *o, const struct ep_info *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qpn,
		.rq_psn = 0, .max_dest_rd_atomic = 1, .min_rnr_timer = o->min_rnr_timer,
		.ah_attr = { .port_num = ib_port, .dlid = peer->lid },
	};
	if (s->port.link_layer == IBV_LINK_LAYER_ETHERNET) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, peer->gid, 16);
		a.ah_attr.grh.sgid_index = gid_index;
		a.ah_attr.grh.hop_limit = 1;
	}
	int e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (e)
		return fail("modify to RTR: %s", strerror(e));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = o->rnr_retry;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	e = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (e)
		return fail("modify to RTS: %s", strerror(e));
	return 1;
}

static int side_connect(struct side *s, const struct opts *o, const struct ep_info *peer)
{
	return qp_connect(s, s->qp, o, peer);
}

static int to_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	int e = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	return e ? fail("modify to ERR: %s", strerror(e)) : 1;
}

/* Posts `n` receives of `len` bytes each at `off`, `off + len`, ... (0 bytes: no SGE). */
static int post_recvs(struct side *s, uint64_t wr_id, uint64_t off, uint64_t len, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)s->buf + off + i * len, .length = len, .lkey = s->mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = wr_id + i, .sg_list = &sge, .num_sge = len ? 1 : 0 }, *bad;
		if (off + (i + 1) * len > BUF_LEN)
			return fail("receive buffer out of range");
		int e = ibv_post_recv(s->qp, &wr, &bad);
		if (e)
			return fail("ibv_post_recv: %s", strerror(e));
	}
	return 1;
}

/* ---- B's side of every request, run here or in the server process. ---- */

static void serve(struct side *s, const struct msg *m, struct reply *r)
{
	r->ok = 1;
	r->n = 0;
	why[0] = 0;
	int range_ok = m->off <= BUF_LEN && m->len <= BUF_LEN - m->off;
	switch (m->op) {
	case OP_SETUP:
		r->ok = side_setup(s, &m->o, &r->info);
		break;
	case OP_CONNECT:
		r->ok = side_connect(s, &m->o, &m->info);
		break;
	case OP_FILL:
		if (!(r->ok = range_ok ? 1 : fail("fill out of range")))
			break;
		for (uint64_t i = 0; i < m->len; i++)
			s->buf[m->off + i] = pattern(m->seed, i);
		break;
	case OP_PUT:
		if ((r->ok = range_ok && m->len <= MAX_PUT ? 1 : fail("put out of range")))
			memcpy(s->buf + m->off, m->data, m->len);
		break;
	case OP_GET:
		if ((r->ok = range_ok && m->len <= MAX_DATA ? 1 : fail("get out of range")))
			memcpy(r->data, s->buf + m->off, m->len);
		break;
	case OP_RECV:
		r->ok = post_recvs(s, m->wr_id, m->off, m->len, m->n);
		break;
	case OP_POLL:
		r->n = poll_for(s->cq, r->wc, m->n > MAX_WC ? MAX_WC : m->n, m->ms);
		break;
	case OP_TO_ERR:
		r->ok = to_err(s->qp);
		break;
	default:
		r->ok = fail("unknown request %u", m->op);
	}
	snprintf(r->why, sizeof(r->why), "%s", why);
}

/* Reads or writes exactly `len` bytes within `ms`. */
static int io_full(int fd, void *p, size_t len, int writing, int ms)
{
	int64_t end = now_ms() + ms;
	while (len) {
		struct pollfd pfd = { .fd = fd, .events = writing ? POLLOUT : POLLIN };
		int left = (int)(end - now_ms());
		if (left <= 0 || poll(&pfd, 1, left) <= 0)
			return 0;
		ssize_t k = writing ? write(fd, p, len) : read(fd, p, len);
		if (k <= 0)
			return 0;
		p = (char *)p + k;
		len -= k;
	}
	return 1;
}

/* The longest a request can take on the other side, plus slack. */
static int rpc_ms(void)
{
	return 3 * timeout_ms + 30000;
}

/* Runs one request on B: in this process, or at the server. */
static int peer(struct msg *m, struct reply *r)
{
	m->magic = MAGIC;
	if (peer_fd < 0) {
		serve(&B, m, r);
	} else if (!io_full(peer_fd, m, sizeof(*m), 1, rpc_ms()) || !io_full(peer_fd, r, sizeof(*r), 0, rpc_ms())) {
		return fail("lost the server (request %u)", m->op);
	}
	if (!r->ok)
		return fail("peer: %s", r->why);
	return 1;
}

static struct reply reply; /* large: not on the stack */

static int peer_fill(uint64_t off, uint64_t len, uint32_t seed)
{
	struct msg m = { .op = OP_FILL, .off = off, .len = len, .seed = seed };
	return peer(&m, &reply);
}

static int peer_put(uint64_t off, const void *data, uint64_t len)
{
	struct msg m = { .op = OP_PUT, .off = off, .len = len };
	memcpy(m.data, data, len);
	return peer(&m, &reply);
}

static const uint8_t *peer_get(uint64_t off, uint64_t len)
{
	struct msg m = { .op = OP_GET, .off = off, .len = len };
	return peer(&m, &reply) ? reply.data : NULL;
}

static int peer_recv(uint64_t wr_id, uint64_t off, uint64_t len, uint32_t n)
{
	struct msg m = { .op = OP_RECV, .wr_id = wr_id, .off = off, .len = len, .n = n };
	return peer(&m, &reply);
}

/* Polls B's CQ for up to `n` completions within `ms`; they are in reply.wc. */
static int peer_poll(uint32_t n, int ms)
{
	struct msg m = { .op = OP_POLL, .n = n, .ms = ms };
	return peer(&m, &reply) ? (int)reply.n : -1;
}

static int peer_to_err(void)
{
	struct msg m = { .op = OP_TO_ERR };
	return peer(&m, &reply);
}

/* ---- Connections and expectations ---- */

static struct ep_info a_info, b_info;

/* A fresh connected pair: A with `oa`, B with the default shape (its min_rnr_timer from `oa`). */
static int connect_pair(const struct opts *oa)
{
	struct opts ob = DEFAULT_OPTS;
	ob.min_rnr_timer = oa->min_rnr_timer;
	struct msg m = { .op = OP_SETUP, .o = ob };
	if (!side_setup(&A, oa, &a_info) || !peer(&m, &reply))
		return 0;
	b_info = reply.info;
	struct msg c = { .op = OP_CONNECT, .o = ob, .info = a_info };
	return side_connect(&A, oa, &b_info) && peer(&c, &reply);
}

/* Waits for exactly `n` completions on A's CQ into `wc`. */
static int a_wait(struct ibv_wc *wc, int n, const char *what)
{
	int got = poll_for(A.cq, wc, n, timeout_ms);
	if (got < n) {
		char seen[1024];
		fmt_wcs(seen, sizeof(seen), wc, got);
		return fail("%s: %d of %d completions within %d ms; seen: %s", what, got, n, timeout_ms, seen);
	}
	return 1;
}

/* Waits for exactly `n` completions on B's CQ (into reply.wc). */
static int b_wait(int n, const char *what)
{
	int got = peer_poll(n, timeout_ms);
	if (got < 0)
		return 0;
	if (got < n) {
		char seen[1024];
		fmt_wcs(seen, sizeof(seen), reply.wc, got);
		return fail("%s: %d of %d completions on the responder within %d ms; seen: %s", what, got, n,
			    timeout_ms, seen);
	}
	return 1;
}

/* Checks that no completion arrives on A's (b = 0) or B's (b = 1) CQ within `ms`. */
static int idle(int b, int ms, const char *what)
{
	struct ibv_wc wc[4];
	int got = b ? peer_poll(4, ms) : poll_for(A.cq, wc, 4, ms);
	if (got < 0)
		return 0;
	if (got) {
		char seen[1024];
		fmt_wcs(seen, sizeof(seen), b ? reply.wc : wc, got);
		return fail("%s: unexpected completion on %s: %s", what, b ? "the responder" : "the requester", seen);
	}
	return 1;
}

/* Checks one completion's status, wr_id, QP and (unless -1) opcode. */
static int expect_wc(const struct ibv_wc *wc, uint64_t wr_id, enum ibv_wc_status st, int opcode, uint32_t qpn)
{
	if (wc->wr_id != wr_id || wc->status != st || wc->qp_num != qpn || (opcode >= 0 && (int)wc->opcode != opcode))
		return fail("completion %s; expected wr_id %llu, %s, opcode %d, qp %#x", fmt_wc(wc),
			    (unsigned long long)wr_id, ibv_wc_status_str(st), opcode, qpn);
	return 1;
}

/* Checks `len` bytes at `got` against `want`, naming the first difference. */
static int same_bytes(const uint8_t *got, const uint8_t *want, size_t len, const char *what)
{
	for (size_t i = 0; i < len; i++)
		if (got[i] != want[i])
			return fail("%s: byte %zu of %zu is %#04x, expected %#04x", what, i, len, got[i], want[i]);
	return 1;
}

/* Checks B's memory [off, off + len) against the pattern `seed` at pattern offset `from`. */
static int b_holds(uint64_t off, uint64_t len, uint32_t seed, uint64_t from, const char *what)
{
	static uint8_t want[MAX_DATA];
	const uint8_t *got = peer_get(off, len);
	if (!got)
		return 0;
	for (uint64_t i = 0; i < len; i++)
		want[i] = pattern(seed, from + i);
	return same_bytes(got, want, len, what);
}

static void fill_local(uint8_t *p, uint64_t len, uint32_t seed)
{
	for (uint64_t i = 0; i < len; i++)
		p[i] = pattern(seed, i);
}

/* Posts one work request on A; `sge` may be NULL (no data). */
static int a_post(uint64_t wr_id, enum ibv_wr_opcode op, struct ibv_sge *sge, int nsge, uint64_t raddr,
		  uint32_t rkey, uint32_t imm_host, unsigned flags)
{
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = sge, .num_sge = nsge, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED | flags, .imm_data = htonl(imm_host),
		.wr.rdma = { .remote_addr = raddr, .rkey = rkey },
	}, *bad;
	int e = ibv_post_send(A.qp, &wr, &bad);
	return e ? fail("ibv_post_send (wr_id %llu): %s", (unsigned long long)wr_id, strerror(e)) : 1;
}

static int a_atomic(uint64_t wr_id, enum ibv_wr_opcode op, uint64_t local_off, uint64_t remote_off,
		    uint64_t compare_add, uint64_t swap)
{
	struct ibv_sge sge = { .addr = (uintptr_t)A.buf + local_off, .length = 8, .lkey = A.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op, .send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = b_info.addr + remote_off, .compare_add = compare_add,
			       .swap = swap, .rkey = b_info.rkey },
	}, *bad;
	int e = ibv_post_send(A.qp, &wr, &bad);
	return e ? fail("ibv_post_send (atomic): %s", strerror(e)) : 1;
}

static struct ibv_sge a_sge(uint64_t off, uint32_t len)
{
	return (struct ibv_sge){ .addr = (uintptr_t)A.buf + off, .length = len, .lkey = A.mr->lkey };
}

/* ---- The checks. Each returns 1, or 0 with `why` set. ---- */

/* RDMA WRITE of 1 and 77 bytes from one SGE and 5000 bytes gathered from two (several 1024-byte
 * packets); the exact bytes land, the bytes around them stay, the responder sees no completion. */
static int check_rdma_write(void)
{
	static const struct { uint32_t len0, len1; uint64_t roff; } cases[] = {
		{ 1, 0, 3 }, { 77, 0, 200 }, { 3000, 2000, 1024 + 64 },
	};
	if (!connect_pair(&DEFAULT_OPTS))
		return 0;
	for (unsigned c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		uint32_t len0 = cases[c].len0, len1 = cases[c].len1, total = len0 + len1;
		uint64_t roff = cases[c].roff;
		fill_local(A.buf, 16384, 11 + c);
		struct ibv_sge sge[2] = { a_sge(0, len0), a_sge(8192, len1) };
		struct ibv_wc wc;
		if (!peer_fill(0, 8192, 0) || !a_post(c, IBV_WR_RDMA_WRITE, sge, len1 ? 2 : 1, b_info.addr + roff,
							 b_info.rkey, 0, 0) ||
		    !a_wait(&wc, 1, "RDMA WRITE") || !expect_wc(&wc, c, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a_info.qpn))
			return 0;
		const uint8_t *got = peer_get(0, 8192);
		if (!got)
			return 0;
		for (uint64_t i = 0; i < 8192; i++) {
			uint8_t want = i < roff || i >= roff + total ? 0 :
				       i < roff + len0 ? A.buf[i - roff] : A.buf[8192 + i - roff - len0];
			if (got[i] != want)
				return fail("%u-byte write at offset %llu: remote byte %llu is %#04x, expected %#04x",
					    total, (unsigned long long)roff, (unsigned long long)i, got[i], want);
		}
	}
	return idle(1, 100, "RDMA WRITE consumes no receive");
}

/* RDMA READ of 1 and 5000 bytes into a zeroed buffer; the exact bytes arrive, none past them. */
static int check_rdma_read(void)
{
	static const uint32_t lens[] = { 1, 5000 };
	if (!connect_pair(&DEFAULT_OPTS))
		return 0;
	for (unsigned c = 0; c < 2; c++) {
		uint32_t len = lens[c];
		struct ibv_sge sge = a_sge(16384, len);
		struct ibv_wc wc;
		memset(A.buf + 16384, 0, 8192);
		if (!peer_fill(1000, len, 22 + c) ||
		    !a_post(c, IBV_WR_RDMA_READ, &sge, 1, b_info.addr + 1000, b_info.rkey, 0, 0) ||
		    !a_wait(&wc, 1, "RDMA READ") || !expect_wc(&wc, c, IBV_WC_SUCCESS, IBV_WC_RDMA_READ, a_info.qpn))
			return 0;
		for (uint32_t i = 0; i < 8192; i++) {
			uint8_t want = i < len ? pattern(22 + c, i) : 0;
			if (A.buf[16384 + i] != want)
				return fail("%u-byte read: local byte %u is %#04x, expected %#04x", len, i,
					    A.buf[16384 + i], want);
		}
	}
	return 1;
}

/* RDMA WRITE with immediate, 300 bytes and 0 bytes: the bytes land, and each consumes one
 * receive whose completion is RECV_RDMA_WITH_IMM with IBV_WC_WITH_IMM, the immediate value and
 * byte_len; the receive's own buffer stays untouched. */
static int check_rdma_write_with_imm(void)
{
	if (!connect_pair(&DEFAULT_OPTS) || !peer_fill(0, 8192, 0) || !peer_fill(32768, 256, 0) ||
	    !peer_recv(70, 32768, 64, 2))
		return 0;
	fill_local(A.buf, 300, 33);
	struct ibv_sge sge = a_sge(0, 300);
	struct ibv_wc wc[2];
	if (!a_post(1, IBV_WR_RDMA_WRITE_WITH_IMM, &sge, 1, b_info.addr + 128, b_info.rkey, 0x11223344, 0) ||
	    !a_post(2, IBV_WR_RDMA_WRITE_WITH_IMM, NULL, 0, b_info.addr, b_info.rkey, 0xa5a5a5a5, 0) ||
	    !a_wait(wc, 2, "WRITE_WITH_IMM") ||
	    !expect_wc(&wc[0], 1, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a_info.qpn) ||
	    !expect_wc(&wc[1], 2, IBV_WC_SUCCESS, IBV_WC_RDMA_WRITE, a_info.qpn) || !b_wait(2, "WRITE_WITH_IMM"))
		return 0;
	static const uint32_t imm[2] = { 0x11223344, 0xa5a5a5a5 }, len[2] = { 300, 0 };
	for (int i = 0; i < 2; i++) {
		struct ibv_wc *r = &reply.wc[i];
		if (!expect_wc(r, 70 + i, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, b_info.qpn))
			return 0;
		if (!(r->wc_flags & IBV_WC_WITH_IMM) || ntohl(r->imm_data) != imm[i] || r->byte_len != len[i])
			return fail("receive completion %s: expected IBV_WC_WITH_IMM, imm %#x, byte_len %u",
				    fmt_wc(r), imm[i], len[i]);
	}
	return b_holds(0, 128, 0, 0, "bytes before the write") && b_holds(128, 300, 33, 0, "written bytes") &&
	       b_holds(428, 1000, 0, 0, "bytes after the write") &&
	       b_holds(32768, 256, 0, 0, "the receive buffers of WRITE_WITH_IMM") &&
	       idle(1, 100, "WRITE_WITH_IMM");
}

/* SEND of 4000 bytes gathered from two SGEs, and an inline SEND of 60 bytes from unregistered
 * memory changed right after posting: RECV completions without IBV_WC_WITH_IMM, exact bytes. */
static int check_send(void)
{
	if (!connect_pair(&DEFAULT_OPTS) || !peer_fill(0, 16384, 0))
		return 0;
	fill_local(A.buf, 8192, 44);
	struct ibv_sge sge[2] = { a_sge(0, 2500), a_sge(4096, 1500) };
	uint8_t scratch[60];
	for (int i = 0; i < 60; i++)
		scratch[i] = (uint8_t)(0xc0 + i);
	struct ibv_sge inl = { .addr = (uintptr_t)scratch, .length = 60, .lkey = 0 };
	struct ibv_wc wc[2];
	if (!peer_recv(10, 0, 4000, 1) || !peer_recv(11, 8192, 64, 1) ||
	    !a_post(1, IBV_WR_SEND, sge, 2, 0, 0, 0, 0) || !a_post(2, IBV_WR_SEND, &inl, 1, 0, 0, 0, IBV_SEND_INLINE))
		return 0;
	memset(scratch, 0xee, sizeof(scratch)); /* inline data was copied at post time */
	if (!a_wait(wc, 2, "SEND") || !expect_wc(&wc[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND, a_info.qpn) ||
	    !expect_wc(&wc[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND, a_info.qpn) || !b_wait(2, "SEND"))
		return 0;
	static const uint32_t len[2] = { 4000, 60 };
	for (int i = 0; i < 2; i++) {
		struct ibv_wc *r = &reply.wc[i];
		if (!expect_wc(r, 10 + i, IBV_WC_SUCCESS, IBV_WC_RECV, b_info.qpn))
			return 0;
		if ((r->wc_flags & IBV_WC_WITH_IMM) || r->byte_len != len[i])
			return fail("receive completion %s: expected no IBV_WC_WITH_IMM, byte_len %u", fmt_wc(r), len[i]);
	}
	const uint8_t *got = peer_get(0, 4000);
	uint8_t want[4000];
	memcpy(want, A.buf, 2500);
	memcpy(want + 2500, A.buf + 4096, 1500);
	if (!got || !same_bytes(got, want, 4000, "gathered SEND"))
		return 0;
	for (int i = 0; i < 60; i++)
		want[i] = (uint8_t)(0xc0 + i);
	return (got = peer_get(8192, 64)) && same_bytes(got, want, 60, "inline SEND") &&
	       b_holds(8192 + 60, 4, 0, 0, "bytes after the inline SEND") && b_holds(4000, 4096, 0, 0, "bytes after the SEND");
}

/* SEND with immediate, 100 bytes and 0 bytes: RECV completions with IBV_WC_WITH_IMM, the value,
 * byte_len, in posting order; the payload lands exactly. */
static int check_send_with_imm(void)
{
	if (!connect_pair(&DEFAULT_OPTS) || !peer_fill(0, 8192, 0) || !peer_recv(20, 0, 4096, 2))
		return 0;
	fill_local(A.buf, 100, 55);
	struct ibv_sge sge = a_sge(0, 100);
	struct ibv_wc wc[2];
	if (!a_post(1, IBV_WR_SEND_WITH_IMM, &sge, 1, 0, 0, 0xdeadbeef, 0) ||
	    !a_post(2, IBV_WR_SEND_WITH_IMM, NULL, 0, 0, 0, 1, 0) || !a_wait(wc, 2, "SEND_WITH_IMM") ||
	    !expect_wc(&wc[0], 1, IBV_WC_SUCCESS, IBV_WC_SEND, a_info.qpn) ||
	    !expect_wc(&wc[1], 2, IBV_WC_SUCCESS, IBV_WC_SEND, a_info.qpn) || !b_wait(2, "SEND_WITH_IMM"))
		return 0;
	static const uint32_t imm[2] = { 0xdeadbeef, 1 }, len[2] = { 100, 0 };
	for (int i = 0; i < 2; i++) {
		struct ibv_wc *r = &reply.wc[i];
		if (!expect_wc(r, 20 + i, IBV_WC_SUCCESS, IBV_WC_RECV, b_info.qpn))
			return 0;
		if (!(r->wc_flags & IBV_WC_WITH_IMM) || ntohl(r->imm_data) != imm[i] || r->byte_len != len[i])
			return fail("receive completion %s: expected IBV_WC_WITH_IMM, imm %#x, byte_len %u",
				    fmt_wc(r), imm[i], len[i]);
	}
	return b_holds(0, 100, 55, 0, "SEND_WITH_IMM payload") && b_holds(100, 3996, 0, 0, "bytes after it") &&
	       b_holds(4096, 4096, 0, 0, "the zero-byte receive's buffer") && idle(1, 100, "SEND_WITH_IMM");
}

/* The verbs API gives atomics in host byte order (a device reporting IBV_ATOMIC_HCA or GLOB
 * operates on host-order memory: mlx5's kernel driver reports NONE for hardware that only
 * answers big-endian). */
static int atomics_supported(void)
{
	struct ibv_device_attr da;
	if (ibv_query_device(A.ctx, &da))
		return fail("ibv_query_device: %s", strerror(errno));
	if (da.atomic_cap == IBV_ATOMIC_NONE)
		return fail("the device reports atomic_cap IBV_ATOMIC_NONE");
	return 1;
}

static int local_u64_is(uint64_t off, uint64_t want, const char *what)
{
	uint64_t got;
	memcpy(&got, A.buf + off, 8);
	return got == want ? 1 : fail("%s: %#018llx, expected %#018llx", what, (unsigned long long)got,
				      (unsigned long long)want);
}

static int remote_u64_is(uint64_t off, uint64_t want, const char *what)
{
	uint64_t got;
	const uint8_t *p = peer_get(off, 8);
	if (!p)
		return 0;
	memcpy(&got, p, 8);
	return got == want ? 1 : fail("%s: %#018llx, expected %#018llx", what, (unsigned long long)got,
				      (unsigned long long)want);
}

/* Compare-and-swap that matches (swaps, returns the old value) and one that does not (leaves
 * the value, returns it); values whose byte-swapped forms differ, so byte order shows. */
static int check_atomic_cmp_swap(void)
{
	const uint64_t v0 = 0x0123456789abcdefull, v1 = 0xfedcba9876543210ull, v2 = 0x1111222233334444ull;
	struct ibv_wc wc;
	if (!atomics_supported() || !connect_pair(&DEFAULT_OPTS) || !peer_fill(4000, 200, 0) ||
	    !peer_put(4096, &v0, 8))
		return 0;
	memset(A.buf, 0xff, 16);
	if (!a_atomic(1, IBV_WR_ATOMIC_CMP_AND_SWP, 0, 4096, v0, v1) || !a_wait(&wc, 1, "CAS") ||
	    !expect_wc(&wc, 1, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, a_info.qpn) ||
	    !local_u64_is(0, v0, "matching CAS returned") || !remote_u64_is(4096, v1, "memory after a matching CAS"))
		return 0;
	if (!a_atomic(2, IBV_WR_ATOMIC_CMP_AND_SWP, 8, 4096, v0, v2) || !a_wait(&wc, 1, "CAS") ||
	    !expect_wc(&wc, 2, IBV_WC_SUCCESS, IBV_WC_COMP_SWAP, a_info.qpn) ||
	    !local_u64_is(8, v1, "failing CAS returned") || !remote_u64_is(4096, v1, "memory after a failing CAS"))
		return 0;
	return b_holds(4088, 8, 0, 0, "bytes before the atomic's target") && b_holds(4104, 8, 0, 0, "bytes after it");
}

/* Fetch-and-add with a carry across the 32-bit halves, twice: returns the old values, memory
 * holds the sums. */
static int check_atomic_fetch_add(void)
{
	const uint64_t v0 = 0x00000001ffffffffull, add1 = 0x0000000100000001ull, add2 = 0x8000000000000005ull;
	struct ibv_wc wc;
	if (!atomics_supported() || !connect_pair(&DEFAULT_OPTS) || !peer_fill(4000, 200, 0) ||
	    !peer_put(4096, &v0, 8))
		return 0;
	memset(A.buf, 0xff, 16);
	if (!a_atomic(1, IBV_WR_ATOMIC_FETCH_AND_ADD, 0, 4096, add1, 0) || !a_wait(&wc, 1, "FAA") ||
	    !expect_wc(&wc, 1, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, a_info.qpn) ||
	    !local_u64_is(0, v0, "first FAA returned") || !remote_u64_is(4096, v0 + add1, "memory after one FAA"))
		return 0;
	if (!a_atomic(2, IBV_WR_ATOMIC_FETCH_AND_ADD, 8, 4096, add2, 0) || !a_wait(&wc, 1, "FAA") ||
	    !expect_wc(&wc, 2, IBV_WC_SUCCESS, IBV_WC_FETCH_ADD, a_info.qpn) ||
	    !local_u64_is(8, v0 + add1, "second FAA returned") ||
	    !remote_u64_is(4096, v0 + add1 + add2, "memory after two FAAs"))
		return 0;
	return b_holds(4088, 8, 0, 0, "bytes before the atomic's target") && b_holds(4104, 8, 0, 0, "bytes after it");
}

/* An RDMA WRITE with a wrong rkey completes REM_ACCESS_ERR and writes nothing; the request
 * posted behind it is flushed (the QP is in error). */
static int check_rem_access_err(void)
{
	if (!connect_pair(&DEFAULT_OPTS) || !peer_fill(0, 4096, 0))
		return 0;
	fill_local(A.buf, 64, 66);
	struct ibv_sge sge = a_sge(0, 64);
	struct ibv_wc wc[2];
	return a_post(1, IBV_WR_RDMA_WRITE, &sge, 1, b_info.addr, b_info.rkey ^ 0x5a5a00, 0, 0) &&
	       a_post(2, IBV_WR_RDMA_WRITE, &sge, 1, b_info.addr + 1024, b_info.rkey, 0, 0) &&
	       a_wait(wc, 2, "wrong rkey") && expect_wc(&wc[0], 1, IBV_WC_REM_ACCESS_ERR, -1, a_info.qpn) &&
	       expect_wc(&wc[1], 2, IBV_WC_WR_FLUSH_ERR, -1, a_info.qpn) &&
	       b_holds(0, 4096, 0, 0, "remote memory after a refused write") && idle(0, 100, "after REM_ACCESS_ERR");
}

/* A local SGE the lkey does not cover completes LOC_PROT_ERR: (a) an lkey naming no MR,
 * (b) a real lkey with an address past the end of its MR. Nothing reaches the responder. */
static int check_loc_prot_err(void)
{
	struct ibv_sge bad[2] = { a_sge(0, 64), a_sge(BUF_LEN, 64) };
	bad[0].lkey ^= 0x5a5a00;
	static const char *what[2] = { "an lkey naming no MR", "an address past the MR's end" };
	for (int c = 0; c < 2; c++) {
		struct ibv_wc wc;
		if (!connect_pair(&DEFAULT_OPTS) || !peer_fill(0, 4096, 0) ||
		    !a_post(c, IBV_WR_RDMA_WRITE, &bad[c], 1, b_info.addr, b_info.rkey, 0, 0) ||
		    !a_wait(&wc, 1, what[c]))
			return 0;
		/* rdma_rxe reports an unknown lkey as LOC_QP_OP_ERR on Linux 6.1 (copy_data ->
		 * -EINVAL), and both cases as WR_FLUSH_ERR on 6.12 (docs/kernel-facts.md, "Between
		 * kernels"). */
		enum ibv_wc_status rxe_status = kernel_at_least(6, 12) ? IBV_WC_WR_FLUSH_ERR :
					       c == 0		   ? IBV_WC_LOC_QP_OP_ERR :
								     IBV_WC_LOC_PROT_ERR;
		if (is_rxe() && rxe_status != IBV_WC_LOC_PROT_ERR && wc.status == rxe_status &&
		    wc.wr_id == (uint64_t)c) {
			info("rxe deviation: %s completes %s, not LOC_PROT_ERR", what[c], ibv_wc_status_str(rxe_status));
		} else if (!expect_wc(&wc, c, IBV_WC_LOC_PROT_ERR, -1, a_info.qpn)) {
			return context(what[c]);
		}
		if (!b_holds(0, 4096, 0, 0, "remote memory") || !idle(1, 100, what[c]))
			return 0;
	}
	return 1;
}

/* A SEND to a responder with no receive posted, min_rnr_timer 1 (0.01 ms): with rnr_retry 0
 * and 3 it completes RNR_RETRY_EXC_ERR; the responder completes nothing. */
static int check_rnr_retry_exc_err(void)
{
	static const uint8_t retries[2] = { 0, 3 };
	for (int c = 0; c < 2; c++) {
		struct opts o = DEFAULT_OPTS;
		o.rnr_retry = retries[c];
		o.min_rnr_timer = 1;
		struct ibv_sge sge = a_sge(0, 64);
		struct ibv_wc wc;
		int64_t t0 = now_ms();
		if (!connect_pair(&o) || !a_post(c, IBV_WR_SEND, &sge, 1, 0, 0, 0, 0) || !a_wait(&wc, 1, "RNR"))
			return 0;
		if (!expect_wc(&wc, c, IBV_WC_RNR_RETRY_EXC_ERR, -1, a_info.qpn))
			return context(retries[c] ? "rnr_retry 3" : "rnr_retry 0");
		info("rnr_retry %u: RNR_RETRY_EXC_ERR after %lld ms", retries[c], (long long)(now_ms() - t0));
		if (!idle(1, 100, "RNR"))
			return 0;
	}
	return 1;
}

/* ERR with work outstanding: 4 sends stuck in RNR retry (rnr_retry 7, no receive at the peer)
 * and 3 receives on A; then, on a fresh pair, 5 receives on B. Moving the QP to ERR flushes
 * every request exactly once, in posting order within each queue, as WR_FLUSH_ERR; then
 * nothing more. */
static int check_wr_flush_err(void)
{
	enum { S = 4, R = 3, RB = 5 };
	if (!connect_pair(&DEFAULT_OPTS) || !post_recvs(&A, 1000, 32768, 64, R))
		return 0;
	struct ibv_sge sge = a_sge(0, 64);
	for (int i = 0; i < S; i++)
		if (!a_post(i, IBV_WR_SEND, &sge, 1, 0, 0, 0, 0))
			return 0;
	if (!idle(0, 200, "sends waiting for a receive (rnr_retry 7)") || !to_err(A.qp))
		return 0;
	struct ibv_wc wc[MAX_WC];
	int got = poll_for(A.cq, wc, S + R, timeout_ms);
	int extra = poll_for(A.cq, wc + got, MAX_WC - got, 200);
	char seen[2048];
	fmt_wcs(seen, sizeof(seen), wc, got + extra);
	if (got + extra != S + R)
		return fail("requester: %d flush completions, expected %d; seen: %s", got + extra, S + R, seen);
	int next_send = 0, next_recv = 1000;
	for (int i = 0; i < S + R; i++) {
		int is_recv = wc[i].wr_id >= 1000;
		uint64_t want = is_recv ? (uint64_t)next_recv++ : (uint64_t)next_send++;
		if (wc[i].wr_id != want || wc[i].status != IBV_WC_WR_FLUSH_ERR || wc[i].qp_num != a_info.qpn)
			return fail("requester: completion %d is %s, expected wr_id %llu WR_FLUSH_ERR; seen: %s", i,
				    fmt_wc(&wc[i]), (unsigned long long)want, seen);
	}
	/* A fresh pair, so no retransmission of A's sends can meet B's receives. */
	if (!connect_pair(&DEFAULT_OPTS) || !peer_recv(2000, 0, 64, RB) || !peer_to_err())
		return 0;
	int n = peer_poll(RB, timeout_ms);
	if (n < 0)
		return 0;
	struct ibv_wc bw[MAX_WC];
	memcpy(bw, reply.wc, sizeof(bw));
	int more = peer_poll(4, 200);
	if (more < 0)
		return 0;
	memcpy(bw + n, reply.wc, more * sizeof(bw[0]));
	fmt_wcs(seen, sizeof(seen), bw, n + more);
	if (n + more != RB)
		return fail("responder: %d flush completions, expected %d; seen: %s", n + more, RB, seen);
	for (int i = 0; i < RB; i++)
		if (bw[i].wr_id != 2000u + i || bw[i].status != IBV_WC_WR_FLUSH_ERR || bw[i].qp_num != b_info.qpn)
			return fail("responder: completion %d is %s, expected wr_id %d WR_FLUSH_ERR", i,
				    fmt_wc(&bw[i]), 2000 + i);
	return 1;
}

/* Acknowledges every async event already queued, naming each. */
static void drain_async_events(void)
{
	struct pollfd p = { .fd = A.ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	while (poll(&p, 1, 0) == 1 && !ibv_get_async_event(A.ctx, &ev)) {
		info("async event from an earlier check: %s", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
	}
}

/* More signaled writes than the CQ holds, none polled: the device reports IBV_EVENT_CQ_ERR
 * naming that CQ (read with ibv_get_async_event after poll() on the async fd says it is ready). */
static int check_cq_overrun_event(void)
{
	struct opts o = DEFAULT_OPTS;
	o.cq_size = 2;
	drain_async_events();
	if (!connect_pair(&o))
		return 0;
	int n = A.cq->cqe + 4;
	if (n > o.max_send_wr)
		return fail("the CQ holds %d, more than the send queue", A.cq->cqe);
	struct ibv_sge sge = a_sge(0, 8);
	for (int i = 0; i < n; i++)
		if (!a_post(i, IBV_WR_RDMA_WRITE, &sge, 1, b_info.addr, b_info.rkey, 0, 0))
			return 0;
	char seen[512] = "";
	size_t used = 0;
	int64_t end = now_ms() + timeout_ms;
	for (;;) {
		struct pollfd p = { .fd = A.ctx->async_fd, .events = POLLIN };
		int left = (int)(end - now_ms());
		if (left <= 0 || poll(&p, 1, left) != 1)
			return fail("no IBV_EVENT_CQ_ERR within %d ms after %d signaled writes on a CQ of %d; other events: %s",
				    timeout_ms, n, A.cq->cqe, used ? seen : "none");
		struct ibv_async_event ev;
		if (ibv_get_async_event(A.ctx, &ev))
			return fail("ibv_get_async_event: %s", strerror(errno));
		int hit = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == A.cq;
		if (!hit && used < sizeof(seen))
			used += snprintf(seen + used, sizeof(seen) - used, "%s ", ibv_event_type_str(ev.event_type));
		ibv_ack_async_event(&ev);
		if (hit)
			return 1;
	}
}

/* A's objects for check_srq_limit_event, destroyed whatever the outcome. */
static struct {
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_qp *tx, *rx;
} S;

static void srq_objects_drop(void)
{
	if (S.rx)
		ibv_destroy_qp(S.rx);
	if (S.tx)
		ibv_destroy_qp(S.tx);
	if (S.srq)
		ibv_destroy_srq(S.srq);
	if (S.cq)
		ibv_destroy_cq(S.cq);
	memset(&S, 0, sizeof(S));
}

static int srq_limit_event(void)
{
	struct opts o = DEFAULT_OPTS;
	S.cq = ibv_create_cq(A.ctx, 64, NULL, NULL, 0);
	if (!S.cq)
		return fail("ibv_create_cq: %s", strerror(errno));
	struct ibv_srq_init_attr si = { .attr = { .max_wr = 16, .max_sge = 1 } };
	S.srq = ibv_create_srq(A.pd, &si);
	if (!S.srq)
		return fail("ibv_create_srq: %s", strerror(errno));
	struct ibv_qp_init_attr ia = {
		.send_cq = S.cq, .recv_cq = S.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	S.tx = ibv_create_qp(A.pd, &ia);
	ia.srq = S.srq;
	ia.cap.max_recv_wr = 0;
	S.rx = S.tx ? ibv_create_qp(A.pd, &ia) : NULL;
	if (!S.rx)
		return fail("ibv_create_qp%s: %s", S.tx ? " on the SRQ" : "", strerror(errno));
	struct ibv_qp *qps[2] = { S.tx, S.rx };
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = ib_port };
		int e = ibv_modify_qp(qps[i], &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
		if (e)
			return fail("modify to INIT: %s", strerror(e));
		struct ep_info peer = { .qpn = qps[1 - i]->qp_num, .lid = A.port.lid };
		memcpy(peer.gid, A.gid.raw, 16);
		if (!qp_connect(&A, qps[i], &o, &peer))
			return 0;
	}
	for (uint64_t i = 0; i < 8; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)A.buf + 4096 + i * 64, .length = 64, .lkey = A.mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 100 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		int e = ibv_post_srq_recv(S.srq, &wr, &bad);
		if (e)
			return fail("ibv_post_srq_recv: %s", strerror(e));
	}
	struct ibv_srq_attr sa = { .srq_limit = 4 };
	int e = ibv_modify_srq(S.srq, &sa, IBV_SRQ_LIMIT);
	if (e)
		return fail("ibv_modify_srq(IBV_SRQ_LIMIT 4): %s", strerror(e));
	/* 8 posted, 4 sends: 4 left, not below the limit; the fifth leaves 3. */
	struct ibv_wc wc[MAX_WC];
	for (int i = 0; i < 5; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)A.buf, .length = 32, .lkey = A.mr->lkey };
		struct ibv_send_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		e = ibv_post_send(S.tx, &wr, &bad);
		if (e)
			return fail("ibv_post_send: %s", strerror(e));
		if (poll_for(S.cq, wc, 2, timeout_ms) != 2)
			return fail("send %d: no send and receive completion", i);
		for (int k = 0; k < 2; k++)
			if (wc[k].status != IBV_WC_SUCCESS)
				return fail("send %d: %s", i, fmt_wc(&wc[k]));
		struct ibv_wc *r = wc[0].opcode == IBV_WC_RECV ? &wc[0] : &wc[1];
		if (r->opcode != IBV_WC_RECV || r->wr_id != 100 + (uint64_t)i || r->qp_num != S.rx->qp_num)
			return fail("send %d: receive completion %s (the SRQ's receives are taken in order)", i, fmt_wc(r));
		struct pollfd p = { .fd = A.ctx->async_fd, .events = POLLIN };
		int ready = poll(&p, 1, i < 4 ? 0 : timeout_ms);
		if (i < 4 && ready == 1) {
			struct ibv_async_event early;
			const char *what = "unreadable";
			if (ibv_get_async_event(A.ctx, &early) == 0) {
				what = ibv_event_type_str(early.event_type);
				ibv_ack_async_event(&early);
			}
			return fail("an async event (%s) with %d receives left, above the limit of 4", what, 7 - i);
		}
		if (i == 4 && ready != 1)
			return fail("no async event within %d ms with 3 receives left, below the limit of 4", timeout_ms);
	}
	struct ibv_async_event ev;
	if (ibv_get_async_event(A.ctx, &ev))
		return fail("ibv_get_async_event: %s", strerror(errno));
	int hit = ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == S.srq;
	enum ibv_event_type got = ev.event_type;
	ibv_ack_async_event(&ev);
	if (!hit)
		return fail("expected IBV_EVENT_SRQ_LIMIT_REACHED on the SRQ, got %s", ibv_event_type_str(got));
	if ((e = ibv_query_srq(S.srq, &sa)))
		return fail("ibv_query_srq: %s", strerror(e));
	if (sa.srq_limit != 0)
		return fail("ibv_query_srq after the event: limit %u, not 0 (disarmed)", sa.srq_limit);
	return 1;
}

/* An SRQ with 8 receives posted and its limit armed at 4, a QP on it and a sender, both on A's
 * context: 5 sends, each taking the SRQ's receives in the order posted; no async event while
 * 4 or more are left; IBV_EVENT_SRQ_LIMIT_REACHED naming the SRQ once 3 are; the limit reads 0
 * afterwards. Destroying the SRQ then returns (libibverbs waits for the events it reported). */
static int check_srq_limit_event(void)
{
	drain_async_events();
	int ok = srq_limit_event();
	srq_objects_drop();
	return ok;
}

/* The device's raw clock (ibv_query_rt_values_ex, IBV_VALUES_MASK_RAW_CLOCK): on mlx5 it is
 * read from the core clock page the provider maps at context creation, and must advance: read
 * again every 20 ms, for up to 2 s (the model's device thread refreshes the page on each of its
 * passes, which a loaded host can delay well past 20 ms). A provider without a device clock
 * (rdma_rxe) answers EOPNOTSUPP; the line says so. */
static int read_raw_clock(uint64_t *t, int first)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	int r = ibv_query_rt_values_ex(A.ctx, &v);
	if (r == EOPNOTSUPP && first)
		return EOPNOTSUPP;
	if (r)
		return fail("ibv_query_rt_values_ex: %s", strerror(r)), -1;
	if (!(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK))
		return fail("ibv_query_rt_values_ex returned no raw clock"), -1;
	*t = (uint64_t)v.raw_clock.tv_sec * 1000000000ull + (uint64_t)v.raw_clock.tv_nsec;
	return 0;
}

static int check_raw_clock(void)
{
	uint64_t t0, t1 = 0;
	int r = read_raw_clock(&t0, 1);
	if (r == EOPNOTSUPP) {
		info("the provider has no device clock: ibv_query_rt_values_ex is EOPNOTSUPP");
		return 1;
	}
	if (r)
		return 0;
	int waits = 0;
	do {
		usleep(20000);
		if (read_raw_clock(&t1, 0))
			return 0;
	} while (t1 <= t0 && ++waits < 100);
	if (t1 <= t0)
		return fail("the raw clock did not advance in 2 s: %llu then %llu", (unsigned long long)t0,
			    (unsigned long long)t1);
	info("raw clock %llu then %llu, %d ms apart", (unsigned long long)t0, (unsigned long long)t1,
	     20 * (waits + 1));
	return 1;
}

static const struct check {
	const char *name;
	int (*run)(void);
} CHECKS[] = {
	{ "rdma_write", check_rdma_write },
	{ "rdma_read", check_rdma_read },
	{ "rdma_write_with_imm", check_rdma_write_with_imm },
	{ "send", check_send },
	{ "send_with_imm", check_send_with_imm },
	{ "atomic_cmp_swap", check_atomic_cmp_swap },
	{ "atomic_fetch_add", check_atomic_fetch_add },
	{ "rem_access_err", check_rem_access_err },
	{ "loc_prot_err", check_loc_prot_err },
	{ "rnr_retry_exc_err", check_rnr_retry_exc_err },
	{ "wr_flush_err", check_wr_flush_err },
	{ "cq_overrun_event", check_cq_overrun_event },
	{ "raw_clock", check_raw_clock },
	{ "srq_limit_event", check_srq_limit_event },
};

static int selected(const char *name)
{
	if (!only)
		return 1;
	size_t len = strlen(name);
	for (const char *p = only; (p = strstr(p, name)); p += len)
		if ((p == only || p[-1] == ',') && (p[len] == ',' || !p[len]))
			return 1;
	return 0;
}

/* ---- Modes ---- */

static int tcp_listen(int port)
{
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1))
		return -1;
	return fd;
}

/* Connects to host:port, retrying for 10 s while the server starts. */
static int tcp_connect(const char *host, int port)
{
	char ports[16];
	snprintf(ports, sizeof(ports), "%d", port);
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res;
	if (getaddrinfo(host, ports, &hints, &res))
		return -1;
	int fd = -1;
	for (int64_t end = now_ms() + 10000; fd < 0 && now_ms() < end;) {
		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen)) {
			close(fd);
			fd = -1;
			usleep(100 * 1000);
		}
	}
	freeaddrinfo(res);
	return fd;
}

/* -S: serves B's requests for one client, then exits (0 after its QUIT). */
static int run_server(int port)
{
	if (!side_open(&B)) {
		fprintf(stderr, "verbs_check: server: %s\n", why);
		return 1;
	}
	int lfd = tcp_listen(port);
	if (lfd < 0) {
		fprintf(stderr, "verbs_check: server: cannot listen on 127.0.0.1:%d: %s\n", port, strerror(errno));
		return 1;
	}
	printf("verbs_check: serving %s on 127.0.0.1:%d\n", ibv_get_device_name(B.ctx->device), port);
	fflush(stdout);
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	int fd = poll(&p, 1, 60000) == 1 ? accept(lfd, NULL, NULL) : -1;
	close(lfd);
	if (fd < 0) {
		fprintf(stderr, "verbs_check: server: no client within 60 s\n");
		return 1;
	}
	static struct msg m;
	for (;;) {
		if (!io_full(fd, &m, sizeof(m), 0, rpc_ms()) || m.magic != MAGIC) {
			fprintf(stderr, "verbs_check: server: lost the client\n");
			return 1;
		}
		if (m.op == OP_QUIT)
			break;
		serve(&B, &m, &reply);
		if (!io_full(fd, &reply, sizeof(reply), 1, rpc_ms())) {
			fprintf(stderr, "verbs_check: server: cannot reply\n");
			return 1;
		}
	}
	close(fd);
	side_close(&B);
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: verbs_check [-d device] [-i port] [-g gid_index] [-t timeout_s] [-c check,...]\n"
		"                   [-p tcp_port] [-S | server_host]\n"
		"  one process (default), or -S: serve as the responder on 127.0.0.1:tcp_port (default\n"
		"  18600), or server_host: run the checks against that server\n");
	exit(2);
}

int main(int argc, char **argv)
{
	int opt, serve_mode = 0, tcp_port = 18600;
	while ((opt = getopt(argc, argv, "d:i:g:t:c:p:S")) != -1) {
		switch (opt) {
		case 'd': dev_name = optarg; break;
		case 'i': ib_port = atoi(optarg); break;
		case 'g': gid_index = atoi(optarg); break;
		case 't': timeout_ms = atoi(optarg) * 1000; break;
		case 'c': only = optarg; break;
		case 'p': tcp_port = atoi(optarg); break;
		case 'S': serve_mode = 1; break;
		default: usage();
		}
	}
	if (optind < argc - 1 || (serve_mode && optind < argc) || timeout_ms <= 0)
		usage();
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (serve_mode)
		return run_server(tcp_port);
	const char *host = optind < argc ? argv[optind] : NULL;
	if (!side_open(&A) || (!host && !side_open(&B))) {
		printf("FAIL setup: %s\nverbs_check: 0 passed, 1 failed\n", why);
		return 1;
	}
	if (host && (peer_fd = tcp_connect(host, tcp_port)) < 0) {
		printf("FAIL setup: cannot reach a verbs_check -S server at %s:%d\nverbs_check: 0 passed, 1 failed\n",
		       host, tcp_port);
		return 1;
	}
	struct ibv_device_attr da;
	if (ibv_query_device(A.ctx, &da)) {
		printf("FAIL setup: ibv_query_device: %s\nverbs_check: 0 passed, 1 failed\n", strerror(errno));
		return 1;
	}
	vendor_id = da.vendor_id;
	char gid[INET6_ADDRSTRLEN] = "";
	inet_ntop(AF_INET6, A.gid.raw, gid, sizeof(gid));
	printf("verbs_check: device %s (vendor %#x, part %u, fw %s), port %d %s", ibv_get_device_name(A.ctx->device),
	       da.vendor_id, da.vendor_part_id, da.fw_ver, ib_port,
	       A.port.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
	if (A.port.link_layer == IBV_LINK_LAYER_ETHERNET)
		printf(", GID index %d = %s", gid_index, gid);
	else
		printf(", LID %u", A.port.lid);
	printf(", atomics %s; %s\n", da.atomic_cap == IBV_ATOMIC_NONE ? "none" : "yes",
	       host ? "responder in a server process" : "both endpoints in this process");
	for (size_t i = 0; i < sizeof(CHECKS) / sizeof(CHECKS[0]); i++) {
		if (!selected(CHECKS[i].name))
			continue;
		why[0] = 0;
		if (CHECKS[i].run()) {
			passed++;
			printf("PASS %s\n", CHECKS[i].name);
		} else {
			failed++;
			printf("FAIL %s: %s\n", CHECKS[i].name, why);
		}
	}
	if (host) {
		struct msg m = { .magic = MAGIC, .op = OP_QUIT };
		io_full(peer_fd, &m, sizeof(m), 1, 1000);
		close(peer_fd);
	} else {
		side_close(&B);
	}
	side_close(&A);
	printf("verbs_check: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
