/* ibv_modify_qp and ibv_query_qp beyond the primary path: the alternate path
 * (IBV_QP_ALT_PATH, which Linux refuses on RoCE ports), the path migration state, the rate
 * limit (which rdma-core v44 sends only through MODIFY_QP_EX, so its rxe refuses it),
 * IBV_QP_CAP (which MODIFY_QP carries as a bare mask bit: the kernel answers) and mask bits
 * the kernel does not know; every attribute query_qp reports. */
#include "common.h"

static void print_ah(const char *what, const struct ibv_ah_attr *a)
{
	printf("%s: is_global %d port %d sl %d dlid %d static_rate %d src_path_bits %d sgid_index %d "
	       "hop_limit %d traffic_class %d flow_label %u dgid is the port's %d, zero %d\n", what, a->is_global,
	       a->port_num, a->sl, a->dlid, a->static_rate, a->src_path_bits, a->grh.sgid_index, a->grh.hop_limit,
	       a->grh.traffic_class, a->grh.flow_label, !memcmp(&a->grh.dgid, &gid, 16),
	       !memcmp(&a->grh.dgid, &(union ibv_gid){ 0 }, 16));
}

static void query(struct ibv_qp *qp, const char *when)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr i;
	memset(&a, 0x5a, sizeof(a));
	CHECK(!ibv_query_qp(qp, &a, IBV_QP_STATE | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE, &i), "query");
	printf("query %s: state %d cur_state %d path_mig_state %d alt_pkey_index %d alt_port_num %d alt_timeout %d "
	       "timeout %d retry_cnt %d rnr_retry %d min_rnr_timer %d max_rd_atomic %d max_dest_rd_atomic %d "
	       "path_mtu %d access %#x pkey_index %d port_num %d sq_draining %d\n", when, a.qp_state, a.cur_qp_state,
	       a.path_mig_state, a.alt_pkey_index, a.alt_port_num, a.alt_timeout, a.timeout, a.retry_cnt,
	       a.rnr_retry, a.min_rnr_timer, a.max_rd_atomic, a.max_dest_rd_atomic, a.path_mtu,
	       a.qp_access_flags, a.pkey_index, a.port_num, a.sq_draining);
	print_ah("  ah_attr", &a.ah_attr);
	print_ah("  alt_ah_attr", &a.alt_ah_attr);
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	errno = 0;
	int rc = ibv_modify_qp(qp, a, mask);
	printf("modify %s: %s\n", what, rc ? strerror(rc) : "ok");
}

int main(int argc, char **argv)
{
	open_dev(argc, argv);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq, "pd, CQ");
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia), *peer = ibv_create_qp(pd, &ia);
	CHECK(qp && peer, "RC QPs");
	query(qp, "in RESET");

	struct ibv_ah_attr path = { .is_global = 1, .port_num = 1,
		.grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 } };
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1, .alt_ah_attr = path, .alt_port_num = 1,
		.alt_timeout = 14, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	int init = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	m.cap = (struct ibv_qp_cap){ .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 };
	modify(qp, &m, IBV_QP_CAP, "RESET -> RESET with caps");
	modify(qp, &m, init | IBV_QP_CAP, "RESET -> INIT with caps");
	modify(qp, &m, init | (1 << 22), "RESET -> INIT with mask bit 22");
	modify(qp, &m, init | (1 << 24), "RESET -> INIT with mask bit 24");
	modify(qp, &m, init | IBV_QP_ALT_PATH, "RESET -> INIT with an alternate path");
	modify(qp, &m, init | IBV_QP_RATE_LIMIT, "RESET -> INIT with a rate limit");
	modify(qp, &m, init | (1 << 21), "RESET -> INIT with mask bit 21");
	modify(qp, &m, init | (1 << 26), "RESET -> INIT with mask bit 26");
	modify(qp, &m, init | IBV_QP_PATH_MIG_STATE, "RESET -> INIT with a migration state");
	modify(qp, &m, init, "RESET -> INIT");
	to_init(peer);

	m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = peer->qp_num,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12, .ah_attr = path, .alt_ah_attr = path, .alt_port_num = 1,
		.alt_timeout = 14 };
	int rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
		  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	modify(qp, &m, rtr | IBV_QP_CAP, "INIT -> RTR with caps");
	modify(qp, &m, rtr | IBV_QP_ALT_PATH, "INIT -> RTR with an alternate path");
	m.alt_port_num = 2;
	modify(qp, &m, rtr | IBV_QP_ALT_PATH, "INIT -> RTR with an alternate path on port 2");
	m.alt_port_num = 1;
	m.alt_ah_attr.port_num = 2;
	modify(qp, &m, rtr | IBV_QP_ALT_PATH, "INIT -> RTR with alternate ports 1 and 2");
	modify(qp, &m, rtr, "INIT -> RTR");
	query(qp, "in RTR");

	m = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.max_rd_atomic = 1, .path_mig_state = IBV_MIG_REARM, .alt_ah_attr = path, .alt_port_num = 1 };
	int rts = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
		  IBV_QP_MAX_QP_RD_ATOMIC;
	modify(qp, &m, rts | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE, "RTR -> RTS with an alternate path");
	modify(qp, &m, rts | IBV_QP_PATH_MIG_STATE, "RTR -> RTS with migration state REARM");
	query(qp, "in RTS");
	m.path_mig_state = IBV_MIG_ARMED;
	modify(qp, &m, IBV_QP_PATH_MIG_STATE, "RTS -> RTS with migration state ARMED");
	query(qp, "after ARMED");
	m.path_mig_state = IBV_MIG_MIGRATED;
	modify(qp, &m, IBV_QP_PATH_MIG_STATE, "RTS -> RTS with migration state MIGRATED");
	m.path_mig_state = 7;
	modify(qp, &m, IBV_QP_PATH_MIG_STATE, "RTS -> RTS with migration state 7");
	query(qp, "after 7");
	m.cap = (struct ibv_qp_cap){ .max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1 };
	modify(qp, &m, IBV_QP_CAP, "RTS -> RTS with caps");
	modify(qp, &m, IBV_QP_STATE | IBV_QP_CAP, "RTS -> RTS (state named) with caps");
	query(qp, "after caps");
	m.rate_limit = 1000;
	modify(qp, &m, IBV_QP_RATE_LIMIT, "RTS -> RTS with a rate limit");
	modify(qp, &m, IBV_QP_ALT_PATH, "RTS -> RTS with an alternate path");

	CHECK(!ibv_destroy_qp(qp) && !ibv_destroy_qp(peer), "destroy");
	printf("dropin_qp_attr: OK\n");
	return 0;
}
