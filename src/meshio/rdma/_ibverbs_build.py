"""cffi build script for :mod:`meshio._ibverbs_ffi`, the libibverbs binding
used by the ``ibverbs`` RDMA backend (:mod:`meshio.rdma._ibverbs_device`,
:mod:`meshio.rdma._ibverbs_qp`).

API mode: the module is compiled against ``<infiniband/verbs.h>``, because
``ibv_post_send``, ``ibv_poll_cq`` and ``ibv_req_notify_cq`` are static
inline functions dispatching through the context's function table, and
``ibv_reg_mr`` and ``ibv_query_port`` are macros; structs are declared
partially (``...;``) so the compiler supplies their layout.  The cdef below
lists exactly what the backend uses.

``setup.py`` runs this (``cffi_modules``) only when ``verbs.h`` is installed
(Debian: ``libibverbs-dev``); without it meshio installs without the module
and the backend reports itself absent.  By hand::

    cd src && python meshio/rdma/_ibverbs_build.py   # writes meshio/_ibverbs_ffi*.so
"""

from __future__ import annotations

import importlib
from typing import Any

cffi: Any = importlib.import_module("cffi")  # a build-time requirement only

CDEF = r"""
/* ---- devices */
struct ibv_device { ...; };
struct ibv_context { ...; };
struct ibv_device **ibv_get_device_list(int *num_devices);
void ibv_free_device_list(struct ibv_device **list);
const char *ibv_get_device_name(struct ibv_device *device);
struct ibv_context *ibv_open_device(struct ibv_device *device);
int ibv_close_device(struct ibv_context *context);

struct ibv_device_attr {
    uint64_t max_mr_size;
    int max_qp_wr;
    int max_sge;
    int max_cqe;
    int max_qp_rd_atom;
    int max_qp_init_rd_atom;
    uint8_t phys_port_cnt;
    ...;
};
int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *device_attr);

/* ---- ports and GIDs */
enum ibv_port_state { IBV_PORT_ACTIVE, ... };
enum ibv_mtu { IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096, ... };
#define IBV_LINK_LAYER_INFINIBAND ...
#define IBV_LINK_LAYER_ETHERNET ...
struct ibv_port_attr {
    enum ibv_port_state state;
    enum ibv_mtu active_mtu;
    int gid_tbl_len;
    uint32_t max_msg_sz;
    uint16_t lid;
    uint8_t link_layer;
    ...;
};
int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                   struct ibv_port_attr *port_attr);               /* a macro */

union ibv_gid { uint8_t raw[16]; ...; };
enum ibv_gid_type { IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2, ... };
struct ibv_gid_entry {
    union ibv_gid gid;
    uint32_t gid_index;
    uint32_t port_num;
    uint32_t gid_type;
    ...;
};
ssize_t ibv_query_gid_table(struct ibv_context *context, struct ibv_gid_entry *entries,
                            size_t max_entries, uint32_t flags);    /* static inline */

/* ---- protection domain, memory regions */
struct ibv_pd { ...; };
struct ibv_pd *ibv_alloc_pd(struct ibv_context *context);
int ibv_dealloc_pd(struct ibv_pd *pd);

enum ibv_access_flags {
    IBV_ACCESS_LOCAL_WRITE, IBV_ACCESS_REMOTE_WRITE, IBV_ACCESS_REMOTE_READ, ...
};
struct ibv_mr { uint32_t lkey; uint32_t rkey; ...; };
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
                          int access);                              /* a macro */
int ibv_dereg_mr(struct ibv_mr *mr);

/* ---- completion channel and queue */
struct ibv_comp_channel { int fd; ...; };
struct ibv_cq { ...; };
struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context);
int ibv_destroy_comp_channel(struct ibv_comp_channel *channel);
struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                             struct ibv_comp_channel *channel, int comp_vector);
int ibv_destroy_cq(struct ibv_cq *cq);
int ibv_req_notify_cq(struct ibv_cq *cq, int solicited_only);       /* static inline */
int ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq, void **cq_context);
void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents);

enum ibv_wc_status { IBV_WC_SUCCESS, IBV_WC_REM_ACCESS_ERR, IBV_WC_RETRY_EXC_ERR,
                     IBV_WC_WR_FLUSH_ERR, ... };
struct ibv_wc {
    uint64_t wr_id;
    enum ibv_wc_status status;
    uint32_t vendor_err;
    uint32_t byte_len;
    uint32_t qp_num;
    ...;
};
int ibv_poll_cq(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);  /* static inline */
const char *ibv_wc_status_str(enum ibv_wc_status status);

/* ---- reliable-connected queue pairs */
enum ibv_qp_type { IBV_QPT_RC, ... };
enum ibv_qp_state { IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR, ... };
enum ibv_qp_attr_mask {
    IBV_QP_STATE, IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_AV,
    IBV_QP_PATH_MTU, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT, IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN,
    IBV_QP_MAX_QP_RD_ATOMIC, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN,
    IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_DEST_QPN, ...
};
struct ibv_qp_cap {
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
};
struct ibv_qp_init_attr {
    struct ibv_cq *send_cq;
    struct ibv_cq *recv_cq;
    struct ibv_qp_cap cap;
    enum ibv_qp_type qp_type;
    int sq_sig_all;
    ...;
};
struct ibv_qp { uint32_t qp_num; ...; };
struct ibv_global_route {
    union ibv_gid dgid;
    uint32_t flow_label;
    uint8_t sgid_index;
    uint8_t hop_limit;
    uint8_t traffic_class;
};
struct ibv_ah_attr {
    struct ibv_global_route grh;
    uint16_t dlid;
    uint8_t sl;
    uint8_t src_path_bits;
    uint8_t static_rate;
    uint8_t is_global;
    uint8_t port_num;
};
struct ibv_qp_attr {
    enum ibv_qp_state qp_state;
    enum ibv_mtu path_mtu;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint32_t dest_qp_num;
    unsigned int qp_access_flags;
    struct ibv_ah_attr ah_attr;
    uint16_t pkey_index;
    uint8_t max_rd_atomic;
    uint8_t max_dest_rd_atomic;
    uint8_t min_rnr_timer;
    uint8_t port_num;
    uint8_t timeout;
    uint8_t retry_cnt;
    uint8_t rnr_retry;
    ...;
};
struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *qp_init_attr);
int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask);
int ibv_destroy_qp(struct ibv_qp *qp);

/* ---- RDMA READ / WRITE */
enum ibv_wr_opcode { IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ, ... };
enum ibv_send_flags { IBV_SEND_SIGNALED, ... };
struct ibv_sge { uint64_t addr; uint32_t length; uint32_t lkey; };
struct ibv_send_wr {
    uint64_t wr_id;
    struct ibv_send_wr *next;
    struct ibv_sge *sg_list;
    int num_sge;
    enum ibv_wr_opcode opcode;
    unsigned int send_flags;
    union {
        struct { uint64_t remote_addr; uint32_t rkey; } rdma;
        struct { uint64_t remote_addr; uint64_t compare_add; uint64_t swap;
                 uint32_t rkey; } atomic;
        struct { struct ibv_ah *ah; uint32_t remote_qpn; uint32_t remote_qkey; } ud;
    } wr;
    ...;
};
int ibv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
                  struct ibv_send_wr **bad_wr);                     /* static inline */
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)
ffi.set_source("meshio._ibverbs_ffi", "#include <infiniband/verbs.h>", libraries=["ibverbs"])

if __name__ == "__main__":
    ffi.compile(verbose=True)
