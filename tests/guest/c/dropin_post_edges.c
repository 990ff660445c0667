/* The edges of ibv_post_send, ibv_post_recv and ibv_post_srq_recv where rdma-core's rxe
 * answers before the ring: no list (EINVAL, bad_wr cleared), a receive in RESET or on a QP
 * whose receives go to an SRQ (EINVAL, bad_wr left null), bad_wr cleared on success, and
 * which check wins when a receive has too many SGEs for a full queue (the full queue:
 * ENOMEM); sends in RESET and INIT (written into the ring anyway, the doorbell refused: EINVAL
 * with bad_wr null, or naming a request refused after others went into the ring) and their
 * completions once the QP reaches RTS. */
#include "common.h"

#define UNSET ((void *)1)

static const char *named(void *bad, void *first)
{
	return bad == UNSET ? "untouched" : !bad ? "NULL" : bad == first ? "the first" : "another";
}

static void sent(const char *what, int rc, struct ibv_send_wr *bad, struct ibv_send_wr *first)
{
	printf("%s: %s, bad_wr %s\n", what, rc ? strerror(rc) : "ok", named(bad, first));
}

static void received(const char *what, int rc, struct ibv_recv_wr *bad, struct ibv_recv_wr *first)
{
	printf("%s: %s, bad_wr %s\n", what, rc ? strerror(rc) : "ok", named(bad, first));
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	uint64_t *mem = calloc(1, 8192);
	CHECK(pd && cq && mem, "PD, CQ, memory");
	struct ibv_mr *mr = ibv_reg_mr(pd, mem, 8192, ALL_ACCESS);
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(mr && srq, "MR, SRQ");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	ia.srq = srq;
	struct ibv_qp *on_srq = ibv_create_qp(pd, &ia);
	CHECK(a && b && on_srq, "QPs");
	name_qp(0, a);
	name_qp(1, b);

	struct ibv_sge s = { (uintptr_t)mem, 8, mr->lkey }, three[3] = { s, s, s };
	struct ibv_send_wr w = { .wr_id = 1, .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
		.sg_list = &s, .num_sge = 1 }, *bad = UNSET;
	w.wr.rdma.remote_addr = (uintptr_t)(mem + 512);
	w.wr.rdma.rkey = mr->rkey;
	struct ibv_recv_wr r = { .wr_id = 2, .sg_list = &s, .num_sge = 1 }, *rbad = UNSET;

	sent("post_send of no list", ibv_post_send(a, NULL, &bad), bad, &w);
	rbad = UNSET;
	received("post_recv of no list", ibv_post_recv(a, NULL, &rbad), rbad, &r);
	rbad = UNSET;
	received("post_recv in RESET", ibv_post_recv(a, &r, &rbad), rbad, &r);
	to_init(on_srq);
	rbad = UNSET;
	received("post_recv on a QP on an SRQ", ibv_post_recv(on_srq, &r, &rbad), rbad, &r);
	rbad = UNSET;
	received("post_srq_recv of no list", ibv_post_srq_recv(srq, NULL, &rbad), rbad, &r);

	bad = UNSET;
	sent("post_send in RESET", ibv_post_send(a, &w, &bad), bad, &w);
	to_init(a);
	to_init(b);
	w.wr_id = 3;
	bad = UNSET;
	sent("post_send in INIT", ibv_post_send(a, &w, &bad), bad, &w);
	/* A chain whose second request is refused: the first goes into the ring, the doorbell
	 * is refused, and bad_wr still names the refused one. */
	struct ibv_send_wr second = w, chain = w;
	second.wr_id = 6;
	second.sg_list = three;
	second.num_sge = 3;
	chain.wr_id = 5;
	chain.next = &second;
	bad = UNSET;
	sent("post_send in INIT of two, the second with 3 SGEs (max 1)", ibv_post_send(a, &chain, &bad), bad,
	     &chain);
	printf("  bad_wr is the second: %s\n", bad == &second ? "yes" : "no");
	connect_to(a, b->qp_num);
	connect_to(b, a->qp_num);
	w.wr_id = 4;
	bad = UNSET;
	sent("post_send in RTS", ibv_post_send(a, &w, &bad), bad, &w);
	wait_wc(cq, "first completion");
	wait_wc(cq, "second completion");
	wait_wc(cq, "third completion");
	wait_wc(cq, "fourth completion");
	rbad = UNSET;
	received("post_recv in RTS", ibv_post_recv(b, &r, &rbad), rbad, &r);

	r.sg_list = three;
	r.num_sge = 3;
	rbad = UNSET;
	received("post_recv with 3 SGEs (max 1)", ibv_post_recv(b, &r, &rbad), rbad, &r);
	rbad = UNSET;
	received("post_srq_recv with 3 SGEs (max 1)", ibv_post_srq_recv(srq, &r, &rbad), rbad, &r);
	r.sg_list = &s;
	r.num_sge = 1;
	int n = 0, rc;
	while (!(rc = ibv_post_recv(b, &r, &rbad)))
		CHECK(++n < 1000, "the receive queue never fills");
	received("post_recv until full", rc, rbad, &r);
	printf("  %d more posted first\n", n);
	r.sg_list = three;
	r.num_sge = 3;
	rbad = UNSET;
	received("post_recv with 3 SGEs on the full queue", ibv_post_recv(b, &r, &rbad), rbad, &r);
	r.sg_list = &s;
	r.num_sge = 1;
	for (n = 0; !(rc = ibv_post_srq_recv(srq, &r, &rbad));)
		CHECK(++n < 1000, "the SRQ never fills");
	received("post_srq_recv until full", rc, rbad, &r);
	printf("  %d posted first\n", n);
	r.sg_list = three;
	r.num_sge = 3;
	rbad = UNSET;
	received("post_srq_recv with 3 SGEs on the full SRQ", ibv_post_srq_recv(srq, &r, &rbad), rbad, &r);

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_destroy_qp(on_srq), "destroy QPs");
	CHECK(!ibv_destroy_srq(srq) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "teardown");
	printf("dropin_post_edges: OK\n");
	return 0;
}
