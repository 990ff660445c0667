/* Memory windows: allocation, type 1 binds (ibv_bind_mw), type 2 binds (IBV_WR_BIND_MW and
 * ibv_wr_bind_mw), remote access through them, invalidation (local, IBV_WR_LOCAL_INV and
 * ibv_wr_local_inv; remote, send with invalidate), the statuses of writes through unbound
 * and invalidated windows, and deallocation. Every RC pair: A writes, B owns the memory. */
#include "common.h"

static struct ibv_pd *pd;
static struct ibv_cq *acq, *bcq, *rcq;
static struct ibv_mr *mr;
static char *buf;
static const uint64_t OPS = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_INV |
			    IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW;

static struct ibv_qp *qp(struct ibv_cq *scq)
{
	struct ibv_qp_init_attr_ex a = { .send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = pd, .send_ops_flags = OPS };
	struct ibv_qp *q = ibv_create_qp_ex(ctx, &a);
	CHECK(q, "ibv_create_qp_ex");
	return q;
}

/* A fresh connected pair (after an access error the old one is in the error state). */
static void pair(struct ibv_qp **a, struct ibv_qp **b)
{
	*a = qp(acq);
	*b = qp(bcq);
	name_qp(0, *a);
	name_qp(1, *b);
	connect_pair(*a, *b);
}

static void post1(struct ibv_qp *q, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	CHECK(!ibv_post_send(q, wr, &bad), "ibv_post_send opcode %d", wr->opcode);
}

/* A writes 32 bytes of buf into B's memory at `to` under `rkey` and prints the completion. */
static void write_via(struct ibv_qp *a, const char *what, uint64_t to, uint32_t rkey)
{
	struct ibv_sge sge = { (uintptr_t)buf, 32, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 77, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED, .wr.rdma = { to, rkey } };
	post1(a, &wr);
	wait_wc(acq, what);
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	acq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	bcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	buf = aligned_alloc(4096, 65536);
	CHECK(pd && acq && bcq && rcq && buf, "pd, CQs");
	memset(buf, 0, 65536);
	for (int i = 0; i < 64; i++)
		buf[i] = (char)(3 * i + 1);
	mr = ibv_reg_mr(pd, buf, 65536, ALL_ACCESS);
	CHECK(mr, "ibv_reg_mr");
	uint64_t win = (uintptr_t)buf + 8192;

	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw1 && mw2, "ibv_alloc_mw");
	printf("alloc_mw: types %d %d, pd set %d %d, rkeys differ from the MR's %d %d\n", mw1->type, mw2->type,
	       mw1->pd == pd, mw2->pd == pd, mw1->rkey != mr->rkey, mw2->rkey != mr->rkey);
	errno = 0;
	struct ibv_mw *bad_type = ibv_alloc_mw(pd, 3);
	printf("alloc_mw of type 3: %s, errno %s\n", bad_type ? "allocated" : "refused", strerror(errno));
	printf("dealloc_pd while MWs use it: %s\n", strerror(ibv_dealloc_pd(pd)));

	struct ibv_qp *a, *b;
	pair(&a, &b);

	/* Type 1: ibv_bind_mw, a write through the window, one outside it. */
	uint32_t before = mw1->rkey;
	struct ibv_mw_bind bind = { .wr_id = 1, .send_flags = IBV_SEND_SIGNALED,
		.bind_info = { .mr = mr, .addr = win, .length = 4096,
			       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ } };
	printf("ibv_bind_mw (type 1): %d\n", ibv_bind_mw(b, mw1, &bind));
	wait_wc(bcq, "type 1 bind");
	printf("type 1 rkey: index kept %d, key + 1 %d\n", (mw1->rkey >> 8) == (before >> 8),
	       (mw1->rkey & 0xff) == ((before + 1) & 0xff));
	write_via(a, "write through the type 1 window", win + 100, mw1->rkey);
	printf("landed: %d\n", !memcmp(buf + 8192 + 100, buf, 32));
	struct ibv_mw_bind zero = bind;
	zero.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
	printf("ibv_bind_mw with ZERO_BASED: %s\n", strerror(ibv_bind_mw(b, mw1, &zero)));
	printf("ibv_bind_mw of a type 2 window: %s\n", strerror(ibv_bind_mw(b, mw2, &bind)));
	write_via(a, "write beyond the type 1 window", win + 4090, mw1->rkey);

	/* Type 1 unbound (a bind of length 0): the new rkey grants nothing. */
	pair(&a, &b);
	struct ibv_mw_bind unbind = { .wr_id = 2, .send_flags = IBV_SEND_SIGNALED, .bind_info = { .mr = mr } };
	printf("ibv_bind_mw, length 0: %d\n", ibv_bind_mw(b, mw1, &unbind));
	wait_wc(bcq, "type 1 unbind");
	write_via(a, "write through the unbound type 1 window", win, mw1->rkey);

	/* Type 2 bound with IBV_WR_BIND_MW, then invalidated by the peer's send with invalidate. */
	pair(&a, &b);
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_send_wr bw = { .wr_id = 3, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED,
		.bind_mw = { .mw = mw2, .rkey = k2, .bind_info = { .mr = mr, .addr = win, .length = 8192,
			     .mw_access_flags = IBV_ACCESS_REMOTE_WRITE } } };
	post1(b, &bw);
	wait_wc(bcq, "type 2 bind (IBV_WR_BIND_MW)");
	mw2->rkey = k2;
	write_via(a, "write through the type 2 window", win + 200, mw2->rkey);
	printf("landed: %d\n", !memcmp(buf + 8192 + 200, buf, 32));
	post_recv(b, 50, buf + 32768, 256, mr->lkey);
	struct ibv_sge sge = { (uintptr_t)buf, 16, mr->lkey };
	struct ibv_send_wr inv = { .wr_id = 4, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_INV,
		.send_flags = IBV_SEND_SIGNALED, .invalidate_rkey = mw2->rkey };
	post1(a, &inv);
	wait_wc(acq, "send with invalidate");
	struct ibv_wc wc = wait_wc(rcq, "receive of the send with invalidate");
	printf("invalidated rkey is the window's: %d\n", wc.invalidated_rkey == mw2->rkey);
	write_via(a, "write through the remotely invalidated window", win + 200, mw2->rkey);

	/* Type 2 bound with ibv_wr_bind_mw, invalidated locally with ibv_wr_local_inv. */
	pair(&a, &b);
	struct ibv_qp_ex *bx = ibv_qp_to_qp_ex(b);
	k2 = ibv_inc_rkey(mw2->rkey);
	struct ibv_mw_bind_info info = { .mr = mr, .addr = win, .length = 1024,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };
	ibv_wr_start(bx);
	bx->wr_id = 5;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, mw2, k2, &info);
	printf("ibv_wr_complete (bind): %d\n", ibv_wr_complete(bx));
	wait_wc(bcq, "type 2 bind (ibv_wr_bind_mw)");
	mw2->rkey = k2;
	write_via(a, "write through the rebound type 2 window", win + 300, mw2->rkey);
	ibv_wr_start(bx);
	bx->wr_id = 6;
	ibv_wr_local_inv(bx, mw2->rkey);
	printf("ibv_wr_complete (local invalidate): %d\n", ibv_wr_complete(bx));
	wait_wc(bcq, "local invalidate (ibv_wr_local_inv)");
	write_via(a, "write through the locally invalidated window", win + 300, mw2->rkey);

	/* Fresh type 2 windows: a send with invalidate from ibv_wr_send_inv, and IBV_WR_LOCAL_INV.
	 * (Binding mw2 once more on a new pair and invalidating it with IBV_WR_LOCAL_INV oopsed
	 * Debian's 6.1 rdma_rxe, on the C provider too: a NULL rxe_put in rxe_invalidate_mw.) */
	pair(&a, &b);
	struct ibv_mw *mw3 = ibv_alloc_mw(pd, IBV_MW_TYPE_2), *mw4 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw3 && mw4, "ibv_alloc_mw");
	bx = ibv_qp_to_qp_ex(b);
	ibv_wr_start(bx);
	bx->wr_id = 7;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(bx, mw3, ibv_inc_rkey(mw3->rkey), &info);
	bx->wr_id = 8;
	ibv_wr_bind_mw(bx, mw4, ibv_inc_rkey(mw4->rkey), &info);
	printf("ibv_wr_complete (two binds): %d\n", ibv_wr_complete(bx));
	wait_wc(bcq, "bind of the third window");
	wait_wc(bcq, "bind of the fourth window");
	mw3->rkey = ibv_inc_rkey(mw3->rkey);
	mw4->rkey = ibv_inc_rkey(mw4->rkey);
	post_recv(b, 51, buf + 32768, 256, mr->lkey);
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a);
	ibv_wr_start(ax);
	ax->wr_id = 9;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_inv(ax, mw3->rkey);
	ibv_wr_set_sge(ax, mr->lkey, (uintptr_t)buf, 8);
	printf("ibv_wr_complete (send with invalidate): %d\n", ibv_wr_complete(ax));
	wait_wc(acq, "ibv_wr_send_inv");
	wc = wait_wc(rcq, "receive of ibv_wr_send_inv");
	printf("invalidated rkey is the third window's: %d\n", wc.invalidated_rkey == mw3->rkey);
	struct ibv_send_wr li = { .wr_id = 10, .opcode = IBV_WR_LOCAL_INV, .send_flags = IBV_SEND_SIGNALED,
		.invalidate_rkey = mw4->rkey };
	post1(b, &li);
	wait_wc(bcq, "local invalidate (IBV_WR_LOCAL_INV)");
	write_via(a, "write through the fourth window, invalidated", win, mw4->rkey);
	pair(&a, &b);
	write_via(a, "write through the third window, invalidated", win, mw3->rkey);

	printf("dealloc_mw: %d %d\n", ibv_dealloc_mw(mw3), ibv_dealloc_mw(mw4));
	printf("dealloc_mw: %d %d\n", ibv_dealloc_mw(mw1), ibv_dealloc_mw(mw2));
	printf("dropin_mw: OK\n");
	return 0;
}
