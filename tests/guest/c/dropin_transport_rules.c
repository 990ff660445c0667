/* ibv_post_send of requests rdma-core's rxe writes into the ring without checking their
 * transport (its validate_send_wr checks SGE count, inline length, atomic length and
 * alignment, and binds): reads and atomics on UC, inline reads and atomics, atomics over two
 * SGEs, local invalidate with an SGE or on UC, one-sided operations and invalidations on UD,
 * send with invalidate on UC; and those it refuses (atomics short, misaligned or without
 * SGEs; binds with immediate data or on UD). Each on a fresh pair: what the post returns,
 * whether bad_wr names it, and its completion (the kernel's verdict). */
#include "common.h"

static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static struct ibv_ah *ah;
static uint64_t *mem; /* [0], [1]: local buffers; [512]: the target */

static struct ibv_qp *create(enum ibv_qp_type type)
{
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = type,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 2, .max_recv_sge = 2, .max_inline_data = 64 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	CHECK(qp, "create");
	return qp;
}

/* A fresh pair of `type`, connected (or at RTS for UD). */
static void pair(enum ibv_qp_type type, struct ibv_qp **a, struct ibv_qp **b)
{
	*a = create(type);
	*b = create(type);
	name_qp(0, *a);
	name_qp(1, *b);
	if (type != IBV_QPT_UD) {
		connect_pair(*a, *b);
		return;
	}
	for (int i = 0; i < 2; i++) {
		struct ibv_qp *q = i ? *b : *a;
		struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11 };
		CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "UD INIT");
		m.qp_state = IBV_QPS_RTR;
		CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE), "UD RTR");
		m.qp_state = IBV_QPS_RTS;
		CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
	}
}

/* Posts `w` on `a` and prints what came of it; destroys the pair. */
static void post(const char *what, struct ibv_qp *a, struct ibv_qp *b, struct ibv_send_wr *w)
{
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(a, w, &bad);
	printf("%s: %s, bad_wr %s\n", what, rc ? strerror(rc) : "ok", bad == w ? "names it" : bad ? "another" : "NULL");
	if (!rc) {
		struct ibv_wc wc;
		long spins = 0;
		while (ibv_poll_cq(cq, 1, &wc) == 0)
			CHECK(++spins < SPINS, "%s: no completion", what);
		printf("  wr_id %llu %s opcode %d vendor_err %u qp %c\n", (unsigned long long)wc.wr_id,
		       ibv_wc_status_str(wc.status), wc.opcode, wc.vendor_err, qp_name(wc.qp_num));
	}
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");
	struct ibv_wc wc;
	while (ibv_poll_cq(cq, 1, &wc) > 0)
		continue;
}

static void one(const char *what, enum ibv_qp_type type, int opcode, int nsge, uint32_t len0, uint64_t raddr, int flags)
{
	struct ibv_qp *a, *b;
	pair(type, &a, &b);
	struct ibv_sge s[2] = { { (uintptr_t)mem, len0, mr->lkey }, { (uintptr_t)(mem + 1), 8, mr->lkey } };
	struct ibv_send_wr w = { .wr_id = 1, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED | flags, .sg_list = s,
		.num_sge = nsge };
	w.wr.atomic.remote_addr = raddr;
	w.wr.atomic.rkey = mr->rkey;
	w.wr.atomic.swap = 5;
	if (type == IBV_QPT_UD) {
		w.wr.ud.ah = ah;
		w.wr.ud.remote_qpn = b->qp_num;
		w.wr.ud.remote_qkey = 0x11;
	}
	post(what, a, b, &w);
}

/* A type 2 window bound by IBV_WR_BIND_MW with immediate data `imm`. */
static void bind_window(const char *what, enum ibv_qp_type type, uint32_t imm)
{
	struct ibv_qp *a, *b;
	pair(type, &a, &b);
	struct ibv_mw *mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw, "MW");
	struct ibv_send_wr w = { .wr_id = 2, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED, .imm_data = imm };
	if (type == IBV_QPT_UD)
		w.wr.ud.ah = ah;
	w.bind_mw.mw = mw;
	w.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
	w.bind_mw.bind_info = (struct ibv_mw_bind_info){ .mr = mr, .addr = (uintptr_t)mem, .length = 64,
		.mw_access_flags = IBV_ACCESS_REMOTE_WRITE };
	post(what, a, b, &w);
	CHECK(!ibv_dealloc_mw(mw), "dealloc MW");
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	mem = calloc(1, 8192);
	CHECK(pd && cq && mem, "PD, CQ, memory");
	mr = ibv_reg_mr(pd, mem, 8192, ALL_ACCESS);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 } };
	ah = ibv_create_ah(pd, &aa);
	CHECK(mr && ah, "MR, AH");
	uint64_t t = (uintptr_t)(mem + 512);
	one("UC read", IBV_QPT_UC, IBV_WR_RDMA_READ, 1, 8, t, 0);
	one("UC cmp_swp", IBV_QPT_UC, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 8, t, 0);
	one("UC fetch_add", IBV_QPT_UC, IBV_WR_ATOMIC_FETCH_AND_ADD, 1, 8, t, 0);
	one("RC read inline", IBV_QPT_RC, IBV_WR_RDMA_READ, 1, 8, t, IBV_SEND_INLINE);
	one("RC cmp_swp inline", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 8, t, IBV_SEND_INLINE);
	one("RC cmp_swp 2 sges 8+8", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 2, 8, t, 0);
	one("RC cmp_swp 2 sges 4+8", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 2, 4, t, 0);
	one("RC cmp_swp 0 sges", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 0, 8, t, 0);
	one("RC cmp_swp len 16", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 16, t, 0);
	one("RC cmp_swp len 4", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 4, t, 0);
	one("RC cmp_swp misaligned", IBV_QPT_RC, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 8, t + 4, 0);
	one("RC local_inv with sge", IBV_QPT_RC, IBV_WR_LOCAL_INV, 1, 8, t, 0);
	one("UC local_inv", IBV_QPT_UC, IBV_WR_LOCAL_INV, 0, 8, t, 0);
	one("UD write", IBV_QPT_UD, IBV_WR_RDMA_WRITE, 1, 8, t, 0);
	one("UD read", IBV_QPT_UD, IBV_WR_RDMA_READ, 1, 8, t, 0);
	one("UD send_inv", IBV_QPT_UD, IBV_WR_SEND_WITH_INV, 1, 8, t, 0);
	one("UD local_inv", IBV_QPT_UD, IBV_WR_LOCAL_INV, 0, 8, t, 0);
	one("UD cmp_swp", IBV_QPT_UD, IBV_WR_ATOMIC_CMP_AND_SWP, 1, 8, t, 0);
	one("UC send_inv", IBV_QPT_UC, IBV_WR_SEND_WITH_INV, 1, 8, t, 0);
	bind_window("RC bind with immediate data", IBV_QPT_RC, 1);
	bind_window("UD bind", IBV_QPT_UD, 0);
	CHECK(!ibv_destroy_ah(ah) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "teardown");
	printf("dropin_transport_rules: OK\n");
	return 0;
}
