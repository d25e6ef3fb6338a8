//go:build verbs && cgo && linux

package rdma

/*
#cgo LDFLAGS: -libverbs
#include <infiniband/verbs.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Work request id of every receive; sends carry the ring's ids (below 2^63
// or exactly 2^63), so a completion says which queue it came from even when
// it failed and its opcode is undefined.
#define NTV_RECV_ID (~(uint64_t)0)
#define NTV_MAX_RECV_BATCH 64

// ntv_dev is an opened device: context, protection domain and the port's
// addressing as the handshake announces it.
struct ntv_dev {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	uint8_t port;
	uint8_t link_layer; // IBV_LINK_LAYER_*
	uint8_t mtu;        // enum ibv_mtu: the port's active MTU
	uint8_t state;      // enum ibv_port_state
	uint16_t lid;
	int gid_index;      // -1: no usable GID
	uint8_t gid[16];
	int gid_tbl_len;
};

// ntv_bufs is a pair of registered rings: tx (local only) and rx (the
// peer may write it). Pooled per device.
struct ntv_bufs {
	char *tx, *rx;
	struct ibv_mr *txmr, *rxmr;
	uint64_t size;
};

// ntv_conn is one connection's queue pair with its completion queue and
// completion channel; evfd is a non-blocking duplicate of the channel's
// fd for Go's poller.
struct ntv_conn {
	struct ntv_dev *dev;
	struct ntv_bufs *bufs;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint64_t raddr;
	uint32_t rkey;
	int evfd;
	struct ibv_wc wc[64];
};

// ntv_wc is the part of a work completion Go looks at.
struct ntv_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t vendor_err;
	uint32_t imm;   // host order
	uint32_t recv;  // 1: a receive (a peer's write with immediate)
	uint32_t with_imm;
	uint32_t byte_len;
};

static void ntv_free_str(char *s) { free(s); }

static int ntv_open(const char *name, int port, struct ntv_dev **out) {
	int n = 0, err;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list)
		return errno ? errno : ENODEV;
	struct ibv_device *found = NULL;
	for (int i = 0; i < n; i++) {
		if (!name[0] || strcmp(ibv_get_device_name(list[i]), name) == 0) {
			found = list[i];
			break;
		}
	}
	if (!found) {
		ibv_free_device_list(list);
		return ENODEV;
	}
	struct ntv_dev *d = calloc(1, sizeof *d);
	if (!d) {
		ibv_free_device_list(list);
		return ENOMEM;
	}
	d->ctx = ibv_open_device(found);
	err = errno;
	ibv_free_device_list(list);
	if (!d->ctx) {
		free(d);
		return err ? err : EIO;
	}
	struct ibv_port_attr pa;
	if ((err = ibv_query_port(d->ctx, port, &pa)) != 0) {
		ibv_close_device(d->ctx);
		free(d);
		return err;
	}
	d->port = port;
	d->link_layer = pa.link_layer;
	d->mtu = pa.active_mtu;
	d->state = pa.state;
	d->lid = pa.lid;
	d->gid_tbl_len = pa.gid_tbl_len;
	d->gid_index = -1;
	d->pd = ibv_alloc_pd(d->ctx);
	if (!d->pd) {
		err = errno;
		ibv_close_device(d->ctx);
		free(d);
		return err ? err : ENOMEM;
	}
	*out = d;
	return 0;
}

static int is_zero(const uint8_t *b, int n) {
	for (int i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

// ntv_pick_gid chooses the source GID: the entry equal to want if
// want_set, else a RoCE v2 GID holding an IPv4 address, else any RoCE v2
// GID, else the first valid one. Returns ENOENT if none fits.
static int ntv_pick_gid(struct ntv_dev *d, const uint8_t *want, int want_set) {
	static const uint8_t v4prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	int best = -1, rank = 0;
	uint8_t gid[16];
	for (int i = 0; i < d->gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(d->ctx, d->port, i, &e, 0) != 0 || is_zero(e.gid.raw, 16))
			continue;
		int r;
		if (want_set)
			r = memcmp(e.gid.raw, want, 16) == 0 ? 4 : 0;
		else if (e.gid_type == IBV_GID_TYPE_ROCE_V2 && memcmp(e.gid.raw, v4prefix, 12) == 0)
			r = 3;
		else if (e.gid_type == IBV_GID_TYPE_ROCE_V2)
			r = 2;
		else
			r = 1;
		if (r > rank) {
			rank = r;
			best = i;
			memcpy(gid, e.gid.raw, 16);
		}
	}
	if (best < 0)
		return ENOENT;
	d->gid_index = best;
	memcpy(d->gid, gid, 16);
	return 0;
}

static int ntv_close(struct ntv_dev *d) {
	int err = ibv_dealloc_pd(d->pd);
	int err2 = ibv_close_device(d->ctx);
	free(d);
	return err ? err : err2;
}

static void ntv_bufs_free(struct ntv_bufs *b) {
	if (b->txmr)
		ibv_dereg_mr(b->txmr);
	if (b->rxmr)
		ibv_dereg_mr(b->rxmr);
	free(b->tx);
	free(b->rx);
	free(b);
}

static int ntv_bufs_new(struct ntv_dev *d, uint64_t size, struct ntv_bufs **out) {
	struct ntv_bufs *b = calloc(1, sizeof *b);
	if (!b)
		return ENOMEM;
	b->size = size;
	if (posix_memalign((void **)&b->tx, 4096, size) || posix_memalign((void **)&b->rx, 4096, size)) {
		ntv_bufs_free(b);
		return ENOMEM;
	}
	memset(b->tx, 0, size);
	memset(b->rx, 0, size);
	b->txmr = ibv_reg_mr(d->pd, b->tx, size, IBV_ACCESS_LOCAL_WRITE);
	if (!b->txmr) {
		int err = errno;
		ntv_bufs_free(b);
		return err ? err : ENOMEM;
	}
	b->rxmr = ibv_reg_mr(d->pd, b->rx, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!b->rxmr) {
		int err = errno;
		ntv_bufs_free(b);
		return err ? err : ENOMEM;
	}
	*out = b;
	return 0;
}

static int ntv_post_recv(struct ntv_conn *c, int n) {
	struct ibv_recv_wr wrs[NTV_MAX_RECV_BATCH], *bad;
	while (n > 0) {
		int k = n < NTV_MAX_RECV_BATCH ? n : NTV_MAX_RECV_BATCH;
		memset(wrs, 0, sizeof wrs[0] * k);
		for (int i = 0; i < k; i++) {
			wrs[i].wr_id = NTV_RECV_ID;
			wrs[i].next = i + 1 < k ? &wrs[i + 1] : NULL;
		}
		int err = ibv_post_recv(c->qp, wrs, &bad);
		if (err)
			return err;
		n -= k;
	}
	return 0;
}

static int ntv_conn_destroy(struct ntv_conn *c) {
	int err = 0, e;
	if (c->qp && (e = ibv_destroy_qp(c->qp)) && !err)
		err = e;
	if (c->cq && (e = ibv_destroy_cq(c->cq)) && !err)
		err = e;
	if (c->ch && (e = ibv_destroy_comp_channel(c->ch)) && !err)
		err = e;
	free(c);
	return err;
}

// ntv_conn_new creates the completion channel, completion queue and queue
// pair, moves the queue pair to INIT and posts rq receives. *step names
// the step that failed.
static int ntv_conn_new(struct ntv_dev *d, struct ntv_bufs *b, int sq, int rq, struct ntv_conn **out, int *step) {
	int err;
	struct ntv_conn *c = calloc(1, sizeof *c);
	if (!c)
		return ENOMEM;
	c->dev = d;
	c->bufs = b;
	c->evfd = -1;
	*step = 1;
	if (!(c->ch = ibv_create_comp_channel(d->ctx)))
		goto fail;
	*step = 2;
	if (!(c->cq = ibv_create_cq(d->ctx, sq + rq, NULL, c->ch, 0)))
		goto fail;
	*step = 3;
	struct ibv_qp_init_attr ia = {
		.send_cq = c->cq,
		.recv_cq = c->cq,
		.cap = {.max_send_wr = sq, .max_recv_wr = rq, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	if (!(c->qp = ibv_create_qp(d->pd, &ia)))
		goto fail;
	*step = 4;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = d->port,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
	};
	if ((err = ibv_modify_qp(c->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)))
		goto fail_err;
	*step = 5;
	if ((err = ntv_post_recv(c, rq)))
		goto fail_err;
	*step = 6;
	if ((err = ibv_req_notify_cq(c->cq, 0)))
		goto fail_err;
	*step = 7;
	int fl = fcntl(c->ch->fd, F_GETFL);
	if (fl < 0 || fcntl(c->ch->fd, F_SETFL, fl | O_NONBLOCK) < 0)
		goto fail;
	if ((c->evfd = fcntl(c->ch->fd, F_DUPFD_CLOEXEC, 0)) < 0)
		goto fail;
	*out = c;
	return 0;
fail:
	err = errno ? errno : EIO;
fail_err:
	ntv_conn_destroy(c);
	return err;
}

// ntv_conn_connect moves the queue pair to RTR and RTS towards the peer.
static int ntv_conn_connect(struct ntv_conn *c, uint32_t qpn, uint32_t rpsn, uint32_t lpsn, uint16_t lid, uint8_t mtu,
			    int grh, const uint8_t *gid, uint64_t raddr, uint32_t rkey, uint8_t timeout, int *step) {
	c->raddr = raddr;
	c->rkey = rkey;
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR,
		.path_mtu = mtu,
		.dest_qp_num = qpn,
		.rq_psn = rpsn,
		.max_dest_rd_atomic = 1,
		.min_rnr_timer = 12, // 0.64 ms
		.ah_attr = {.dlid = lid, .port_num = c->dev->port},
	};
	if (grh) {
		a.ah_attr.is_global = 1;
		memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
		a.ah_attr.grh.sgid_index = c->dev->gid_index;
		a.ah_attr.grh.hop_limit = 64;
	}
	*step = 1;
	int err = ibv_modify_qp(c->qp, &a,
				IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (err)
		return err;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = 7;
	a.rnr_retry = 7; // forever
	a.sq_psn = lpsn;
	a.max_rd_atomic = 1;
	*step = 2;
	return ibv_modify_qp(c->qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				 IBV_QP_MAX_QP_RD_ATOMIC);
}

// ntv_write posts one signaled RDMA write with immediate of tx[off, off+len)
// to the peer's ring at the same offset.
static int ntv_write(struct ntv_conn *c, uint64_t id, uint64_t off, uint32_t len, uint32_t imm) {
	if (off > c->bufs->size || len > c->bufs->size - off)
		return EINVAL;
	struct ibv_sge sge = {.addr = (uintptr_t)(c->bufs->tx + off), .length = len, .lkey = c->bufs->txmr->lkey};
	struct ibv_send_wr wr = {0}, *bad;
	wr.wr_id = id;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl(imm);
	wr.sg_list = len ? &sge : NULL;
	wr.num_sge = len ? 1 : 0;
	wr.wr.rdma.remote_addr = c->raddr + off;
	wr.wr.rdma.rkey = c->rkey;
	return ibv_post_send(c->qp, &wr, &bad);
}

// ntv_poll takes pending channel events, then up to max completions. With
// none it arms the queue's notification and polls once more, so a
// completion that arrives later raises an event on evfd. Returns the
// number of completions, 0 if the caller should wait for evfd, or
// -errno.
static int ntv_poll(struct ntv_conn *c, struct ntv_wc *out, int max) {
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	while (ibv_get_cq_event(c->ch, &ev_cq, &ev_ctx) == 0)
		ibv_ack_cq_events(ev_cq, 1);
	if (max > 64)
		max = 64;
	int n = ibv_poll_cq(c->cq, max, c->wc);
	if (n == 0) {
		int err = ibv_req_notify_cq(c->cq, 0);
		if (err)
			return -err;
		n = ibv_poll_cq(c->cq, max, c->wc);
	}
	if (n < 0)
		return -EIO;
	for (int i = 0; i < n; i++) {
		struct ibv_wc *w = &c->wc[i];
		out[i].wr_id = w->wr_id;
		out[i].status = w->status;
		out[i].vendor_err = w->vendor_err;
		out[i].recv = w->wr_id == NTV_RECV_ID;
		out[i].with_imm = (w->wc_flags & IBV_WC_WITH_IMM) != 0;
		out[i].imm = out[i].with_imm ? ntohl(w->imm_data) : 0;
		out[i].byte_len = w->byte_len;
	}
	return n;
}

static const char *ntv_status_str(uint32_t s) { return ibv_wc_status_str((enum ibv_wc_status)s); }
static uint64_t ntv_addr(char *p) { return (uint64_t)(uintptr_t)p; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// VerbsBuilt reports whether this build has the verbs provider.
const VerbsBuilt = true

const (
	sysInfiniband = "/sys/class/infiniband"
	// poolMax rings pairs are kept registered for later connections.
	poolMax = 8
)

// verbsAvailable opens the configured device and checks its port.
func verbsAvailable(cfg Config) error {
	ents, err := os.ReadDir(sysInfiniband)
	if err != nil || len(ents) == 0 {
		return fmt.Errorf("verbs provider: no RDMA device in %s (load a driver; for Soft-RoCE: modprobe rdma_rxe, rdma link add rxe0 type rxe netdev <if>): %w", sysInfiniband, ErrNotSupported)
	}
	d, err := openDevice(cfg)
	if err != nil {
		return err
	}
	return d.unref()
}

// device is an opened verbs device shared by a provider's connections:
// one reference for the provider, one per connection (or handshake).
type device struct {
	d        *C.struct_ntv_dev
	name     string
	ringSize uint64
	grh      bool

	mu sync.Mutex
	// mu protects the following fields.
	refs int
	pool []*C.struct_ntv_bufs
}

// openDevice opens cfg's device and picks its GID; the caller holds the
// one reference.
func openDevice(cfg Config) (*device, error) {
	name := C.CString(cfg.Device)
	defer C.ntv_free_str(name)
	var d *C.struct_ntv_dev
	if rc := C.ntv_open(name, C.int(cfg.Port), &d); rc != 0 {
		err := fmt.Errorf("verbs provider: open device %q port %d: %w", cfg.Device, cfg.Port, syscall.Errno(rc))
		if rc == C.ENODEV || rc == C.EINVAL {
			err = fmt.Errorf("%w: %w", err, ErrNotSupported)
		}
		return nil, err
	}
	dev := &device{d: d, name: cfg.Device, ringSize: uint64(cfg.RingSize), refs: 1}
	if d.state != C.IBV_PORT_ACTIVE {
		dev.unref()
		return nil, fmt.Errorf("verbs provider: device %q port %d is not active (state %d): %w", cfg.Device, cfg.Port, d.state, ErrNotSupported)
	}
	var want [16]byte
	if cfg.SGID != nil {
		ip := cfg.SGID.To16()
		if ip == nil {
			dev.unref()
			return nil, fmt.Errorf("verbs provider: SGID %v is not an IP address", cfg.SGID)
		}
		copy(want[:], ip)
	}
	wantSet := C.int(0)
	if cfg.SGID != nil {
		wantSet = 1
	}
	if rc := C.ntv_pick_gid(d, (*C.uint8_t)(&want[0]), wantSet); rc != 0 {
		if d.link_layer == C.IBV_LINK_LAYER_ETHERNET || cfg.SGID != nil {
			dev.unref()
			return nil, fmt.Errorf("verbs provider: device %q port %d: no usable GID (SGID %v; does the interface have an address?): %w", cfg.Device, cfg.Port, cfg.SGID, ErrNotSupported)
		}
	}
	dev.grh = d.link_layer == C.IBV_LINK_LAYER_ETHERNET || cfg.SGID != nil
	return dev, nil
}

func (d *device) ref() {
	d.mu.Lock()
	d.refs++
	d.mu.Unlock()
}

// unref drops a reference; the last closes the device.
func (d *device) unref() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.refs--
	if d.refs > 0 {
		return nil
	}
	for _, b := range d.pool {
		C.ntv_bufs_free(b)
	}
	d.pool = nil
	if rc := C.ntv_close(d.d); rc != 0 {
		return fmt.Errorf("close verbs device %q: %w", d.name, syscall.Errno(rc))
	}
	return nil
}

// getBufs takes a registered ring pair from the pool, or registers one.
func (d *device) getBufs() (*C.struct_ntv_bufs, error) {
	d.mu.Lock()
	if n := len(d.pool); n > 0 {
		b := d.pool[n-1]
		d.pool = d.pool[:n-1]
		d.mu.Unlock()
		return b, nil
	}
	d.mu.Unlock()
	var b *C.struct_ntv_bufs
	if rc := C.ntv_bufs_new(d.d, C.uint64_t(d.ringSize), &b); rc != 0 {
		return nil, fmt.Errorf("register %d-byte rings: %w", d.ringSize, syscall.Errno(rc))
	}
	return b, nil
}

// putBufs returns a ring pair whose queue pair is destroyed (no NIC
// access remains) to the pool.
func (d *device) putBufs(b *C.struct_ntv_bufs) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.pool) < poolMax {
		d.pool = append(d.pool, b)
		return
	}
	C.ntv_bufs_free(b)
}

// connect builds a connection's queue pair and runs the handshake on
// side (hello.go). It consumes the caller's device reference: the
// returned link holds it, and on failure it is dropped (by the link's
// close once the link exists).
func (d *device) connect(ctx context.Context, side net.Conn, cfg Config) (link, error) {
	bufs, err := d.getBufs()
	if err != nil {
		d.unref()
		return nil, err
	}
	var c *C.struct_ntv_conn
	var step C.int
	if rc := C.ntv_conn_new(d.d, bufs, sqDepth, rqDepth, &c, &step); rc != 0 {
		d.putBufs(bufs)
		d.unref()
		return nil, fmt.Errorf("create queue pair (step %d): %w", step, syscall.Errno(rc))
	}
	l := &verbsLink{dev: d, c: c, bufs: bufs, wcs: make([]C.struct_ntv_wc, pollBatch)}
	l.tx = cBytes(bufs.tx, int(bufs.size))
	l.rx = cBytes(bufs.rx, int(bufs.size))
	l.ev = os.NewFile(uintptr(c.evfd), "ibv-comp-channel")
	ok := false
	defer func() {
		if !ok {
			l.close()
		}
	}()
	if l.raw, err = l.ev.SyscallConn(); err != nil {
		return nil, fmt.Errorf("completion channel: %w", err)
	}

	psn := rand.Uint32N(maxPSN + 1)
	ours := hello{
		provider: provVerbs,
		ringSize: uint64(bufs.size),
		ringAddr: uint64(C.ntv_addr(bufs.rx)),
		rkey:     uint32(bufs.rxmr.rkey),
		qpn:      uint32(c.qp.qp_num),
		psn:      psn,
		lid:      uint16(d.d.lid),
		mtu:      byte(d.d.mtu),
		grh:      d.grh,
	}
	for i := range ours.gid {
		ours.gid[i] = byte(d.d.gid[i])
	}
	peer, err := exchangeHello(ctx, side, ours)
	if err != nil {
		return nil, err
	}
	if peer.ringSize != ours.ringSize {
		return nil, fmt.Errorf("peer's ring is %d bytes, ours %d (Config.RingSize must agree): %w", peer.ringSize, ours.ringSize, ErrProviderMismatch)
	}
	grh := C.int(0)
	if d.grh || peer.grh {
		grh = 1
	}
	if rc := C.ntv_conn_connect(c, C.uint32_t(peer.qpn), C.uint32_t(peer.psn), C.uint32_t(psn), C.uint16_t(peer.lid),
		C.uint8_t(min(peer.mtu, ours.mtu)), grh, (*C.uint8_t)(&peer.gid[0]), C.uint64_t(peer.ringAddr),
		C.uint32_t(peer.rkey), C.uint8_t(ackTimeoutExp(cfg.AckTimeout)), &step); rc != 0 {
		return nil, fmt.Errorf("connect queue pair to %#x (step %d, RTR then RTS): %w", peer.qpn, step, syscall.Errno(rc))
	}
	// Both queue pairs must be ready to receive before either writes.
	err = withDeadline(ctx, side, func() error {
		if _, err := side.Write(ctlMsg{typ: ctlReady}.marshal()); err != nil {
			return fmt.Errorf("send ready: %w", err)
		}
		b := make([]byte, ctlSize)
		if _, err := io.ReadFull(side, b); err != nil {
			return fmt.Errorf("read ready: %w", err)
		}
		m, err := parseCtl(b)
		if err == nil && m.typ != ctlReady {
			err = fmt.Errorf("control message %d during setup: %w", m.typ, errProtocol)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	ok = true
	return l, nil
}

// ackTimeoutExp converts a timeout to the queue pair's exponent n,
// 4.096 µs × 2^n ≥ t.
func ackTimeoutExp(t time.Duration) int {
	units := uint64((t + 4096*time.Nanosecond - 1) / (4096 * time.Nanosecond))
	if units <= 1 {
		return 1
	}
	return min(bits.Len64(units-1), 31)
}

// verbsLink is the link over one queue pair.
type verbsLink struct {
	dev    *device
	c      *C.struct_ntv_conn
	bufs   *C.struct_ntv_bufs
	tx, rx []byte // views of bufs' C memory; valid until close
	ev     *os.File
	raw    syscall.RawConn

	closed atomic.Bool
	opMu   sync.Mutex // held by every call into the queue pair; close takes it to end them
	pollMu sync.Mutex // held by poll; close takes it to wait for poll's end
	wcs    []C.struct_ntv_wc
	once   sync.Once
	err    error
}

var _ link = (*verbsLink)(nil)

func (l *verbsLink) txBuf() []byte { return l.tx }
func (l *verbsLink) rxBuf() []byte { return l.rx }

func (l *verbsLink) write(id, off, n uint64, imm uint32) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if l.closed.Load() {
		return net.ErrClosed
	}
	if rc := C.ntv_write(l.c, C.uint64_t(id), C.uint64_t(off), C.uint32_t(n), C.uint32_t(imm)); rc != 0 {
		return fmt.Errorf("ibv_post_send: %w", syscall.Errno(rc))
	}
	return nil
}

func (l *verbsLink) postRecv(n int) error {
	l.opMu.Lock()
	defer l.opMu.Unlock()
	if l.closed.Load() {
		return net.ErrClosed
	}
	if rc := C.ntv_post_recv(l.c, C.int(n)); rc != 0 {
		return fmt.Errorf("ibv_post_recv: %w", syscall.Errno(rc))
	}
	return nil
}

// wcError is a failed work completion.
type wcError struct {
	status, vendor uint32
}

func (e *wcError) Error() string {
	return fmt.Sprintf("work completion: %s (status %d, vendor error %#x)", C.GoString(C.ntv_status_str(C.uint32_t(e.status))), e.status, e.vendor)
}

// poll waits on the completion channel in Go's poller (no thread blocks
// in C) and converts one batch.
func (l *verbsLink) poll(cs []completion) (int, error) {
	l.pollMu.Lock()
	defer l.pollMu.Unlock()
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	max := min(len(cs), len(l.wcs))
	n := 0
	var perr error
	err := l.raw.Read(func(uintptr) bool {
		rc := C.ntv_poll(l.c, &l.wcs[0], C.int(max))
		switch {
		case rc < 0:
			perr = fmt.Errorf("poll completion queue: %w", syscall.Errno(-rc))
			return true
		case rc == 0:
			return false // armed: wait for the channel's event
		}
		n = int(rc)
		return true
	})
	if err != nil {
		if l.closed.Load() || errors.Is(err, os.ErrClosed) {
			return 0, net.ErrClosed
		}
		return 0, fmt.Errorf("wait for completions: %w", err)
	}
	if perr != nil {
		return 0, perr
	}
	for i := range n {
		w := &l.wcs[i]
		c := completion{recv: w.recv != 0, id: uint64(w.wr_id), imm: uint32(w.imm)}
		switch {
		case w.status != C.IBV_WC_SUCCESS:
			c.err = &wcError{status: uint32(w.status), vendor: uint32(w.vendor_err)}
		case c.recv && w.with_imm == 0:
			c.err = fmt.Errorf("receive without an immediate: %w", errProtocol)
		}
		cs[i] = c
	}
	return n, nil
}

// close ends poll, destroys the queue pair, returns the rings to the
// device's pool and drops the device reference.
func (l *verbsLink) close() error {
	l.once.Do(func() {
		l.opMu.Lock()
		l.closed.Store(true)
		l.opMu.Unlock()
		errs := []error{l.ev.Close()} // wakes poll
		l.pollMu.Lock()
		defer l.pollMu.Unlock()
		if rc := C.ntv_conn_destroy(l.c); rc != 0 {
			errs = append(errs, fmt.Errorf("destroy queue pair: %w", syscall.Errno(rc)))
			// The NIC may still own the rings: leak them rather than reuse.
		} else {
			l.dev.putBufs(l.bufs)
		}
		l.tx, l.rx = nil, nil
		errs = append(errs, l.dev.unref())
		l.err = errors.Join(errs...)
	})
	return l.err
}
