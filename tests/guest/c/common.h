/* Helpers shared by the drop-in comparison programs (tests/guest/libibverbs_dropin_verbs.sh):
 * each program runs once on rdma-core's C rxe provider and once on the drop-in, and the two
 * outputs must be identical, so nothing printed may depend on the run (QP numbers, keys,
 * handles and addresses are printed by name or relative to one another). */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, "FAIL (line %d, errno %d): ", __LINE__, errno); \
	fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } } while (0)
#define SPINS 200000000L

/* Where rdma-core v44 does not do what its man pages say (bugs, most fixed upstream since),
 * the program prints what it got on lines starting "v44-differs: ", which the script leaves
 * out of the comparison, and on the drop-in (run with DROPIN_STRICT set) checks the correct
 * result instead. */
#define DIFFERS "v44-differs: "
static inline int strict(void) { return getenv("DROPIN_STRICT") != NULL; }

static struct ibv_context *ctx;
static union ibv_gid gid;

/* Opens argv[1] (default rxe0) and reads GID 1 (the test guest's ::ffff:127.0.0.1). */
static inline void open_dev(int argc, char **argv)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	CHECK(list, "no devices");
	for (int i = 0; list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argc > 1 ? argv[1] : "rxe0"))
			ctx = ibv_open_device(list[i]);
	CHECK(ctx, "open device");
	CHECK(!ibv_query_gid(ctx, 1, 1, &gid), "query gid");
	ibv_free_device_list(list);
}

static const int ALL_ACCESS = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;

/* RESET -> INIT for an RC or UC QP. */
static inline void to_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), "INIT");
}

/* INIT -> RTR -> RTS towards QP number `dest` on this port. */
static inline void connect_to(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr m = { .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024, .dest_qp_num = dest,
		.max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid, .sgid_index = 1, .hop_limit = 1 } } };
	int rc = qp->qp_type == IBV_QPT_RC;
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			     (rc ? IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER : 0)), "RTR");
	m.qp_state = IBV_QPS_RTS; m.timeout = 14; m.retry_cnt = 7; m.rnr_retry = 7; m.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_SQ_PSN |
			     (rc ? IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC : 0)),
	      "RTS");
}

static inline void connect_pair(struct ibv_qp *a, struct ibv_qp *b)
{
	to_init(a);
	to_init(b);
	connect_to(a, b->qp_num);
	connect_to(b, a->qp_num);
}

/* Names for the QP numbers a program knows, so that output does not depend on the run. */
static struct ibv_qp *named_qps[8];
static const char *qp_names = "ABCDEFGH";

static inline void name_qp(int i, struct ibv_qp *qp) { named_qps[i] = qp; }

static inline char qp_name(uint32_t n)
{
	for (int i = 0; i < 8; i++)
		if (named_qps[i] && named_qps[i]->qp_num == n)
			return qp_names[i];
	return n ? '?' : '0';
}

static inline void post_recv(struct ibv_qp *qp, uint64_t wr_id, void *addr, uint32_t len, uint32_t lkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad;
	CHECK(!ibv_post_recv(qp, &wr, &bad), "ibv_post_recv");
}

/* Prints a completion read with ibv_poll_cq. */
static inline void print_wc(const char *what, const struct ibv_wc *wc)
{
	printf("%s: wr_id %llu %s opcode %d", what, (unsigned long long)wc->wr_id, ibv_wc_status_str(wc->status),
	       wc->opcode);
	if (wc->status == IBV_WC_SUCCESS)
		printf(" byte_len %u imm %#x flags %#x qp %c src_qp %c", wc->byte_len,
		       (wc->wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc->imm_data) : 0, wc->wc_flags,
		       qp_name(wc->qp_num), qp_name(wc->src_qp));
	else
		printf(" qp %c", qp_name(wc->qp_num));
	printf("\n");
}

/* Waits for one completion on a CQ read with ibv_poll_cq, and prints it. */
static inline struct ibv_wc wait_wc(struct ibv_cq *cq, const char *what)
{
	struct ibv_wc wc;
	for (long spins = 0;; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n >= 0, "ibv_poll_cq");
		if (n)
			break;
		CHECK(spins < SPINS, "%s: no completion", what);
	}
	print_wc(what, &wc);
	return wc;
}
