/* ibv_wr_complete where the provider leaves the judging to the kernel: a batch completed in
 * INIT (librxe writes it into the send queue and its doorbell fails, EINVAL; the requests stay
 * in the queue and run once the QP is in RTS and the next doorbell rings), and a batch with an
 * atomic of 4 bytes on RC (the ibv_wr_* builders check no length: the kernel judges it, and
 * the completion says how). */
#include "common.h"
#include <time.h>

static struct ibv_pd *pd;
static struct ibv_cq *cq, *rcq; /* every send queue, every receive queue */
static char *buf;
static struct ibv_mr *mr;

static struct ibv_qp *create(void)
{
	struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE |
				  IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD };
	struct ibv_qp *qp = ibv_create_qp_ex(ctx, &a);
	CHECK(qp, "ibv_create_qp_ex");
	return qp;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Prints every completion of `c` until nothing more has come for a second; their number. */
static int drain(struct ibv_cq *c, const char *what)
{
	int count = 0;
	struct ibv_wc wc;
	for (double last = now(); now() - last < 1;) {
		int n = ibv_poll_cq(c, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n) {
			print_wc(what, &wc);
			count++;
			last = now();
		}
	}
	printf("%s: %d completions\n", what, count);
	return count;
}

static void write_and_send(struct ibv_qp_ex *x, uint64_t first_id)
{
	x->wr_id = first_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)buf + 4096);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf, 8);
	x->wr_id = first_id + 1;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf + 8, 8);
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = aligned_alloc(4096, 65536);
	CHECK(pd && cq && rcq && buf, "pd, CQs");
	memset(buf, 0, 65536);
	memcpy(buf, "written!sent....", 16);
	mr = ibv_reg_mr(pd, buf, 65536, ALL_ACCESS & ~IBV_ACCESS_MW_BIND);
	CHECK(mr, "ibv_reg_mr");

	/* A batch in INIT. */
	struct ibv_qp *a = create(), *b = create();
	name_qp(0, a);
	name_qp(1, b);
	to_init(a);
	to_init(b);
	post_recv(b, 50, buf + 8192, 64, mr->lkey);
	post_recv(b, 51, buf + 8192 + 64, 64, mr->lkey);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	ibv_wr_start(x);
	write_and_send(x, 1);
	printf("ibv_wr_complete in INIT: %s\n", strerror(ibv_wr_complete(x)));
	printf("memory written in INIT: %d\n", !memcmp(buf + 4096, "written!", 8));
	connect_to(a, b->qp_num);
	connect_to(b, a->qp_num);
	drain(cq, "A after RTS, no doorbell yet");
	ibv_wr_start(x);
	write_and_send(x, 3);
	printf("ibv_wr_complete in RTS: %s\n", strerror(ibv_wr_complete(x)));
	drain(cq, "A after the next doorbell");
	drain(rcq, "B");
	printf("memory written: %d, sent: %d\n", !memcmp(buf + 4096, "written!", 8),
	       !memcmp(buf + 8192, "sent....", 8));
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");

	/* An atomic of 4 bytes on RC. */
	a = create();
	b = create();
	name_qp(0, a);
	name_qp(1, b);
	connect_pair(a, b);
	x = ibv_qp_to_qp_ex(a);
	uint64_t *target = (uint64_t *)(buf + 12288);
	*target = 5;
	ibv_wr_start(x);
	x->wr_id = 10;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_fetch_add(x, mr->rkey, (uintptr_t)target, 1);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)buf + 16384, 4);
	printf("ibv_wr_complete with a fetch-and-add of 4 bytes: %s\n", strerror(ibv_wr_complete(x)));
	drain(cq, "A after the atomic");
	printf("target after the atomic: %llu\n", (unsigned long long)*target);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(!ibv_query_qp(a, &qa, IBV_QP_STATE, &qi), "query");
	printf("QP A state after the atomic: %d\n", qa.qp_state);
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");
	printf("dropin_qp_ex_edges: OK\n");
	return 0;
}
