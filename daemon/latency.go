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
// it. Close stops it before unmounting: its descriptors keep the mount
// busy.
func (n *Node) startAccessLog() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	dir := filepath.Join(n.cfg.Mountpoint, n.cfg.FUSE.ControlName)
	dirFd := -1 // the control directory, held so that a poll costs no lookup
	open := func() (io.WriteCloser, error) {
		if dirFd < 0 {
			fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, &os.PathError{Op: "open", Path: dir, Err: err}
			}
			dirFd = fd
		}
		fd, err := unix.Openat(dirFd, accessLogName, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &os.PathError{Op: "open", Path: filepath.Join(dir, accessLogName), Err: err}
		}
		return os.NewFile(uintptr(fd), accessLogName), nil
	}
	// The daemon's own requests to its mount are served by itself: one in
	// flight when the process is killed (SIGKILL, the OOM killer) never
	// gets its answer, and the kernel then keeps the dying process, and
	// its mount, for ever. So the lookups happen here, before the mount is
	// announced: the control directory is held open, and the pipe's entry
	// stays in the kernel's cache (for Config.TTL), so the polls below
	// send no request.
	if w, err := open(); err == nil {
		w.Close() // a reader already: Run opens it again
	} else if !errors.Is(err, unix.ENXIO) { // ENXIO: nobody reads it yet
		n.log.Debug("access log: first open", "err", err)
	}
	go func() {
		defer close(done)
		n.alog.Run(ctx, open)
		if dirFd >= 0 {
			_ = unix.Close(dirFd)
		}
	}()
	n.closing.stopAccessLog = func() { cancel(); <-done }
}
