package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/cluster/peer"
	"github.com/dlfs/dlfs/integrity"
	"github.com/dlfs/dlfs/source"
)

// The sealing suite measures what TLS costs the peer transport: 1 MiB
// blocks fetched over loopback from a peer.Server, against the same bytes
// in length-prefixed frames over a bare TCP connection, in one run.

const sealBlock = 1 << 20

// blockSource serves one block of sealBlock bytes for every item.
type blockSource struct{ data []byte }

func (s blockSource) Block(it peer.Item) ([]byte, uint32, byte) {
	return s.data, integrity.Sum(it.Tag, s.data), peer.StatusOK
}
func (s blockSource) Cached(it peer.Item) ([]byte, uint32, byte) { return s.Block(it) }

// cpuSeconds is this process's user and system time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func runSealing(o options) error {
	const total = 2 << 30 // bytes moved per configuration
	data := make([]byte, sealBlock)
	for i := range data {
		data[i] = byte(i * 7)
	}
	fmt.Fprintln(os.Stderr, "measuring: the peer transport, sealed and bare")
	key := []byte("dlfsbench-sealing-key-0123456789")
	srv, err := peer.Listen("127.0.0.1:0", key, blockSource{data}, nil)
	if err != nil {
		return err
	}
	defer srv.Close()
	cl, err := peer.NewClient(key)
	if err != nil {
		return err
	}
	defer cl.Close()
	tag := integrity.Tag(1, "x\x000", source.Version{Size: sealBlock})
	items := make([]peer.Item, 8) // 8 MiB a request, as a batch of 8 blocks
	for i := range items {
		items[i] = peer.Item{Path: "x", Tag: tag}
	}
	sealed := func() (float64, float64, error) {
		cpu0, t0 := cpuSeconds(), time.Now()
		for moved := 0; moved < total; moved += len(items) * sealBlock {
			res, err := cl.Fetch(context.Background(), srv.Addr(), items)
			if err != nil {
				return 0, 0, err
			}
			for _, r := range res {
				if !integrity.Check(tag, r.Sum, r.Data) {
					return 0, 0, fmt.Errorf("a block failed its sum")
				}
			}
		}
		return time.Since(t0).Seconds(), cpuSeconds() - cpu0, nil
	}
	bare := func() (float64, float64, error) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			r := bufio.NewReader(c)
			req := make([]byte, 4)
			frame := make([]byte, 4+len(items)*(9+sealBlock))
			binary.BigEndian.PutUint32(frame, uint32(len(frame)-4))
			for {
				if _, err := io.ReadFull(r, req); err != nil {
					return
				}
				off := 4
				for range items {
					off += 9
					off += copy(frame[off:], data)
				}
				if _, err := c.Write(frame); err != nil {
					return
				}
			}
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return 0, 0, err
		}
		defer c.Close()
		r := bufio.NewReader(c)
		var hdr [4]byte
		cpu0, t0 := cpuSeconds(), time.Now()
		for moved := 0; moved < total; moved += len(items) * sealBlock {
			if _, err := c.Write([]byte{0, 0, 0, 0}); err != nil {
				return 0, 0, err
			}
			if _, err := io.ReadFull(r, hdr[:]); err != nil {
				return 0, 0, err
			}
			buf := make([]byte, binary.BigEndian.Uint32(hdr[:]))
			if _, err := io.ReadFull(r, buf); err != nil {
				return 0, 0, err
			}
			for i := range items { // the sums are checked on either path
				integrity.Check(tag, 0, buf[i*(9+sealBlock)+9:][:sealBlock])
			}
		}
		return time.Since(t0).Seconds(), cpuSeconds() - cpu0, nil
	}
	bs, bc, err := bare()
	if err != nil {
		return err
	}
	ss, sc, err := sealed()
	if err != nil {
		return err
	}
	gb := float64(total) / 1e9
	fmt.Printf("\n## Peer transport: what sealing costs\n\n")
	fmt.Printf("%.1f GB in 1 MiB blocks, 8 to a request, over loopback, client and server in one process: "+
		"the peer transport (TLS 1.3, AES-GCM) against the same frames over bare TCP. CPU is both ends together; "+
		"both check every block's sum.\n\n", gb)
	fmt.Println("| transport | seconds | MB/s | CPU s per GB | × bare MB/s |")
	fmt.Println("|---|---:|---:|---:|---:|")
	fmt.Printf("| bare TCP frames | %.2f | %.0f | %.2f | 1.00 |\n", bs, float64(total)/1e6/bs, bc/gb)
	fmt.Printf("| sealed (TLS 1.3) | %.2f | %.0f | %.2f | %.2f |\n", ss, float64(total)/1e6/ss, sc/gb, bs/ss)
	fmt.Printf("\n- sealing costs %.2f CPU s per GB moved between nodes (%.2f sealed against %.2f bare)\n", sc/gb-bc/gb, sc/gb, bc/gb)
	return nil
}
