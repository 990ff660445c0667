/* ibv_create_srq_ex: the cases libibverbs hands the provider (a basic SRQ named with a CQ,
 * other types, no PD), and the SRQ in use. */
#include "common.h"

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0), *rcq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	char *buf = aligned_alloc(4096, 65536);
	CHECK(pd && cq && rcq && buf, "pd, CQs");
	memset(buf, 0, 65536);
	for (int i = 0; i < 64; i++)
		buf[i] = (char)(i + 9);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");

	int ctxmark;
	struct ibv_srq_init_attr_ex sa = { .srq_context = &ctxmark, .attr = { .max_wr = 16, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_BASIC, .pd = pd, .cq = rcq };
	struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
	CHECK(srq, "ibv_create_srq_ex (basic, with a CQ)");
	/* rdma-core v44 sets neither for create_srq_ex (pd since v58, commit bf1e4271; srq_context
	 * not even upstream), although the man page has both. */
	printf(DIFFERS "basic SRQ with a CQ: srq_context kept %d, pd %d\n", srq->srq_context == &ctxmark,
	       srq->pd == pd);
	if (strict())
		CHECK(srq->srq_context == &ctxmark && srq->pd == pd, "srq_context and pd of an extended SRQ");

	struct ibv_srq_init_attr_ex tm = sa;
	tm.srq_type = IBV_SRQT_TM;
	tm.comp_mask |= IBV_SRQ_INIT_ATTR_TM;
	tm.tm_cap.max_num_tags = 4;
	tm.tm_cap.max_ops = 4;
	errno = 0;
	struct ibv_srq *t = ibv_create_srq_ex(ctx, &tm);
	printf("tag matching SRQ: %s, errno %s\n", t ? "created" : "refused", strerror(errno));
	struct ibv_srq_init_attr_ex nopd = sa;
	nopd.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_CQ;
	struct ibv_srq *n = ibv_create_srq_ex(ctx, &nopd);
	printf("SRQ without a PD: %s\n", n ? "created" : "refused");

	struct ibv_qp_init_attr qa = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &qa);
	qa.recv_cq = rcq;
	qa.srq = srq;
	struct ibv_qp *b = ibv_create_qp(pd, &qa);
	CHECK(a && b, "QPs");
	name_qp(0, a);
	name_qp(1, b);
	connect_pair(a, b);
	for (int i = 0; i < 2; i++) {
		struct ibv_sge sge = { (uintptr_t)buf + 4096 * (i + 1), 1024, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = 40 + i, .sg_list = &sge, .num_sge = 1 }, *bad;
		CHECK(!ibv_post_srq_recv(srq, &wr, &bad), "ibv_post_srq_recv");
	}
	struct ibv_sge sge = { (uintptr_t)buf, 48, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED }, *bad;
	CHECK(!ibv_post_send(a, &wr, &bad), "ibv_post_send");
	wait_wc(cq, "send");
	wait_wc(rcq, "receive from the SRQ");
	printf("landed: %d\n", !memcmp(buf + 4096, buf, 48));
	struct ibv_srq_attr q;
	CHECK(!ibv_query_srq(srq, &q), "ibv_query_srq");
	printf("query: max_sge %u srq_limit %u\n", q.max_sge, q.srq_limit);
	printf("destroy the SRQ while a QP uses it: %s\n", strerror(ibv_destroy_srq(srq)));
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy QPs");
	printf("destroy the SRQ: %d\n", ibv_destroy_srq(srq));
	printf("dropin_srq_ex: OK\n");
	return 0;
}
