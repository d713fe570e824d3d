package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/dlfs/dlfs/latency"
)

// latencies are the node's latency histograms (package latency); all nil
// with Config.NoLatency.
type latencies struct {
	read *latency.Vec // reads served, by the tier that served them
	fuse *latency.Vec // FUSE requests, by operation
	peer *latency.Vec // requests to peers, by member
}

// maxPeerLabels bounds the members the peer histogram names; beyond, they
// count under "other".
const maxPeerLabels = 2048

func newLatencies(reg prometheus.Registerer) (latencies, error) {
	l := latencies{
		read: latency.NewVec("dlfs_read_duration_seconds", "Reads served through the mount, by the tier that served them (ram, stage, ssd, peer, moved, pfs).", "source", 0),
		fuse: latency.NewVec("dlfs_fuse_request_duration_seconds", "FUSE requests, by operation.", "op", 0),
		peer: latency.NewVec("dlfs_peer_request_duration_seconds", "Requests to peers for blocks, by member.", "member", maxPeerLabels),
	}
	for _, c := range []prometheus.Collector{l.read, l.fuse, l.peer} {
		if err := reg.Register(c); err != nil {
			return latencies{}, fmt.Errorf("register latency histograms: %w", err)
		}
	}
	return l, nil
}

// LatencyStats are the histograms as .dlfs/stats shows them, in seconds:
// reads by source, FUSE requests by operation, peer requests by member.
type LatencyStats struct {
	Read map[string]latency.Summary `json:"read"`
	FUSE map[string]latency.Summary `json:"fuse"`
	Peer map[string]latency.Summary `json:"peer"`
}

func (l latencies) stats() *LatencyStats {
	if l.read == nil {
		return nil
	}
	return &LatencyStats{Read: l.read.Summaries(), FUSE: l.fuse.Summaries(), Peer: l.peer.Summaries()}
}

// accessLogName is the access log's name in the control directory.
const accessLogName = "accesslog"

// startAccessLog runs the access log's writer (package accesslog), which
// opens the pipe .dlfs/accesslog through the mount when a reader waits on
// it. While nobody reads, it holds nothing open inside the mount, so that
// an idle mount can be unmounted (dlfs umount, umount, fusermount -u):
// each poll opens the pipe by its path. Close stops it before unmounting:
// while a reader is attached, the pipe's write end keeps the mount busy.
func (n *Node) startAccessLog() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	pipe := filepath.Join(n.cfg.Mountpoint, n.cfg.ControlName, accessLogName)
	open := func() (io.WriteCloser, error) {
		fd, err := unix.Open(pipe, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: pipe, Err: err}
		}
		return os.NewFile(uintptr(fd), accessLogName), nil
	}
	// The daemon's own requests to its mount are served by itself: one in
	// flight when the process is killed (SIGKILL, the OOM killer) never
	// gets its answer, and the kernel then keeps the dying process, and
	// its mount, for ever. So the lookups happen here, before the mount is
	// announced: the control directory's entry and the pipe's stay in the
	// kernel's cache, with their attributes (for Config.TTL; package
	// fusefs), so the polls below walk the path with no request.
	if w, err := open(); err == nil {
		w.Close() // a reader already: Run opens it again
	} else if !errors.Is(err, unix.ENXIO) { // ENXIO: nobody reads it yet
		n.log.Debug("access log: first open", "err", err)
	}
	go func() {
		defer close(done)
		n.alog.Run(ctx, open)
	}()
	n.closing.stopAccessLog = func() { cancel(); <-done }
}
