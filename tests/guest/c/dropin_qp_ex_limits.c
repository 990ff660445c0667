/* The extended QP at its limits: ibv_wr_atomic_write (which transports offer it, what a batch
 * with one does: Linux 6.1's rdma_rxe has no atomic write, so the request completes in
 * error and writes nothing), and a batch that runs past the send queue's free slots (the
 * builder that finds no free slot makes ibv_wr_complete return ENOSPC, and nothing of the
 * batch is posted), with the queue held full by sends that wait on a receiver without
 * receives (RNR retried forever). */
#include "common.h"
#include <time.h>

static struct ibv_pd *pd;
static struct ibv_cq *cq, *rcq; /* every send queue, every receive queue */
static char *buf;
static struct ibv_mr *mr;

static struct ibv_qp *create(enum ibv_qp_type type, uint64_t ops, uint32_t depth)
{
	struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = rcq, .qp_type = type,
		.cap = { .max_send_wr = depth, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd, .send_ops_flags = ops };
	errno = 0;
	return ibv_create_qp_ex(ctx, &a);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Polls `cq` until nothing more has come for a second; prints how many completions came, by
 * status. */
static int drain(struct ibv_cq *c, const char *what)
{
	int ok = 0, bad = 0;
	struct ibv_wc wc;
	for (double last = now(); now() - last < 1;) {
		int n = ibv_poll_cq(c, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n) {
			wc.status == IBV_WC_SUCCESS ? ok++ : bad++;
			last = now();
		}
	}
	printf("%s: %d successful, %d failed\n", what, ok, bad);
	return ok + bad;
}

static int send_batch(struct ibv_qp_ex *x, int n, uint64_t first_id)
{
	ibv_wr_start(x);
	for (int i = 0; i < n; i++) {
		x->wr_id = first_id + i;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(x);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 8);
	}
	return ibv_wr_complete(x);
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	buf = aligned_alloc(4096, 65536);
	CHECK(pd && cq && rcq && buf, "pd, CQs");
	memset(buf, 0, 65536);
	mr = ibv_reg_mr(pd, buf, 65536, ALL_ACCESS & ~IBV_ACCESS_MW_BIND);
	CHECK(mr, "ibv_reg_mr");

	/* Atomic write: RC only. */
	struct ibv_qp *qp;
	enum ibv_qp_type types[] = { IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD };
	const char *names[] = { "RC", "UC", "UD" };
	for (int i = 0; i < 3; i++) {
		qp = create(types[i], IBV_QP_EX_WITH_ATOMIC_WRITE, 8);
		printf("create_qp_ex %s with ATOMIC_WRITE: %s, errno %s\n", names[i], qp ? "created" : "refused",
		       strerror(errno));
		if (qp) {
			printf("  wr_atomic_write %s\n", ibv_qp_to_qp_ex(qp)->wr_atomic_write ? "set" : "NULL");
			CHECK(!ibv_destroy_qp(qp), "destroy");
		}
	}
	uint64_t ops = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_SEND;
	struct ibv_qp *a = create(IBV_QPT_RC, ops, 8), *b = create(IBV_QPT_RC, ops, 8);
	CHECK(a && b, "RC QPs");
	name_qp(0, a);
	name_qp(1, b);
	connect_pair(a, b);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	uint64_t *target = (uint64_t *)(buf + 8192);
	*target = 0x1111111111111111ull;
	const char value[8] = "ATOMICWR";
	ibv_wr_start(x);
	x->wr_id = 2;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(x, mr->rkey, (uintptr_t)target, value);
	printf("ibv_wr_complete with an atomic write: %d\n", ibv_wr_complete(x));
	wait_wc(cq, "atomic write");
	printf("target after the atomic write: %#llx (the value: %d)\n", (unsigned long long)*target,
	       !memcmp(target, value, 8));
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(!ibv_query_qp(a, &qa, IBV_QP_STATE, &qi), "query");
	printf("QP A state after the atomic write: %d\n", qa.qp_state);
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");

	/* The full send queue. B posts no receive and A retries RNR forever, so A's sends stay in
	 * its send queue until B posts receives. */
	a = create(IBV_QPT_RC, IBV_QP_EX_WITH_SEND, 8);
	b = create(IBV_QPT_RC, IBV_QP_EX_WITH_SEND, 8);
	CHECK(a && b, "RC QPs");
	name_qp(0, a);
	name_qp(1, b);
	CHECK(!ibv_query_qp(a, &qa, IBV_QP_CAP, &qi), "query");
	int depth = (int)qi.cap.max_send_wr;
	printf("send queue depth granted for 8: %d\n", depth);
	connect_pair(a, b);
	x = ibv_qp_to_qp_ex(a);
	printf("a batch of %d sends: %d\n", 3, send_batch(x, 3, 100));
	printf("a batch of %d sends (one more than the free slots): %s\n", depth - 2,
	       strerror(send_batch(x, depth - 2, 200)));
	printf("a batch of one more than the depth: %s\n", strerror(send_batch(x, depth + 1, 300)));
	printf("a batch of %d sends (the free slots): %d\n", depth - 3, send_batch(x, depth - 3, 400));
	printf("one more send: %s\n", strerror(send_batch(x, 1, 500)));
	ibv_wr_start(x);
	ibv_wr_abort(x);
	for (int i = 0; i < depth; i++)
		post_recv(b, 1000 + i, buf + 16384 + 64 * i, 64, mr->lkey);
	printf("sends completed once B has receives: %d\n", drain(cq, "A's send queue"));
	printf("receives completed: %d\n", drain(rcq, "B's receive queue"));
	printf("a batch of %d sends on the emptied queue: %d\n", depth, send_batch(x, depth, 600));
	for (int i = 0; i < depth; i++)
		post_recv(b, 2000 + i, buf + 16384 + 64 * i, 64, mr->lkey);
	drain(cq, "A's send queue");
	drain(rcq, "B's receive queue");
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");
	printf("dropin_qp_ex_limits: OK\n");
	return 0;
}
