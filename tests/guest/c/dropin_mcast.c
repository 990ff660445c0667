/* Multicast: UD QPs attached to a group receive what is sent to the group's GID, none after
 * they detach; the errors attach and detach give. */
#include "common.h"
#include <time.h>

static struct ibv_pd *pd;
static struct ibv_cq *scq, *rcq[2];
static struct ibv_mr *mr;
static char *buf;
#define QKEY 0x22222222

static struct ibv_qp *ud_qp(struct ibv_cq *recv_cq)
{
	struct ibv_qp_init_attr a = { .send_cq = scq, .recv_cq = recv_cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *q = ibv_create_qp(pd, &a);
	CHECK(q, "ibv_create_qp UD");
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "UD INIT");
	m.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE), "UD RTR");
	m.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
	return q;
}

/* Prints what receiver `i` got within two seconds, or that it got nothing. */
static void receive(int i, const char *what)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(rcq[i], 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n) {
			print_wc(what, &wc);
			return;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 2)
			break;
	}
	printf("%s: nothing\n", what);
}

static void send_to_group(struct ibv_qp *s, struct ibv_ah *ah, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED, .wr.ud = { .ah = ah, .remote_qpn = 0xffffff, .remote_qkey = QKEY } },
		*bad;
	CHECK(!ibv_post_send(s, &wr, &bad), "ibv_post_send to the group");
	wait_wc(scq, "send to the group");
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	pd = ibv_alloc_pd(ctx);
	scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	rcq[0] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	rcq[1] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	buf = aligned_alloc(4096, 65536);
	CHECK(pd && scq && rcq[0] && rcq[1] && buf, "pd, CQs");
	memset(buf, 0, 65536);
	for (int i = 0; i < 64; i++)
		buf[i] = (char)(5 * i + 2);
	mr = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");

	struct ibv_qp *s = ud_qp(scq), *r[2] = { ud_qp(rcq[0]), ud_qp(rcq[1]) };
	name_qp(0, s);
	name_qp(1, r[0]);
	name_qp(2, r[1]);
	/* The group: IPv4-mapped 239.1.2.3, as the port's GID 1 is IPv4-mapped. */
	union ibv_gid group = { .raw = { [10] = 0xff, [11] = 0xff, [12] = 239, [13] = 1, [14] = 2, [15] = 3 } };
	for (int i = 0; i < 2; i++)
		printf("attach receiver %d: %d\n", i, ibv_attach_mcast(r[i], &group, 0));
	struct ibv_qp_init_attr rc = { .send_cq = scq, .recv_cq = scq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *rcqp = ibv_create_qp(pd, &rc);
	CHECK(rcqp, "RC QP");
	printf("attach an RC QP: %s\n", strerror(ibv_attach_mcast(rcqp, &group, 0)));

	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = group, .sgid_index = 1, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah, "ibv_create_ah for the group");
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			post_recv(r[i], 10 * i + j, buf + 4096 * (1 + 2 * i + j), 1024, mr->lkey);

	send_to_group(s, ah, 1);
	receive(0, "receiver 0");
	receive(1, "receiver 1");
	printf("payloads after the GRH: %d %d\n", !memcmp(buf + 4096 + 40, buf, 64), !memcmp(buf + 3 * 4096 + 40, buf, 64));

	printf("detach receiver 1: %d\n", ibv_detach_mcast(r[1], &group, 0));
	send_to_group(s, ah, 2);
	receive(0, "receiver 0, after receiver 1 detached");
	receive(1, "receiver 1, after it detached");
	printf("detach receiver 1 again: %s\n", strerror(ibv_detach_mcast(r[1], &group, 0)));
	printf("detach receiver 0: %d\n", ibv_detach_mcast(r[0], &group, 0));

	CHECK(!ibv_destroy_qp(s) && !ibv_destroy_qp(r[0]) && !ibv_destroy_qp(r[1]) && !ibv_destroy_qp(rcqp), "destroy");
	CHECK(!ibv_destroy_ah(ah), "destroy AH");
	printf("dropin_mcast: OK\n");
	return 0;
}
