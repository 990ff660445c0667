/*
 * The libmlx5 side of the differential (same WQE bytes, doorbells and completions as the
 * Rust provider): runs a script of
 * work requests through plain libibverbs on one RC QP in RTS, then on a UD QP, calling the mlx5 model's
 * trace step (uverbs_mlx5_model_step, found with dlsym) after each script step, and prints
 * every completion. tests/mlx5/wqe_diff.rs is the same program on the Rust core; xtask
 * (src/mlx5_diff.rs) writes the script and compares the two runs' traces and outputs.
 *
 * Script lines (numbers decimal or 0x hex):
 *   qp <max_send_wr> <max_recv_wr> <max_send_sge> <max_recv_sge> <max_inline> <cqe>
 *   ud <max_send_wr> <max_recv_wr> <max_send_sge> <max_recv_sge> <max_inline> <cqe>
 *                           a UD QP (Q_Key 0x11111111) on a CQ of its own, in RTS: the lines
 *                           after it post to it (the RC QP stays)
 *   z <type> <max_send_wr> <max_recv_wr> <max_send_sge> <max_recv_sge> <max_inline>
 *                           a QP of type 0 RC, 1 UC, 2 UD on the current CQ, destroyed at
 *                           once: its CREATE_QP shows the queue sizes asked for those caps
 *   A <dlid> <sl> <src_path_bits> <static_rate> <is_global> <hop_limit> <tclass> <flow_label>
 *     <dgid high 64 bits> <dgid low 64 bits>
 *                           an address handle (port 1, source GID 0), numbered from 0
 *   S <wr_id> <op> <flags> <imm> <raddr> <rkey> <compare> <swap_add> <nsge> {<addr> <len> <lkey>}
 *   P                       post the send requests since the last P
 *   R <wr_id> <nsge> {<addr> <len> <lkey>}
 *   Q                       post the receive requests since the last Q
 *   T <label>               trace step, then poll every completion the posts asked for
 * op: ibv_wr_opcode (0 WRITE, 1 WRITE_IMM, 2 SEND, 3 SEND_IMM, 4 READ, 5 CAS, 6 FAA);
 * flags: ibv_send_flags (1 FENCE, 2 SIGNALED, 4 SOLICITED, 8 INLINE); imm in host order. On
 * the UD QP, <raddr> is the remote QPN, <rkey> the remote Q_Key and <compare> the AH's number. An
 * inline request's SGE addresses are offsets into a local pattern buffer; every other address
 * and key is used as given: while it traces, the model executes nothing (the QP is connected
 * to itself only because posting needs RTS) and completes each traced WQE with a CQE of its
 * own seeded generator.
 *
 * Build: gcc -O2 -Wall -Werror -o wqe_diff wqe_diff.c -libverbs -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <endian.h>
#include <infiniband/verbs.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_WR 64
#define MAX_SGE 8
#define MAX_AH 16

static unsigned char pattern[4096];

static void die(const char *what)
{
	fprintf(stderr, "wqe_diff: %s\n", what);
	exit(1);
}

static uint64_t num(char **p)
{
	char *end;
	uint64_t v = strtoull(*p, &end, 0);

	if (end == *p)
		die("script: number expected");
	*p = end;
	return v;
}

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void print_wc(const struct ibv_wc *wc, uint32_t qpn)
{
	printf("wc id=%" PRIx64 " status=%u opcode=%u vendor_err=%x byte_len=%u imm=%08x qp=%s "
	       "src_qp=%x flags=%x pkey=%u slid=%u sl=%u dlid_path_bits=%u\n",
	       wc->wr_id, wc->status, wc->opcode, wc->vendor_err, wc->byte_len, wc->imm_data,
	       wc->qp_num == qpn ? "self" : "other", wc->src_qp, wc->wc_flags, wc->pkey_index,
	       wc->slid, wc->sl, wc->dlid_path_bits);
}

int main(int argc, char **argv)
{
	struct ibv_send_wr swr[MAX_WR], *bad_s;
	struct ibv_recv_wr rwr[MAX_WR], *bad_r;
	struct ibv_sge ssge[MAX_WR][MAX_SGE], rsge[MAX_WR][MAX_SGE];
	int ns = 0, nr = 0, expected = 0;
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd;
	struct ibv_cq *cq = NULL, *cqs[2];
	struct ibv_qp *qp = NULL, *qps[2];
	struct ibv_ah *ahs[MAX_AH];
	int nqp = 0, nah = 0;
	char line[4096];
	FILE *script;
	int (*step)(const char *);
	int i;

	if (argc != 3)
		die("usage: wqe_diff <device> <script>");
	for (i = 0; i < (int)sizeof(pattern); i++)
		pattern[i] = (unsigned char)(i * 7 + 3);
	step = (int (*)(const char *))dlsym(RTLD_DEFAULT, "uverbs_mlx5_model_step");
	if (!step)
		die("not on the mlx5 model (no uverbs_mlx5_model_step)");
	script = fopen(argv[2], "r");
	if (!script)
		die("cannot open the script");
	list = ibv_get_device_list(NULL);
	for (i = 0; list && list[i]; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	if (!ctx)
		die("cannot open the device");
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd");

	while (fgets(line, sizeof(line), script)) {
		char *p = line + 1;

		if (line[0] == 'q') {
			struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_RC };
			struct ibv_port_attr port;
			struct ibv_qp_attr attr = {
				.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						   IBV_ACCESS_REMOTE_READ |
						   IBV_ACCESS_REMOTE_ATOMIC,
			};
			int cqe;

			p = line + 2;
			init.cap.max_send_wr = num(&p);
			init.cap.max_recv_wr = num(&p);
			init.cap.max_send_sge = num(&p);
			init.cap.max_recv_sge = num(&p);
			init.cap.max_inline_data = num(&p);
			cqe = num(&p);
			cq = ibv_create_cq(ctx, cqe, NULL, NULL, 0);
			if (!cq)
				die("ibv_create_cq");
			init.send_cq = init.recv_cq = cq;
			qp = ibv_create_qp(pd, &init);
			if (!qp)
				die("ibv_create_qp");
			qps[nqp] = qp;
			cqs[nqp++] = cq;
			if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
				die("ibv_modify_qp INIT");
			if (ibv_query_port(ctx, 1, &port))
				die("ibv_query_port");
			/* Connected to itself: the model executes nothing while it traces. */
			memset(&attr, 0, sizeof(attr));
			attr.qp_state = IBV_QPS_RTR;
			attr.path_mtu = IBV_MTU_1024;
			attr.dest_qp_num = qp->qp_num;
			attr.max_dest_rd_atomic = 16;
			attr.min_rnr_timer = 12;
			attr.ah_attr.dlid = port.lid;
			attr.ah_attr.port_num = 1;
			/* On a RoCE port by GID 0 (RoCE v1, link-local: the MAC comes out of it). */
			if (port.link_layer == IBV_LINK_LAYER_ETHERNET) {
				attr.ah_attr.is_global = 1;
				attr.ah_attr.grh.hop_limit = 1;
				if (ibv_query_gid(ctx, 1, 0, &attr.ah_attr.grh.dgid))
					die("ibv_query_gid");
			}
			if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
					  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
				die("ibv_modify_qp RTR");
			memset(&attr, 0, sizeof(attr));
			attr.qp_state = IBV_QPS_RTS;
			attr.timeout = 14;
			attr.retry_cnt = 7;
			attr.rnr_retry = 7;
			attr.max_rd_atomic = 16;
			if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
				die("ibv_modify_qp RTS");
		} else if (line[0] == 'z') {
			static const enum ibv_qp_type types[] = { IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD };
			struct ibv_qp_init_attr init = { 0 };
			struct ibv_qp *z;
			unsigned long type;

			p = line + 2;
			type = num(&p);
			if (type > 2 || !cq)
				die("script: z line");
			init.qp_type = types[type];
			init.cap.max_send_wr = num(&p);
			init.cap.max_recv_wr = num(&p);
			init.cap.max_send_sge = num(&p);
			init.cap.max_recv_sge = num(&p);
			init.cap.max_inline_data = num(&p);
			init.send_cq = init.recv_cq = cq;
			z = ibv_create_qp(pd, &init);
			if (!z)
				die("ibv_create_qp (z)");
			if (ibv_destroy_qp(z))
				die("ibv_destroy_qp (z)");
		} else if (line[0] == 'u' && line[1] == 'd') {
			struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_UD };
			struct ibv_qp_attr attr = {
				.qp_state = IBV_QPS_INIT,
				.port_num = 1,
				.qkey = 0x11111111,
			};
			int cqe;

			if (nqp != 1)
				die("script: ud after one qp line");
			p = line + 3;
			init.cap.max_send_wr = num(&p);
			init.cap.max_recv_wr = num(&p);
			init.cap.max_send_sge = num(&p);
			init.cap.max_recv_sge = num(&p);
			init.cap.max_inline_data = num(&p);
			cqe = num(&p);
			cq = ibv_create_cq(ctx, cqe, NULL, NULL, 0);
			if (!cq)
				die("ibv_create_cq");
			init.send_cq = init.recv_cq = cq;
			qp = ibv_create_qp(pd, &init);
			if (!qp)
				die("ibv_create_qp UD");
			qps[nqp] = qp;
			cqs[nqp++] = cq;
			if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
					  IBV_QP_PORT | IBV_QP_QKEY))
				die("ibv_modify_qp UD INIT");
			memset(&attr, 0, sizeof(attr));
			attr.qp_state = IBV_QPS_RTR;
			if (ibv_modify_qp(qp, &attr, IBV_QP_STATE))
				die("ibv_modify_qp UD RTR");
			attr.qp_state = IBV_QPS_RTS;
			if (ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN))
				die("ibv_modify_qp UD RTS");
		} else if (line[0] == 'A') {
			struct ibv_ah_attr a = { .port_num = 1 };
			uint64_t hi, lo;

			if (nah == MAX_AH)
				die("script: too many AHs");
			a.dlid = num(&p);
			a.sl = num(&p);
			a.src_path_bits = num(&p);
			a.static_rate = num(&p);
			a.is_global = num(&p);
			a.grh.hop_limit = num(&p);
			a.grh.traffic_class = num(&p);
			a.grh.flow_label = num(&p);
			hi = htobe64(num(&p));
			lo = htobe64(num(&p));
			memcpy(a.grh.dgid.raw, &hi, 8);
			memcpy(a.grh.dgid.raw + 8, &lo, 8);
			ahs[nah] = ibv_create_ah(pd, &a);
			if (!ahs[nah++])
				die("ibv_create_ah");
		} else if (line[0] == 'S') {
			struct ibv_send_wr *w = &swr[ns];
			uint32_t imm;
			int k;

			if (ns == MAX_WR)
				die("script: too many sends");
			memset(w, 0, sizeof(*w));
			w->wr_id = num(&p);
			w->opcode = num(&p);
			w->send_flags = num(&p);
			imm = num(&p);
			w->imm_data = htobe32(imm);
			if (qp->qp_type == IBV_QPT_UD) {
				uint64_t ah;

				w->wr.ud.remote_qpn = num(&p);
				w->wr.ud.remote_qkey = num(&p);
				ah = num(&p);
				if (ah >= (uint64_t)nah)
					die("script: no such AH");
				w->wr.ud.ah = ahs[ah];
				num(&p);
			} else if (w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
			    w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD) {
				w->wr.atomic.remote_addr = num(&p);
				w->wr.atomic.rkey = num(&p);
				w->wr.atomic.compare_add = num(&p);
				w->wr.atomic.swap = num(&p);
				if (w->opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
					w->wr.atomic.compare_add = w->wr.atomic.swap;
			} else {
				w->wr.rdma.remote_addr = num(&p);
				w->wr.rdma.rkey = num(&p);
				num(&p);
				num(&p);
			}
			w->num_sge = num(&p);
			if (w->num_sge > MAX_SGE)
				die("script: too many SGEs");
			for (k = 0; k < w->num_sge; k++) {
				ssge[ns][k].addr = num(&p);
				ssge[ns][k].length = num(&p);
				ssge[ns][k].lkey = num(&p);
				if (w->send_flags & IBV_SEND_INLINE)
					ssge[ns][k].addr += (uintptr_t)pattern;
			}
			w->sg_list = ssge[ns];
			if (ns)
				swr[ns - 1].next = w;
			ns++;
		} else if (line[0] == 'P') {
			int err, posted;

			if (!ns)
				continue;
			bad_s = NULL;
			err = ibv_post_send(qp, swr, &bad_s);
			posted = err ? (int)(bad_s - swr) : ns;
			printf("post_send %d: %d posted%s\n", ns, posted, err ? ", then an error" : "");
			for (i = 0; i < posted; i++)
				expected += !!(swr[i].send_flags & IBV_SEND_SIGNALED);
			ns = 0;
		} else if (line[0] == 'R') {
			struct ibv_recv_wr *w = &rwr[nr];
			int k;

			if (nr == MAX_WR)
				die("script: too many receives");
			memset(w, 0, sizeof(*w));
			w->wr_id = num(&p);
			w->num_sge = num(&p);
			if (w->num_sge > MAX_SGE)
				die("script: too many SGEs");
			for (k = 0; k < w->num_sge; k++) {
				rsge[nr][k].addr = num(&p);
				rsge[nr][k].length = num(&p);
				rsge[nr][k].lkey = num(&p);
			}
			w->sg_list = rsge[nr];
			if (nr)
				rwr[nr - 1].next = w;
			nr++;
		} else if (line[0] == 'Q') {
			int err, posted;

			if (!nr)
				continue;
			bad_r = NULL;
			err = ibv_post_recv(qp, rwr, &bad_r);
			posted = err ? (int)(bad_r - rwr) : nr;
			printf("post_recv %d: %d posted%s\n", nr, posted, err ? ", then an error" : "");
			expected += posted;
			nr = 0;
		} else if (line[0] == 'T') {
			struct ibv_wc wc[16];
			double deadline = now() + 10;
			int got = 0, n;

			line[strcspn(line, "\n")] = 0;
			if (step(line + 2))
				die("the model's trace step failed");
			while (got < expected && now() < deadline) {
				memset(wc, 0, sizeof(wc));
				n = ibv_poll_cq(cq, 16, wc);
				if (n < 0) {
					printf("poll error %d\n", n);
					break;
				}
				for (i = 0; i < n; i++)
					print_wc(&wc[i], qp->qp_num);
				got += n;
			}
			n = ibv_poll_cq(cq, 16, wc);
			printf("step %s: %d completions of %d, %d more after\n", line + 2, got, expected, n);
			expected = 0;
		}
	}
	for (i = 0; i < nah; i++)
		if (ibv_destroy_ah(ahs[i]))
			die("ibv_destroy_ah");
	for (i = 0; i < nqp; i++)
		if (ibv_destroy_qp(qps[i]))
			die("ibv_destroy_qp");
	for (i = 0; i < nqp; i++)
		if (ibv_destroy_cq(cqs[i]))
			die("ibv_destroy_cq");
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	printf("wqe_diff: done\n");
	return 0;
}
