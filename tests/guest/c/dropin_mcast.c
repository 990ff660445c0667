/* Multicast: UD QPs attached to a group receive what is sent to the group's GID, none after
 * they detach; the errors attach and detach give.
 *
 * Usage: dropin_mcast [DEV [SEND_DEV]]. The receivers are on DEV (default rxe0), the sender on
 * SEND_DEV (default DEV). rxe delivers a datagram to the group only if the netdev takes the
 * group's IPv4 packets (tests/guest/libibverbs_dropin_verbs.sh sets that up: see
 * docs/kernel-facts.md). */
#include "common.h"
#include <time.h>

static struct ibv_context *sctx;
static struct ibv_pd *pd, *spd;
static struct ibv_cq *scq, *rcq[2];
static struct ibv_mr *mr, *smr;
static char *buf, *sbuf;
static struct ibv_qp *sender;
#define QKEY 0x22222222

static struct ibv_qp *ud_qp(struct ibv_pd *on, struct ibv_cq *send_cq, struct ibv_cq *recv_cq)
{
	struct ibv_qp_init_attr a = { .send_cq = send_cq, .recv_cq = recv_cq, .qp_type = IBV_QPT_UD,
		.cap = { .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *q = ibv_create_qp(on, &a);
	CHECK(q, "ibv_create_qp UD");
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY };
	CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), "UD INIT");
	m.qp_state = IBV_QPS_RTR;
	CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE), "UD RTR");
	m.qp_state = IBV_QPS_RTS;
	CHECK(!ibv_modify_qp(q, &m, IBV_QP_STATE | IBV_QP_SQ_PSN), "UD RTS");
	return q;
}

/* Prints what receiver `i` got within two seconds, or that it got nothing. QP numbers are
 * per device, so the source is told by comparing with the sender's. */
static void receive(int i, struct ibv_qp *r, const char *what)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(rcq[i], 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n) {
			printf("%s: wr_id %llu %s opcode %d byte_len %u flags %#x on it %d from the sender %d\n", what,
			       (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status), wc.opcode, wc.byte_len,
			       wc.wc_flags, wc.qp_num == r->qp_num, wc.src_qp == sender->qp_num);
			return;
		}
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 2)
			break;
	}
	printf("%s: nothing\n", what);
}

static void send_to_group(struct ibv_ah *ah, uint64_t wr_id)
{
	struct ibv_sge sge = { (uintptr_t)sbuf, 64, smr->lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED, .wr.ud = { .ah = ah, .remote_qpn = 0xffffff, .remote_qkey = QKEY } },
		*bad;
	CHECK(!ibv_post_send(sender, &wr, &bad), "ibv_post_send to the group");
	struct ibv_wc wc = wait_wc(scq, "send to the group");
	CHECK(wc.status == IBV_WC_SUCCESS, "send to the group");
}

static struct ibv_context *open_named(const char *name)
{
	struct ibv_context *c = NULL;
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list, "no devices");
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), name))
			c = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	CHECK(c, "open %s", name);
	return c;
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	sctx = argc > 2 ? open_named(argv[2]) : ctx;
	pd = ibv_alloc_pd(ctx);
	spd = sctx == ctx ? pd : ibv_alloc_pd(sctx);
	scq = ibv_create_cq(sctx, 16, NULL, NULL, 0);
	rcq[0] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	rcq[1] = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	buf = aligned_alloc(4096, 65536);
	sbuf = aligned_alloc(4096, 4096);
	CHECK(pd && spd && scq && rcq[0] && rcq[1] && buf && sbuf, "pd, CQs");
	memset(buf, 0, 65536);
	for (int i = 0; i < 64; i++)
		sbuf[i] = (char)(5 * i + 2);
	mr = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	smr = ibv_reg_mr(spd, sbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr && smr, "ibv_reg_mr");

	struct ibv_qp *r[2] = { ud_qp(pd, rcq[0], rcq[0]), ud_qp(pd, rcq[1], rcq[1]) };
	sender = ud_qp(spd, scq, scq);
	name_qp(0, sender);
	/* The group: IPv4-mapped 239.1.2.3, as the ports' GID 1 is IPv4-mapped. */
	union ibv_gid group = { .raw = { [10] = 0xff, [11] = 0xff, [12] = 239, [13] = 1, [14] = 2, [15] = 3 } };
	for (int i = 0; i < 2; i++)
		printf("attach receiver %d: %d\n", i, ibv_attach_mcast(r[i], &group, 0));
	printf("attach receiver 0 again: %d\n", ibv_attach_mcast(r[0], &group, 0));
	struct ibv_qp_init_attr rc = { .send_cq = rcq[0], .recv_cq = rcq[0], .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *rcqp = ibv_create_qp(pd, &rc);
	CHECK(rcqp, "RC QP");
	printf("attach an RC QP: %s\n", strerror(ibv_attach_mcast(rcqp, &group, 0)));
	union ibv_gid unicast = gid;
	printf("attach to a unicast GID: %s\n", strerror(ibv_attach_mcast(r[0], &unicast, 0)));

	struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = group, .sgid_index = 1, .hop_limit = 1 } };
	struct ibv_ah *ah = ibv_create_ah(spd, &aa);
	CHECK(ah, "ibv_create_ah for the group");
	for (int i = 0; i < 2; i++)
		for (int j = 0; j < 2; j++)
			post_recv(r[i], 10 * i + j, buf + 4096 * (1 + 2 * i + j), 1024, mr->lkey);

	send_to_group(ah, 1);
	receive(0, r[0], "receiver 0");
	receive(1, r[1], "receiver 1");
	receive(0, r[0], "receiver 0, a second copy");
	printf("payloads after the GRH: %d %d\n", !memcmp(buf + 4096 + 40, sbuf, 64),
	       !memcmp(buf + 3 * 4096 + 40, sbuf, 64));

	printf("detach receiver 1: %d\n", ibv_detach_mcast(r[1], &group, 0));
	send_to_group(ah, 2);
	receive(0, r[0], "receiver 0, after receiver 1 detached");
	receive(1, r[1], "receiver 1, after it detached");
	printf("payload after the GRH: %d\n", !memcmp(buf + 2 * 4096 + 40, sbuf, 64));
	printf("detach receiver 1 again: %s\n", strerror(ibv_detach_mcast(r[1], &group, 0)));
	printf("detach receiver 0: %d\n", ibv_detach_mcast(r[0], &group, 0));
	send_to_group(ah, 3);
	receive(0, r[0], "receiver 0, after both detached");

	CHECK(!ibv_destroy_qp(sender) && !ibv_destroy_qp(r[0]) && !ibv_destroy_qp(r[1]) && !ibv_destroy_qp(rcqp),
	      "destroy");
	CHECK(!ibv_destroy_ah(ah), "destroy AH");
	printf("dropin_mcast: OK\n");
	return 0;
}
