/* The extended QP (ibv_create_qp_ex with send_ops_flags, ibv_wr_start, the ibv_wr_* builders
 * and setters, ibv_wr_complete/ibv_wr_abort): which builders each transport offers, every
 * RC operation in one batch with every way to give it data, a UD send, an aborted batch, and
 * the errors ibv_wr_complete reports.
 *
 * rdma-core v44's rxe counts ibv_wr_set_sge_list's length as num_sge times the first entry's
 * (fixed in v64, commit 406cd2ad), so the lists here are of equal entries; it writes nothing
 * of ibv_wr_set_inline_data_list's buffers (see DIFFERS in common.h). */
#include "common.h"

static struct ibv_pd *pd;
static struct ibv_cq *cq, *rcq; /* every send queue, every receive queue */

static struct ibv_qp *create(enum ibv_qp_type type, uint64_t ops, int max_sge)
{
	struct ibv_qp_init_attr_ex a = { .send_cq = cq, .recv_cq = rcq, .qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = max_sge, .max_recv_sge = 1,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd, .send_ops_flags = ops };
	errno = 0;
	return ibv_create_qp_ex(ctx, &a);
}

static void refused(const char *what, enum ibv_qp_type type, uint64_t ops)
{
	struct ibv_qp *qp = create(type, ops, 1);
	printf("create_qp_ex %s: %s, errno %s\n", what, qp ? "created" : "refused", strerror(errno));
	if (qp)
		ibv_destroy_qp(qp);
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	char *buf = aligned_alloc(4096, 65536);
	CHECK(pd && cq && rcq && buf, "pd, CQs");
	memset(buf, 0, 65536);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 65536, ALL_ACCESS & ~IBV_ACCESS_MW_BIND);
	CHECK(mr, "ibv_reg_mr");

	refused("UD with RDMA_WRITE", IBV_QPT_UD, IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE);
	refused("UC with RDMA_READ", IBV_QPT_UC, IBV_QP_EX_WITH_RDMA_READ);
	refused("UC with ATOMIC_FETCH_AND_ADD", IBV_QPT_UC, IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD);
	refused("RC with TSO", IBV_QPT_RC, IBV_QP_EX_WITH_TSO);
	refused("UC with SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM", IBV_QPT_UC,
		IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
		IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM);

	uint64_t rc_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
			  IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ |
			  IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	struct ibv_qp *a = create(IBV_QPT_RC, rc_ops, 2), *b = create(IBV_QPT_RC, rc_ops, 2);
	CHECK(a && b, "RC QPs");
	name_qp(0, a);
	name_qp(1, b);
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(a);
	CHECK(x, "ibv_qp_to_qp_ex");
	printf("builders: send %d send_imm %d send_inv %d rdma_write %d rdma_write_imm %d rdma_read %d cmp_swp %d "
	       "fetch_add %d local_inv %d bind_mw %d; setters: ud_addr %d inline %d inline_list %d sge %d "
	       "sge_list %d; start %d complete %d abort %d\n", !!x->wr_send, !!x->wr_send_imm, !!x->wr_send_inv,
	       !!x->wr_rdma_write, !!x->wr_rdma_write_imm, !!x->wr_rdma_read, !!x->wr_atomic_cmp_swp,
	       !!x->wr_atomic_fetch_add, !!x->wr_local_inv, !!x->wr_bind_mw, !!x->wr_set_ud_addr,
	       !!x->wr_set_inline_data, !!x->wr_set_inline_data_list, !!x->wr_set_sge, !!x->wr_set_sge_list,
	       !!x->wr_start, !!x->wr_complete, !!x->wr_abort);
	struct ibv_qp_init_attr_ex plain = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = pd };
	struct ibv_qp *p = ibv_create_qp_ex(ctx, &plain);
	CHECK(p, "create_qp_ex with PD only");
	printf("ibv_qp_to_qp_ex of a QP made with PD only: %s\n", ibv_qp_to_qp_ex(p) ? "set" : "NULL");
	CHECK(!ibv_destroy_qp(p), "destroy");
	plain.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
	p = ibv_create_qp_ex(ctx, &plain);
	CHECK(p, "create_qp_ex with PD and CREATE_FLAGS 0");
	struct ibv_qp_ex *px = ibv_qp_to_qp_ex(p);
	printf("PD | CREATE_FLAGS: qp_ex %s, wr_start %d\n", px ? "set" : "NULL", px && px->wr_start);
	CHECK(!ibv_destroy_qp(p), "destroy");
	plain.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	plain.send_ops_flags = 0;
	p = ibv_create_qp_ex(ctx, &plain);
	CHECK(p, "create_qp_ex with send_ops_flags 0");
	px = ibv_qp_to_qp_ex(p);
	printf("send_ops_flags 0: qp_ex %s, wr_start %d, wr_set_sge %d, wr_send %d\n", px ? "set" : "NULL",
	       px && px->wr_start, px && px->wr_set_sge, px && px->wr_send);
	CHECK(!ibv_destroy_qp(p), "destroy");
	connect_pair(a, b);

	/* Every RC operation in one batch, with every way to give it data. */
	char *src = buf, *dst = buf + 4096, *rd = buf + 8192, *atom = buf + 12288;
	for (int i = 0; i < 256; i++)
		src[i] = (char)(i * 7 + 1);
	*(uint64_t *)atom = 100;
	post_recv(b, 100, dst, 1024, mr->lkey);
	post_recv(b, 101, dst + 1024, 1024, mr->lkey);
	post_recv(b, 102, dst + 2048, 1024, mr->lkey);
	struct ibv_sge two[2] = { { (uintptr_t)src, 16, mr->lkey }, { (uintptr_t)src + 64, 16, mr->lkey } };
	ibv_wr_start(x);
	x->wr_id = 1;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 40);
	x->wr_id = 2;
	ibv_wr_send_imm(x, htonl(0xabcd0002));
	ibv_wr_set_sge_list(x, 2, two);
	x->wr_id = 3;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst + 3072);
	ibv_wr_set_inline_data(x, src + 100, 24);
	x->wr_id = 4;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write_imm(x, mr->rkey, (uintptr_t)dst + 3200, htonl(0xabcd0004));
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src + 8, 8);
	x->wr_id = 5;
	ibv_wr_rdma_read(x, mr->rkey, (uintptr_t)src);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)rd, 64);
	x->wr_id = 6;
	ibv_wr_atomic_cmp_swp(x, mr->rkey, (uintptr_t)atom, 100, 200);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)rd + 64, 8);
	x->wr_id = 7;
	ibv_wr_atomic_fetch_add(x, mr->rkey, (uintptr_t)atom, 5);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)rd + 72, 8);
	x->wr_id = 8;
	x->wr_flags = 0; /* unsignaled: no completion */
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst + 3300);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 4);
	printf("ibv_wr_complete: %d\n", ibv_wr_complete(x));
	for (int i = 0; i < 7; i++)
		wait_wc(cq, "send completion");
	for (int i = 0; i < 3; i++)
		wait_wc(rcq, "receive completion");
	printf("memory: send %d send_imm %d inline write %d write_imm %d read %d cmp_swp old %llu fetch_add old %llu "
	       "target %llu unsignaled write %d\n", !memcmp(dst, src, 40),
	       !memcmp(dst + 1024, src, 16) && !memcmp(dst + 1040, src + 64, 16), !memcmp(dst + 3072, src + 100, 24),
	       !memcmp(dst + 3200, src + 8, 8), !memcmp(rd, src, 64), (unsigned long long)*(uint64_t *)(rd + 64),
	       (unsigned long long)*(uint64_t *)(rd + 72), (unsigned long long)*(uint64_t *)atom,
	       !memcmp(dst + 3300, src, 4));

	/* Inline data from a list of buffers. */
	struct ibv_data_buf bufs[2] = { { src + 10, 12 }, { src + 30, 20 } };
	ibv_wr_start(x);
	x->wr_id = 9;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst + 3400);
	ibv_wr_set_inline_data_list(x, 2, bufs);
	printf("ibv_wr_complete (inline list): %d\n", ibv_wr_complete(x));
	/* v44 writes none of it (fixed in v64, commit 1e8ed0af). */
	struct ibv_wc wc = wait_wc(cq, DIFFERS "inline list write");
	int landed = !memcmp(dst + 3400, src + 10, 12) && !memcmp(dst + 3412, src + 30, 20);
	printf(DIFFERS "inline list landed: %d\n", landed);
	if (strict())
		CHECK(landed && wc.byte_len == 32, "ibv_wr_set_inline_data_list: byte_len %u, landed %d", wc.byte_len,
		      landed);

	/* An aborted batch posts nothing: the next completion is the next batch's. */
	ibv_wr_start(x);
	x->wr_id = 20;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 8);
	ibv_wr_abort(x);
	ibv_wr_start(x);
	x->wr_id = 21;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 8);
	printf("ibv_wr_complete after an abort: %d\n", ibv_wr_complete(x));
	wait_wc(cq, "after the abort");

	/* Errors: too many SGEs, too much inline data (nothing of the batch is posted). */
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	CHECK(!ibv_query_qp(a, &qattr, IBV_QP_CAP, &qinit), "query");
	int n = qattr.cap.max_send_sge + 1;
	struct ibv_sge *many = calloc(n, sizeof(*many));
	CHECK(many, "calloc");
	for (int i = 0; i < n; i++)
		many[i] = two[0];
	ibv_wr_start(x);
	x->wr_id = 30;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge_list(x, n, many);
	printf("ibv_wr_complete with max_send_sge + 1 SGEs: %s\n", strerror(ibv_wr_complete(x)));
	ibv_wr_start(x);
	x->wr_id = 31;
	x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_inline_data(x, src, qattr.cap.max_inline_data + 1);
	printf("ibv_wr_complete with max_inline_data + 1 bytes inline: %s\n", strerror(ibv_wr_complete(x)));
	ibv_wr_start(x);
	x->wr_id = 32;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)dst);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)src, 8);
	printf("ibv_wr_complete after the errors: %d\n", ibv_wr_complete(x));
	wait_wc(cq, "after the errors");

	/* UD: a send and a send with immediate, addressed with ibv_wr_set_ud_addr. */
	uint64_t ud_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
	struct ibv_qp *u = create(IBV_QPT_UD, ud_ops, 1), *v = create(IBV_QPT_UD, ud_ops, 1);
	CHECK(u && v, "UD QPs");
	name_qp(2, u);
	name_qp(3, v);
	for (int i = 0; i < 2; i++) {
		struct ibv_qp *q = i ? v : u;
		struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
		CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "UD INIT");
		m.qp_state = IBV_QPS_RTR;
		CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE), "UD RTR");
		m.qp_state = IBV_QPS_RTS;
		CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
	}
	struct ibv_ah_attr ah_attr = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
	CHECK(ah, "ibv_create_ah");
	post_recv(v, 300, dst + 8192, 1024, mr->lkey);
	post_recv(v, 301, dst + 9216, 1024, mr->lkey);
	struct ibv_qp_ex *ux = ibv_qp_to_qp_ex(u);
	ibv_wr_start(ux);
	ux->wr_id = 40;
	ux->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ux);
	ibv_wr_set_ud_addr(ux, ah, v->qp_num, 0x11111111);
	ibv_wr_set_sge(ux, mr->lkey, (uintptr_t)src, 100);
	ux->wr_id = 41;
	ibv_wr_send_imm(ux, htonl(0x41));
	ibv_wr_set_ud_addr(ux, ah, v->qp_num, 0x11111111);
	ibv_wr_set_sge(ux, mr->lkey, (uintptr_t)src + 100, 50);
	printf("UD ibv_wr_complete: %d\n", ibv_wr_complete(ux));
	for (int i = 0; i < 2; i++)
		wait_wc(cq, "UD send");
	for (int i = 0; i < 2; i++)
		wait_wc(rcq, "UD receive");
	printf("UD payloads after the GRH: %d %d\n", !memcmp(dst + 8192 + 40, src, 100),
	       !memcmp(dst + 9216 + 40, src + 100, 50));

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b) && !ibv_destroy_qp(u) && !ibv_destroy_qp(v), "destroy QPs");
	CHECK(!ibv_destroy_ah(ah) && !ibv_destroy_cq(cq) && !ibv_destroy_cq(rcq), "destroy AH, CQs");
	CHECK(!ibv_dereg_mr(mr) && !ibv_dealloc_pd(pd), "dereg, dealloc");
	CHECK(!ibv_close_device(ctx), "close");
	printf("dropin_qp_ex: OK\n");
	return 0;
}
