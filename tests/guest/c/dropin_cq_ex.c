/* The extended CQ (ibv_create_cq_ex, ibv_start_poll/next_poll/end_poll, ibv_wc_read_*): every
 * opcode's completion read through the accessors, a batch read with ibv_next_poll, an error
 * completion, the accessors set for the wc_flags asked for, and the wc_flags refused.
 *
 * rdma-core v44's rxe corrupts its CQ when ibv_end_poll follows an ibv_next_poll that returned
 * ENOENT (fixed in v55, commit b78b414e; the double unlock there in v59, 5e7aa410), so
 * ibv_next_poll is only called here when the completion it reads is known to be there: the
 * responder writes a receive completion before it acknowledges, so once the sender's last
 * send completed, every receive is in the CQ. */
#include "common.h"

static struct ibv_cq_ex *scq, *rcq;

/* Prints the current completion of an extended CQ through every accessor. */
static void print_ex(const char *what, struct ibv_cq_ex *cq)
{
	printf("%s: wr_id %llu %s opcode %d vendor_err %u", what, (unsigned long long)cq->wr_id,
	       ibv_wc_status_str(cq->status), ibv_wc_read_opcode(cq), ibv_wc_read_vendor_err(cq));
	if (cq->status == IBV_WC_SUCCESS) {
		unsigned int flags = ibv_wc_read_wc_flags(cq);
		printf(" byte_len %u imm %#x flags %#x qp %c src_qp %c slid %u sl %u dlid_path_bits %u",
		       ibv_wc_read_byte_len(cq), (flags & IBV_WC_WITH_IMM) ? ntohl(ibv_wc_read_imm_data(cq)) : 0, flags,
		       qp_name(ibv_wc_read_qp_num(cq)), qp_name(ibv_wc_read_src_qp(cq)), ibv_wc_read_slid(cq),
		       ibv_wc_read_sl(cq), ibv_wc_read_dlid_path_bits(cq));
	}
	printf("\n");
}

/* Waits for one completion: ibv_start_poll until it finds one, then ibv_end_poll. */
static void one(struct ibv_cq_ex *cq, const char *what)
{
	struct ibv_poll_cq_attr attr = {};
	int rc;
	for (long spins = 0; (rc = ibv_start_poll(cq, &attr)) == ENOENT; spins++)
		CHECK(spins < SPINS, "%s: no completion", what);
	CHECK(rc == 0, "ibv_start_poll: %d", rc);
	print_ex(what, cq);
	ibv_end_poll(cq);
}

static void post(struct ibv_qp *qp, uint64_t wr_id, enum ibv_wr_opcode op, void *laddr, uint32_t len, uint32_t lkey,
		 uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)laddr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
		.send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x1000 + wr_id) }, *bad;
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = op == IBV_WR_ATOMIC_CMP_AND_SWP ? 7 : 5;
		wr.wr.atomic.swap = 9;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	CHECK(!ibv_post_send(qp, &wr, &bad), "ibv_post_send %d", op);
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = aligned_alloc(4096, 65536);
	CHECK(pd && buf, "pd");
	memset(buf, 0, 65536);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 65536, ALL_ACCESS & ~IBV_ACCESS_MW_BIND);
	CHECK(mr, "ibv_reg_mr");

	/* wc_flags the provider refuses, and the accessors it sets for a subset. */
	struct ibv_cq_init_attr_ex xa = { .cqe = 16, .wc_flags = IBV_WC_EX_WITH_COMPLETION_TIMESTAMP };
	errno = 0;
	struct ibv_cq_ex *bad = ibv_create_cq_ex(ctx, &xa);
	printf("create_cq_ex with COMPLETION_TIMESTAMP: %s, errno %s\n", bad ? "created" : "refused", strerror(errno));
	xa.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_QP_NUM;
	struct ibv_cq_ex *some = ibv_create_cq_ex(ctx, &xa);
	CHECK(some, "ibv_create_cq_ex (BYTE_LEN | QP_NUM)");
	printf("accessors with BYTE_LEN | QP_NUM: opcode %d vendor_err %d wc_flags %d byte_len %d imm %d qp_num %d "
	       "src_qp %d slid %d sl %d dlid_path_bits %d\n", !!some->read_opcode, !!some->read_vendor_err,
	       !!some->read_wc_flags, !!some->read_byte_len, !!some->read_imm_data, !!some->read_qp_num,
	       !!some->read_src_qp, !!some->read_slid, !!some->read_sl, !!some->read_dlid_path_bits);
	struct ibv_poll_cq_attr pa = {};
	printf("start_poll on an empty CQ: %s\n", strerror(ibv_start_poll(some, &pa)));
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(some)), "destroy");

	xa.wc_flags = IBV_WC_STANDARD_FLAGS;
	xa.cqe = 64;
	scq = ibv_create_cq_ex(ctx, &xa);
	rcq = ibv_create_cq_ex(ctx, &xa);
	struct ibv_cq *pcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(scq && rcq && pcq, "CQs");
	printf("cqe %d\n", ibv_cq_ex_to_cq(scq)->cqe);
	struct ibv_qp_init_attr qa = { .send_cq = ibv_cq_ex_to_cq(scq), .recv_cq = pcq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *a = ibv_create_qp(pd, &qa);
	qa.send_cq = pcq;
	qa.recv_cq = ibv_cq_ex_to_cq(rcq);
	struct ibv_qp *b = ibv_create_qp(pd, &qa);
	CHECK(a && b, "QPs");
	name_qp(0, a);
	name_qp(1, b);
	connect_pair(a, b);

	/* Every opcode, one completion at a time. */
	char *src = buf, *dst = buf + 4096, *atom = buf + 8192;
	for (int i = 0; i < 64; i++)
		src[i] = (char)(i + 1);
	*(uint64_t *)atom = 7;
	for (int i = 0; i < 3; i++)
		post_recv(b, 100 + i, dst + 1024 * i, 1024, mr->lkey);
	post(a, 1, IBV_WR_SEND, src, 48, mr->lkey, 0, 0);
	one(scq, "send");
	post(a, 2, IBV_WR_SEND_WITH_IMM, src, 16, mr->lkey, 0, 0);
	one(scq, "send with imm");
	post(a, 3, IBV_WR_RDMA_WRITE, src, 64, mr->lkey, (uintptr_t)dst + 3072, mr->rkey);
	one(scq, "rdma write");
	post(a, 4, IBV_WR_RDMA_WRITE_WITH_IMM, src, 32, mr->lkey, (uintptr_t)dst + 3072, mr->rkey);
	one(scq, "rdma write with imm");
	post(a, 5, IBV_WR_RDMA_READ, buf + 12288, 64, mr->lkey, (uintptr_t)src, mr->rkey);
	one(scq, "rdma read");
	post(a, 6, IBV_WR_ATOMIC_CMP_AND_SWP, buf + 12288, 8, mr->lkey, (uintptr_t)atom, mr->rkey);
	one(scq, "compare and swap");
	post(a, 7, IBV_WR_ATOMIC_FETCH_AND_ADD, buf + 12288, 8, mr->lkey, (uintptr_t)atom, mr->rkey);
	one(scq, "fetch and add");
	printf("atomic target %llu, read back %d %d\n", (unsigned long long)*(uint64_t *)atom, buf[12288 + 63],
	       !memcmp(dst + 3072, src, 64));
	for (int i = 0; i < 3; i++)
		one(rcq, "receive");
	printf("received %d %d\n", !memcmp(dst, src, 48), !memcmp(dst + 1024, src, 16));

	/* A batch: four receives, all in the CQ once the fourth send completed. */
	for (int i = 0; i < 4; i++)
		post_recv(b, 200 + i, dst + 1024 * i, 1024, mr->lkey);
	for (int i = 0; i < 4; i++) {
		post(a, 10 + i, i % 2 ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND, src, 8 * (i + 1), mr->lkey, 0, 0);
		one(scq, "batch send");
	}
	struct ibv_poll_cq_attr attr = {};
	CHECK(!ibv_start_poll(rcq, &attr), "ibv_start_poll on four receives");
	print_ex("batch receive 1", rcq);
	for (int i = 2; i <= 4; i++) {
		CHECK(!ibv_next_poll(rcq), "ibv_next_poll %d", i);
		char what[32];
		snprintf(what, sizeof what, "batch receive %d", i);
		print_ex(what, rcq);
	}
	ibv_end_poll(rcq);
	printf("start_poll after the batch: %s\n", strerror(ibv_start_poll(rcq, &attr)));

	/* ibv_poll_cq on an extended CQ. */
	post(a, 20, IBV_WR_RDMA_WRITE, src, 8, mr->lkey, (uintptr_t)dst, mr->rkey);
	wait_wc(ibv_cq_ex_to_cq(scq), "ibv_poll_cq on the extended CQ");

	/* An error completion: a write with a wrong rkey, then the flushed request after it. */
	post(a, 30, IBV_WR_RDMA_WRITE, src, 8, mr->lkey, (uintptr_t)dst, mr->rkey ^ 0x80);
	one(scq, "write with a bad rkey");
	post(a, 31, IBV_WR_SEND, src, 8, mr->lkey, 0, 0);
	one(scq, "send after the error");

	CHECK(!ibv_destroy_qp(a) && !ibv_destroy_qp(b), "destroy QPs");
	CHECK(!ibv_destroy_cq(ibv_cq_ex_to_cq(scq)) && !ibv_destroy_cq(ibv_cq_ex_to_cq(rcq)) && !ibv_destroy_cq(pcq),
	      "destroy CQs");
	CHECK(!ibv_dereg_mr(mr) && !ibv_dealloc_pd(pd), "dereg, dealloc");
	CHECK(!ibv_close_device(ctx), "close");
	printf("dropin_cq_ex: OK\n");
	return 0;
}
