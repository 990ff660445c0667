/* ibv_post_send with opcodes the uverbs core does not model: IBV_WR_TSO, IBV_WR_DRIVER1,
 * IBV_WR_ATOMIC_WRITE (through ibv_post_send, which has no place for its value) and numbers
 * rdma-core v44's verbs.h lacks (12 to 14). rdma-core's rxe writes any opcode into the ring and
 * leaves it to the kernel; so must the drop-in. Per transport: what the post returns and which
 * request bad_wr names, every completion (wr_id, status, opcode, vendor_err, QP), the QP's
 * state after and the remote memory. Then the checks rdma-core's rxe makes of such a request
 * before the ring: too many SGEs and too much inline data (EINVAL, bad_wr at it, the requests
 * before it posted). */
#include "common.h"

static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_mr *mr;
static uint64_t *mem; /* [0] source, [512] write target; 8 KiB */
static uint32_t max_inline, max_sge; /* as granted */

static struct ibv_qp *create(enum ibv_qp_type type)
{
	struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq, .qp_type = type,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1,
			 .max_inline_data = 64 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	CHECK(qp, "create QP type %d", type);
	max_inline = a.cap.max_inline_data;
	max_sge = a.cap.max_send_sge;
	return qp;
}

static void ud_to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11 };
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "UD INIT");
	m.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE), "UD RTR");
	m.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
}

static struct ibv_send_wr request(uint64_t wr_id, int opcode, struct ibv_sge *sge)
{
	*sge = (struct ibv_sge){ .addr = (uintptr_t)mem, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr w = { .wr_id = wr_id, .opcode = opcode, .send_flags = IBV_SEND_SIGNALED,
		.sg_list = sge, .num_sge = 1, .imm_data = htonl(0x1234) };
	w.wr.rdma.remote_addr = (uintptr_t)(mem + 512);
	w.wr.rdma.rkey = mr->rkey;
	return w;
}

static const char *which(struct ibv_send_wr *bad, struct ibv_send_wr *list)
{
	static char name[16];
	if (!bad)
		return "none";
	for (int i = 0; list; list = list->next, i++)
		if (list == bad) {
			snprintf(name, sizeof(name), "#%d", i);
			return name;
		}
	return "another";
}

static void post(const char *what, struct ibv_qp *qp, struct ibv_send_wr *list, int completions)
{
	struct ibv_send_wr *bad = NULL;
	int rc = ibv_post_send(qp, list, &bad);
	printf("%s: post %s, bad_wr %s\n", what, rc ? strerror(rc) : "ok", which(bad, list));
	for (int i = 0; i < completions; i++) {
		struct ibv_wc wc;
		for (long spins = 0;; spins++) {
			int n = ibv_poll_cq(cq, 1, &wc);
			CHECK(n >= 0, "ibv_poll_cq");
			if (n)
				break;
			CHECK(spins < SPINS, "%s: no completion %d", what, i);
		}
		printf("  wr_id %llu %s opcode %d vendor_err %u qp %c\n", (unsigned long long)wc.wr_id,
		       ibv_wc_status_str(wc.status), wc.opcode, wc.vendor_err, qp_name(wc.qp_num));
	}
	struct ibv_wc extra;
	int more = 0;
	for (int i = 0; i < 100000; i++)
		more += ibv_poll_cq(cq, 1, &extra);
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr init;
	CHECK(!ibv_query_qp(qp, &a, IBV_QP_STATE, &init), "query");
	printf("  then: %d more completions, QP state %d, target %#llx\n", more, a.qp_state,
	       (unsigned long long)mem[512]);
}

/* On a connected pair of `type`: a write, the opcode, a write; the opcode alone. */
static void connected(enum ibv_qp_type type, int opcode)
{
	struct ibv_qp *a = create(type), *b = create(type);
	name_qp(0, a);
	name_qp(1, b);
	connect_pair(a, b);
	mem[512] = 0;
	mem[0] = 0x0102030405060708ull;
	struct ibv_sge s[3];
	struct ibv_send_wr w[3] = { request(1, IBV_WR_RDMA_WRITE, &s[0]), request(2, opcode, &s[1]),
				    request(3, IBV_WR_RDMA_WRITE, &s[2]) };
	w[0].next = &w[1];
	w[1].next = &w[2];
	char what[64];
	snprintf(what, sizeof(what), "%s write, opcode %d, write", type == IBV_QPT_RC ? "RC" : "UC", opcode);
	post(what, a, w, 3);
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");
}

static void datagram(struct ibv_ah *ah, int opcode)
{
	struct ibv_qp *a = create(IBV_QPT_UD), *b = create(IBV_QPT_UD);
	name_qp(0, a);
	name_qp(1, b);
	ud_to_rts(a);
	ud_to_rts(b);
	struct ibv_sge s[2];
	struct ibv_send_wr w[2] = { request(1, opcode, &s[0]), request(2, IBV_WR_SEND, &s[1]) };
	for (int i = 0; i < 2; i++) {
		w[i].wr.ud.ah = ah;
		w[i].wr.ud.remote_qpn = b->qp_num;
		w[i].wr.ud.remote_qkey = 0x11;
	}
	w[0].next = &w[1];
	char what[64];
	snprintf(what, sizeof(what), "UD opcode %d, send", opcode);
	post(what, a, w, 2);
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");
}

/* What rdma-core's rxe checks of an opcode it does not know before the ring. */
static void refused(int opcode)
{
	struct ibv_qp *a = create(IBV_QPT_RC), *b = create(IBV_QPT_RC);
	name_qp(0, a);
	name_qp(1, b);
	connect_pair(a, b);
	mem[512] = 0;
	struct ibv_sge s[3], many[max_sge + 1];
	struct ibv_send_wr w[3] = { request(1, IBV_WR_RDMA_WRITE, &s[0]), request(2, opcode, &s[1]),
				    request(3, IBV_WR_RDMA_WRITE, &s[2]) };
	for (uint32_t i = 0; i <= max_sge; i++)
		many[i] = s[1];
	w[1].sg_list = many;
	w[1].num_sge = max_sge + 1;
	w[0].next = &w[1];
	w[1].next = &w[2];
	char what[80];
	snprintf(what, sizeof(what), "RC write, opcode %d with max_send_sge + 1 SGEs, write", opcode);
	post(what, a, w, 1);

	struct ibv_sge big = { .addr = (uintptr_t)mem, .length = max_inline + 1, .lkey = mr->lkey };
	struct ibv_send_wr in = request(4, opcode, &s[0]);
	in.sg_list = &big;
	in.send_flags |= IBV_SEND_INLINE;
	snprintf(what, sizeof(what), "RC opcode %d with max_inline_data + 1 bytes inline", opcode);
	post(what, a, &in, 0);
	big.length = max_inline;
	snprintf(what, sizeof(what), "RC opcode %d with max_inline_data bytes inline", opcode);
	post(what, a, &in, 1);
	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy");
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	mem = calloc(1, 8192);
	CHECK(pd && cq && mem, "PD, CQ, memory");
	mr = ibv_reg_mr(pd, mem, 8192, ALL_ACCESS);
	CHECK(mr, "MR");
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "AH");

	const int unknown[] = { IBV_WR_TSO, IBV_WR_DRIVER1, 12, 13, 14, IBV_WR_ATOMIC_WRITE };
	for (unsigned i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++)
		connected(IBV_QPT_RC, unknown[i]);
	const int some[] = { IBV_WR_TSO, IBV_WR_DRIVER1, IBV_WR_ATOMIC_WRITE };
	for (unsigned i = 0; i < sizeof(some) / sizeof(some[0]); i++)
		connected(IBV_QPT_UC, some[i]);
	for (unsigned i = 0; i < sizeof(some) / sizeof(some[0]); i++)
		datagram(ah, some[i]);
	refused(IBV_WR_TSO);
	refused(IBV_WR_ATOMIC_WRITE);

	CHECK(!ibv_destroy_ah(ah) && !ibv_dereg_mr(mr) && !ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "teardown");
	printf("dropin_raw_opcodes: OK\n");
	return 0;
}
