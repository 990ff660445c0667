/*
 * The C side of `cargo xtask bench`: the same workloads as benches/verbs/main.rs, through
 * libibverbs (Debian's rdma-core 44 and whichever provider it picks for rxe0: its C rxe
 * provider, or the Rust drop-in when RDMAV_DRIVERS names it). A comparison tool only: the
 * uverbs library never links libibverbs. xtask compiles this at bench time:
 *
 *     gcc -O2 -g -o target/bench/verbs_bench_c benches/c/verbs_bench.c -libverbs -lpthread
 *
 * Keep it in step with benches/verbs/main.rs: same queue sizes, QP attributes, work requests,
 * round counts and output. Every result is one JSON line on stdout, e.g.
 *
 *     {"impl":"c","workload":"drain","param":16,"unit":"ns","samples":[...],"median":...,"min":...,"max":...}
 *
 * Options: --impl NAME (label, default "c"), --only W1,W2 (workloads: drain, inplace,
 * drain_replay, empty, post, pingpong, rate), --device NAME, --gid-index N, --cq-depth N (default 8192),
 * --batches B1,B2 (the drain's batch sizes, default all of drain_batches), --drain-wait-ms N
 * (the drain's first wait for the device, default 20; a round with fewer ready waits twice
 * as long next time, and its dump is named "<workload>_partial"),
 * --callgrind (few rounds, and callgrind client requests around each measured region:
 * collect on, work, collect off, then a dump named "<workload> <param> <ops>").
 * With UVERBS_REPLAY_TRACE set, the replayed drain also writes a line to stderr as each block
 * ends: "replay <impl> drain_replay <batch> <ns per completion>".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

#define N_DRAIN 4096
#define SEND_WR 4096
#define RECV_WR 1024
#define MR_LEN (1 << 20)
#define MSG 64
#define RECV_DEPTH 512
#define WINDOW 64
#define POST_K 1024
/* Completions asked for per poll call in the drain; the Rust harness's DRAIN_BATCHES. */
static int drain_batches[16] = {1, 2, 4, 8, 12, 16, 20, 24, 32, 64};
static size_t n_drain_batches = 10;
/* The replayed drain: batch sizes, rounds (one block per batch size each), and drains per
 * block. One sample is the median of a block. As benches/verbs/main.rs. */
static const int replay_batches[] = {1, 16, 64};
#define REPLAY_ROUNDS 20
#define REPLAY_BLOCK 100

static const char *impl_name = "c";
static const char *only;
static const char *dev_name;
static int gid_index = 1;
static int cq_depth = 8192;
static int callgrind;
/* The drain's first wait for the device to complete the writes (doubled after a round that
 * found fewer ready). */
static int drain_wait_ms = 20;

static void die(const char *what)
{
	fprintf(stderr, "verbs_bench_c: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void fail(const char *what)
{
	fprintf(stderr, "verbs_bench_c: %s\n", what);
	exit(1);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int wanted(const char *w)
{
	if (!only)
		return 1;
	size_t n = strlen(w);
	for (const char *p = only; *p;) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len == n && !strncmp(p, w, n))
			return 1;
		if (!e)
			break;
		p = e + 1;
	}
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The median of v[0..n) (sorted in place; n > 0). */
static double median(double *v, int n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One result line: the per-round values, and their median, min and max. */
static void report(const char *workload, int param, const char *unit, double *v, int n)
{
	printf("{\"impl\":\"%s\",\"workload\":\"%s\",\"param\":%d,\"unit\":\"%s\",\"samples\":[",
	       impl_name, workload, param, unit);
	for (int i = 0; i < n; i++)
		printf("%s%.3f", i ? "," : "", v[i]);
	double med = median(v, n);
	printf("],\"median\":%.3f,\"min\":%.3f,\"max\":%.3f}\n", med, v[0], v[n - 1]);
	fflush(stdout);
}

/* Callgrind: start counting. (No-ops when not under valgrind.) */
static void collect_on(void)
{
	if (callgrind)
		CALLGRIND_TOGGLE_COLLECT;
}

/* Callgrind: stop counting and dump what was counted since the last dump. */
static void collect_off(const char *workload, int param, long ops)
{
	if (!callgrind)
		return;
	CALLGRIND_TOGGLE_COLLECT;
	char name[96];
	snprintf(name, sizeof(name), "%s %d %ld", workload, param, ops);
	CALLGRIND_DUMP_STATS_AT(name);
}

struct side {
	struct ibv_cq *cq;
	struct ibv_cq_ex *cq_ex; /* set when the CQ was made with ibv_create_cq_ex */
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
};

struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	union ibv_gid gid;
	/* The port's LID: the address's destination on InfiniBand (0 on RoCE). */
	uint16_t lid;
	struct side a, b;
};

/* Returns -1 (errno set) when an extended CQ was asked for and the provider has none. */
static int make_side(struct pair *p, struct side *s, int ex_cq)
{
	if (ex_cq) {
		struct ibv_cq_init_attr_ex ca = {
			.cqe = cq_depth,
			.wc_flags = IBV_WC_STANDARD_FLAGS,
		};
		s->cq_ex = ibv_create_cq_ex(p->ctx, &ca);
		if (!s->cq_ex)
			return -1;
		s->cq = ibv_cq_ex_to_cq(s->cq_ex);
	} else {
		s->cq = ibv_create_cq(p->ctx, cq_depth, NULL, NULL, 0);
		if (!s->cq)
			die("ibv_create_cq");
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.cap = {
			.max_send_wr = SEND_WR,
			.max_recv_wr = RECV_WR,
			.max_send_sge = 1,
			.max_recv_sge = 1,
			.max_inline_data = 64,
		},
		.qp_type = IBV_QPT_RC,
	};
	s->qp = ibv_create_qp(p->pd, &ia);
	if (!s->qp)
		die("ibv_create_qp");
	if (posix_memalign((void **)&s->buf, 4096, MR_LEN))
		fail("posix_memalign");
	memset(s->buf, 0, MR_LEN);
	s->mr = ibv_reg_mr(p->pd, s->buf, MR_LEN,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!s->mr)
		die("ibv_reg_mr");
	return 0;
}

static void connect_qp(struct pair *p, struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = 1,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
	};
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify_qp INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = p->gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	a.ah_attr.dlid = p->lid;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify_qp RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a,
			  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify_qp RTS");
}

/* Returns -1 only when `ex_cq` is set and the provider has no extended CQs. */
static int pair_open(struct pair *p, int ex_cq)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0)
		fail("no RDMA device");
	struct ibv_device *dev = NULL;
	for (int i = 0; i < n; i++)
		if (!dev_name || !strcmp(ibv_get_device_name(list[i]), dev_name)) {
			dev = list[i];
			break;
		}
	if (!dev)
		fail("device not found");
	p->ctx = ibv_open_device(dev);
	if (!p->ctx)
		die("ibv_open_device");
	ibv_free_device_list(list);
	p->pd = ibv_alloc_pd(p->ctx);
	if (!p->pd)
		die("ibv_alloc_pd");
	if (ibv_query_gid(p->ctx, 1, gid_index, &p->gid))
		die("ibv_query_gid");
	struct ibv_port_attr port;
	if (ibv_query_port(p->ctx, 1, &port))
		die("ibv_query_port");
	p->lid = port.lid;
	if (make_side(p, &p->a, ex_cq)) {
		ibv_dealloc_pd(p->pd);
		ibv_close_device(p->ctx);
		return -1;
	}
	make_side(p, &p->b, 0);
	connect_qp(p, p->a.qp, p->b.qp->qp_num);
	connect_qp(p, p->b.qp, p->a.qp->qp_num);
	return 0;
}

static void pair_close(struct pair *p)
{
	struct side *sides[] = {&p->a, &p->b};
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_destroy_qp(s->qp) || ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq))
			die("teardown");
		free(s->buf);
	}
	if (ibv_dealloc_pd(p->pd) || ibv_close_device(p->ctx))
		die("teardown");
}

/* Polls `cq` until `n` completions arrived (30 s limit); all must have succeeded. */
static void wait_completions(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc[64];
	uint64_t deadline = now_ns() + 30000000000ull;
	while (n > 0) {
		int got = ibv_poll_cq(cq, n < 64 ? n : 64, wc);
		if (got < 0)
			fail("ibv_poll_cq failed");
		for (int i = 0; i < got; i++)
			if (wc[i].status != IBV_WC_SUCCESS) {
				fprintf(stderr, "verbs_bench_c: completion %llu: %s\n",
					(unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
				exit(1);
			}
		n -= got;
		if (now_ns() > deadline)
			fail("timed out waiting for completions");
	}
}

static void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

/* Posts N_DRAIN signaled 8-byte RDMA writes from A to B, in lists of 64. */
static void post_writes(struct pair *p)
{
	static struct ibv_sge sge;
	static struct ibv_send_wr wrs[64];
	sge = (struct ibv_sge){.addr = (uintptr_t)p->a.buf, .length = 8, .lkey = p->a.mr->lkey};
	for (int base = 0; base < N_DRAIN; base += 64) {
		for (int i = 0; i < 64; i++) {
			wrs[i] = (struct ibv_send_wr){
				.wr_id = base + i,
				.next = i + 1 < 64 ? &wrs[i + 1] : NULL,
				.sg_list = &sge,
				.num_sge = 1,
				.opcode = IBV_WR_RDMA_WRITE,
				.send_flags = IBV_SEND_SIGNALED,
				.wr.rdma = {.remote_addr = (uintptr_t)p->b.buf, .rkey = p->b.mr->rkey},
			};
		}
		struct ibv_send_wr *bad;
		if (ibv_post_send(p->a.qp, wrs, &bad))
			die("ibv_post_send");
	}
}

/* Calls ibv_poll_cq, `batch` at a time, until N_DRAIN completions came or none is ready;
 * returns how many came, and in *last how many the last call gave (as drain_with in
 * benches/verbs/main.rs). Inlined, so that the loop is the caller's own. */
static inline __attribute__((always_inline)) int drain_polls(struct ibv_cq *cq, int batch,
							       struct ibv_wc *wc, int *last)
{
	int got = 0;
	while (got < N_DRAIN) {
		int n = ibv_poll_cq(cq, batch, wc);
		if (n <= 0)
			break;
		got += n;
		*last = n;
	}
	return got;
}

/* 1. Draining a CQ holding N_DRAIN ready completions, `batch` at a time. */
static void bench_drain(struct pair *p, int batch, int inplace)
{
	int rounds = callgrind ? 3 : 11, wait_ms = drain_wait_ms, retries = 0;
	double v[32];
	struct ibv_wc wc[64];
	const char *name = inplace ? "inplace" : "drain";
	char partial[32];
	snprintf(partial, sizeof(partial), "%s_partial", name);
	for (int r = -1; r < rounds;) {
		post_writes(p);
		sleep_ms(wait_ms);
		int got = 0, bad = 0, last = 0;
		uint64_t acc = 0;
		if (r >= 0)
			collect_on();
		uint64_t t0 = now_ns();
		if (inplace) {
			struct ibv_poll_cq_attr attr = {0};
			struct ibv_cq_ex *cq = p->a.cq_ex;
			if (ibv_start_poll(cq, &attr) == 0) {
				int more = 1;
				for (;;) {
					acc += cq->wr_id;
					bad |= cq->status;
					if (++got == N_DRAIN)
						break;
					if (ibv_next_poll(cq)) {
						/* rxe's next_poll already released the entries and the
						 * lock when it finds the queue empty. */
						more = 0;
						break;
					}
				}
				if (more)
					ibv_end_poll(cq);
			}
		} else {
			got = drain_polls(p->a.cq, batch, wc, &last);
		}
		uint64_t t1 = now_ns();
		/* A round that found fewer ready also timed polls of an empty CQ: its dump is
		 * named apart, and the round is run again. */
		if (r >= 0)
			collect_off(got == N_DRAIN ? name : partial, batch, got);
		if (inplace && bad)
			fail("in-place drain: a completion failed");
		if (!inplace && got > 0 &&
		    (wc[last - 1].wr_id != (uint64_t)got - 1 || wc[last - 1].status != IBV_WC_SUCCESS))
			fail("drain: unexpected completion");
		if (got < N_DRAIN) {
			/* Not all were ready: finish untimed, wait longer next time. */
			wait_completions(p->a.cq, N_DRAIN - got);
			wait_ms *= 2;
			if (++retries > 8)
				fail("completions never became ready in time");
			continue;
		}
		if (inplace && acc != (uint64_t)N_DRAIN * (N_DRAIN - 1) / 2)
			fail("in-place drain: wrong wr_ids");
		if (r >= 0)
			v[r] = (double)(t1 - t0) / N_DRAIN;
		r++;
	}
	report(name, batch, "ns", v, rounds);
}

/*
 * 1b. The drain replayed: the device fills the CQ ring once, then the harness offers the same
 * completions again and again by advancing the ring's producer index itself, so that no
 * kernel or device work lies under a timed drain (benches/verbs/replay.rs, the Rust side,
 * says more). This knows rxe's ring layout (struct rxe_queue_buf, the kernel's
 * include/uapi/rdma/rdma_user_rxe.h): a measuring tool, whichever provider maps the ring.
 */
enum { RING_LOG2_SLOT = 0x0, RING_MASK = 0x4, RING_PRODUCER = 0x80, RING_CONSUMER = 0x100, RING_SLOTS = 0x180 };

struct ring {
	uint8_t *header;
	uint32_t mask, log2_slot, producer;
};

static _Atomic uint32_t *ring_word(uint8_t *header, int offset)
{
	return (_Atomic uint32_t *)(header + offset);
}

static uint8_t *ring_slot(const struct ring *r, uint32_t i)
{
	return r->header + RING_SLOTS + ((size_t)(i & r->mask) << r->log2_slot);
}

/* How many of this process's rxe mappings (shared, writable mappings of
 * /dev/infiniband/uverbs*: rxe maps only queue rings there) hold a ring with `ready`
 * produced and none consumed; the last one found goes to *r. */
static int full_rings(uint32_t ready, struct ring *r)
{
	FILE *f = fopen("/proc/self/maps", "r");
	if (!f)
		die("/proc/self/maps");
	char line[512];
	int found = 0;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[5];
		if (!strstr(line, "/dev/infiniband/uverbs") ||
		    sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) != 3 || strncmp(perms, "rw", 2) ||
		    hi - lo < RING_SLOTS)
			continue;
		uint8_t *h = (uint8_t *)lo;
		uint32_t log2_slot = atomic_load_explicit(ring_word(h, RING_LOG2_SLOT), memory_order_relaxed);
		uint32_t mask = atomic_load_explicit(ring_word(h, RING_MASK), memory_order_relaxed);
		uint64_t slots = (uint64_t)mask + 1;
		if (log2_slot < 5 || log2_slot > 12 || (slots & (slots - 1)) ||
		    (slots << log2_slot) + RING_SLOTS > hi - lo || mask < ready)
			continue;
		if (atomic_load_explicit(ring_word(h, RING_PRODUCER), memory_order_acquire) != ready ||
		    atomic_load_explicit(ring_word(h, RING_CONSUMER), memory_order_relaxed) != 0)
			continue;
		*r = (struct ring){.header = h, .mask = mask, .log2_slot = log2_slot, .producer = ready};
		found++;
	}
	fclose(f);
	return found;
}

/* Waits (up to 30 s) until exactly one rxe mapping is a CQ ring holding `ready` completions,
 * none consumed, and returns it. */
static struct ring ring_wait_full(uint32_t ready)
{
	struct ring r;
	uint64_t deadline = now_ns() + 30000000000ull;
	for (;;) {
		int n = full_rings(ready, &r);
		if (n == 1)
			return r;
		if (n > 1)
			fail("more than one rxe ring looks like the CQ under test");
		if (now_ns() > deadline)
			fail("no rxe CQ ring came to hold the completions");
		sleep_ms(10);
	}
}

/* Copies the first `ready` completions over every other slot, so that any run of `ready`
 * slots starting at a multiple of `ready` reads as the first one did. */
static void ring_fill(const struct ring *r, uint32_t ready)
{
	for (uint32_t i = ready; i <= r->mask; i++)
		memcpy(ring_slot(r, i), ring_slot(r, i % ready), (size_t)1 << r->log2_slot);
}

/* Makes `n` more completions ready, as the device would: one release store. */
static void ring_offer(struct ring *r, uint32_t n)
{
	r->producer = (r->producer + n) & r->mask;
	atomic_store_explicit(ring_word(r->header, RING_PRODUCER), r->producer, memory_order_release);
}

static void bench_replay(struct pair *p)
{
	enum { NB = sizeof(replay_batches) / sizeof(replay_batches[0]) };
	int rounds = callgrind ? 1 : REPLAY_ROUNDS, block = callgrind ? 2 : REPLAY_BLOCK;
	static double samples[NB][REPLAY_ROUNDS], times[REPLAY_BLOCK];
	struct ibv_wc wc[64];
	post_writes(p);
	struct ring ring = ring_wait_full(N_DRAIN);
	ring_fill(&ring, N_DRAIN);
	for (int r = 0; r < rounds; r++) {
		for (int k = 0; k < NB; k++) {
			int batch = replay_batches[k];
			collect_on();
			for (int d = 0; d < block; d++) {
				uint64_t t0 = now_ns();
				int last = 0;
				int got = drain_polls(p->a.cq, batch, wc, &last);
				uint64_t t1 = now_ns();
				if (got != N_DRAIN || wc[last - 1].wr_id != N_DRAIN - 1 ||
				    wc[last - 1].status != IBV_WC_SUCCESS)
					fail("replayed drain: short, or an unexpected completion");
				ring_offer(&ring, N_DRAIN);
				times[d] = (double)(t1 - t0) / N_DRAIN;
			}
			collect_off("drain_replay", batch, (long)block * N_DRAIN);
			samples[k][r] = median(times, block);
			if (getenv("UVERBS_REPLAY_TRACE"))
				fprintf(stderr, "replay %s drain_replay %d %.3f\n", impl_name, batch, samples[k][r]);
		}
	}
	for (int k = 0; k < NB; k++)
		report("drain_replay", replay_batches[k], "ns", samples[k], rounds);
}

/* 2. Polling an empty CQ. */
static void bench_empty(struct pair *p)
{
	int rounds = callgrind ? 1 : 11;
	long k = callgrind ? 4096 : 1 << 18;
	double v[16];
	struct ibv_wc wc[16];
	for (int r = -1; r < rounds; r++) {
		long sum = 0;
		if (r >= 0)
			collect_on();
		uint64_t t0 = now_ns();
		for (long i = 0; i < k; i++)
			sum += ibv_poll_cq(p->a.cq, 16, wc);
		uint64_t t1 = now_ns();
		if (r >= 0)
			collect_off("empty", 16, k);
		if (sum != 0)
			fail("empty CQ returned completions");
		if (r >= 0)
			v[r] = (double)(t1 - t0) / k;
	}
	report("empty", 16, "ns", v, rounds);
}

/* 3. post_send of POST_K unsignaled 8-byte RDMA writes (the last signaled), `list` per call. */
static void bench_post(struct pair *p, int list)
{
	int rounds = callgrind ? 2 : 11;
	int k = callgrind ? 256 : POST_K;
	double v[16];
	static struct ibv_send_wr wrs[POST_K];
	struct ibv_sge sge = {.addr = (uintptr_t)p->a.buf, .length = 8, .lkey = p->a.mr->lkey};
	for (int i = 0; i < k; i++) {
		wrs[i] = (struct ibv_send_wr){
			.wr_id = i,
			.next = (i + 1) % list ? &wrs[i + 1] : NULL,
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_RDMA_WRITE,
			.send_flags = i == k - 1 ? IBV_SEND_SIGNALED : 0,
			.wr.rdma = {.remote_addr = (uintptr_t)p->b.buf, .rkey = p->b.mr->rkey},
		};
	}
	for (int r = -1; r < rounds; r++) {
		struct ibv_send_wr *bad;
		if (r >= 0)
			collect_on();
		uint64_t t0 = now_ns();
		for (int i = 0; i < k; i += list)
			if (ibv_post_send(p->a.qp, &wrs[i], &bad))
				die("ibv_post_send");
		uint64_t t1 = now_ns();
		if (r >= 0)
			collect_off("post", list, k);
		wait_completions(p->a.cq, 1);
		if (r >= 0)
			v[r] = (double)(t1 - t0) / k;
	}
	report("post", list, "ns", v, rounds);
}

static void post_recv(struct side *s, uint64_t id)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)s->buf + MR_LEN / 2 + (id % RECV_DEPTH) * MSG,
		.length = MSG,
		.lkey = s->mr->lkey,
	};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = &sge, .num_sge = 1}, *bad;
	if (ibv_post_recv(s->qp, &wr, &bad))
		die("ibv_post_recv");
}

static void post_msg(struct side *s, uint64_t id)
{
	struct ibv_sge sge = {.addr = (uintptr_t)s->buf, .length = MSG, .lkey = s->mr->lkey};
	struct ibv_send_wr wr = {
		.wr_id = id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	},
			   *bad;
	if (ibv_post_send(s->qp, &wr, &bad))
		die("ibv_post_send");
}

/* Polls until one receive completed (reposting it); counts send completions in *sends. */
static void wait_recv(struct side *s, long *sends)
{
	struct ibv_wc wc[16];
	for (;;) {
		int n = ibv_poll_cq(s->cq, 16, wc);
		int recvd = 0;
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				fail("ping-pong: completion failed");
			if (wc[i].opcode == IBV_WC_RECV) {
				post_recv(s, wc[i].wr_id + RECV_DEPTH);
				recvd++;
			} else {
				++*sends;
			}
		}
		if (recvd > 1)
			fail("ping-pong: more than one message in flight");
		if (recvd)
			return;
	}
}

static void finish_sends(struct side *s, long sends, long want)
{
	if (want > sends)
		wait_completions(s->cq, (int)(want - sends));
}

struct job {
	struct pair *p;
	long iters;
	pthread_barrier_t *go;
};

/* The echo side of the ping-pong: B answers each message. */
static void *pong(void *arg)
{
	struct job *j = arg;
	long sends = 0;
	pthread_barrier_wait(j->go);
	for (long i = 0; i < j->iters; i++) {
		wait_recv(&j->p->b, &sends);
		post_msg(&j->p->b, i);
	}
	finish_sends(&j->p->b, sends, j->iters);
	return NULL;
}

/* 4a. Ping-pong between A and B (two threads): one-way latency = round trip / 2. */
static void bench_pingpong(struct pair *p)
{
	int rounds = 5;
	long iters = 2000;
	double v[8];
	for (int i = 0; i < RECV_DEPTH; i++) {
		post_recv(&p->a, i);
		post_recv(&p->b, i);
	}
	for (int r = -1; r < rounds; r++) {
		long n = r < 0 ? 200 : iters, sends = 0;
		pthread_barrier_t go;
		pthread_barrier_init(&go, NULL, 2);
		struct job j = {p, n, &go};
		pthread_t t;
		pthread_create(&t, NULL, pong, &j);
		pthread_barrier_wait(&go);
		uint64_t t0 = now_ns();
		for (long i = 0; i < n; i++) {
			post_msg(&p->a, i);
			wait_recv(&p->a, &sends);
		}
		uint64_t t1 = now_ns();
		finish_sends(&p->a, sends, n);
		pthread_join(t, NULL);
		pthread_barrier_destroy(&go);
		if (r >= 0)
			v[r] = (double)(t1 - t0) / n / 2;
	}
	report("pingpong", MSG, "ns", v, rounds);
}

/* The receiving side of the rate test: counts `iters` receives, reposting each. */
static void *sink(void *arg)
{
	struct job *j = arg;
	struct side *s = &j->p->b;
	struct ibv_wc wc[16];
	long got = 0;
	pthread_barrier_wait(j->go);
	while (got < j->iters) {
		int n = ibv_poll_cq(s->cq, 16, wc);
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].opcode != IBV_WC_RECV)
				fail("rate: unexpected completion at the receiver");
			post_recv(s, wc[i].wr_id + RECV_DEPTH);
		}
		got += n;
	}
	return NULL;
}

/* 4b. One-way message rate A -> B, WINDOW sends in flight: ns per message. */
static void bench_rate(struct pair *p)
{
	int rounds = 5;
	long total = 20000;
	double v[8];
	struct ibv_wc wc[16];
	for (int r = -1; r < rounds; r++) {
		long n = r < 0 ? 1000 : total, posted = 0, done = 0;
		pthread_barrier_t go;
		pthread_barrier_init(&go, NULL, 2);
		struct job j = {p, n, &go};
		pthread_t t;
		pthread_create(&t, NULL, sink, &j);
		pthread_barrier_wait(&go);
		uint64_t t0 = now_ns();
		while (done < n) {
			while (posted < n && posted - done < WINDOW)
				post_msg(&p->a, posted++);
			int got = ibv_poll_cq(p->a.cq, 16, wc);
			for (int i = 0; i < got; i++)
				if (wc[i].status != IBV_WC_SUCCESS)
					fail("rate: send failed");
			done += got;
		}
		uint64_t t1 = now_ns();
		pthread_join(t, NULL);
		pthread_barrier_destroy(&go);
		if (r >= 0)
			v[r] = (double)(t1 - t0) / n;
	}
	report("rate", MSG, "ns", v, rounds);
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--impl") && i + 1 < argc)
			impl_name = argv[++i];
		else if (!strcmp(argv[i], "--only") && i + 1 < argc)
			only = argv[++i];
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			dev_name = argv[++i];
		else if (!strcmp(argv[i], "--gid-index") && i + 1 < argc)
			gid_index = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--cq-depth") && i + 1 < argc)
			cq_depth = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--callgrind"))
			callgrind = 1;
		else if (!strcmp(argv[i], "--drain-wait-ms") && i + 1 < argc)
			drain_wait_ms = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--batches") && i + 1 < argc) {
			n_drain_batches = 0;
			for (char *b = strtok(argv[++i], ","); b && n_drain_batches < 16; b = strtok(NULL, ","))
				drain_batches[n_drain_batches++] = atoi(b);
			for (size_t k = 0; k < n_drain_batches; k++)
				if (drain_batches[k] < 1 || drain_batches[k] > 64)
					fail("--batches: each between 1 and 64");
		} else {
			fprintf(stderr, "usage: %s [--impl NAME] [--only W,...] [--device D] [--gid-index N] "
					"[--cq-depth N] [--batches B,...] [--drain-wait-ms N] [--callgrind]\n",
				argv[0]);
			return 2;
		}
	}
	if (wanted("drain") || wanted("empty") || wanted("post")) {
		struct pair p;
		pair_open(&p, 0);
		if (wanted("drain"))
			for (size_t i = 0; i < n_drain_batches; i++)
				bench_drain(&p, drain_batches[i], 0);
		if (wanted("empty"))
			bench_empty(&p);
		if (wanted("post")) {
			bench_post(&p, 1);
			bench_post(&p, 32);
		}
		pair_close(&p);
	}
	if (wanted("inplace")) {
		/* The extended CQ API (ibv_start_poll/next_poll/end_poll); skipped where the
		 * provider has no create_cq_ex. */
		struct pair p;
		if (pair_open(&p, 1) == 0) {
			bench_drain(&p, 0, 1);
			pair_close(&p);
		} else {
			fprintf(stderr, "verbs_bench_c: %s: no ibv_create_cq_ex (%s); skipping inplace\n",
				impl_name, strerror(errno));
		}
	}
	if (wanted("drain_replay")) {
		/* On fresh queues: the replay leaves the CQ's ring out of step with the device. */
		struct pair p;
		pair_open(&p, 0);
		bench_replay(&p);
		pair_close(&p);
	}
	if (wanted("pingpong") || wanted("rate")) {
		struct pair p;
		pair_open(&p, 0);
		if (wanted("pingpong"))
			bench_pingpong(&p);
		if (wanted("rate")) {
			/* Fresh receive queues: the ping-pong left its own receives posted. */
			pair_close(&p);
			pair_open(&p, 0);
			for (int i = 0; i < RECV_DEPTH; i++)
				post_recv(&p.b, i);
			bench_rate(&p);
		}
		pair_close(&p);
	}
	return 0;
}
