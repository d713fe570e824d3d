package peer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Message types: the first byte of every frame.
const (
	msgRequest  = 0x10 // client: request id, items
	msgResponse = 0x11 // server: request id, results
	msgCached   = 0x12 // client: request id, items, to be served from caches only
)

// Limits that bound what a peer can make us allocate.
const (
	MaxFrame         = 64 << 20 // bytes in one frame
	MaxItems         = 1024     // items in one request
	MaxResponseBytes = 32 << 20 // block bytes in one response; StatusError past it
	maxPathLen       = 4096
)

// ErrWire wraps every malformed-message error.
var ErrWire = errors.New("peer: malformed message")

// Item names one block of a dataset file.
type Item struct {
	Path  string // relative to SOURCE
	Block int64
	Tag   uint64 // the asker's integrity tag for the block: another is "missing"
}

// Status of one item in a response.
const (
	StatusOK      = 0
	StatusMissing = 1 // no such file in the owner's catalog, or another version
	StatusError   = 2 // the owner could not read it
)

// Result is the answer for one item.
type Result struct {
	Status byte
	Sum    uint32 // integrity sum of Data under the item's tag
	Data   []byte
}

// writeFrame writes a length-prefixed frame.
func writeFrame(w io.Writer, payload []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(payload)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(payload)
	return err
}

// readFrame reads one frame, refusing frames over MaxFrame.
func readFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n == 0 || n > MaxFrame {
		return nil, fmt.Errorf("%w: frame of %d bytes", ErrWire, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, err
	}
	return b, nil
}

// encodeRequest builds a request frame payload. A cached request asks for
// blocks the peer holds in its caches only: it never reads the PFS or
// another peer for it.
func encodeRequest(id uint32, items []Item, cached bool) []byte {
	b := []byte{msgRequest}
	if cached {
		b[0] = msgCached
	}
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint16(b, uint16(len(items)))
	for _, it := range items {
		b = binary.BigEndian.AppendUint16(b, uint16(len(it.Path)))
		b = append(b, it.Path...)
		b = binary.BigEndian.AppendUint64(b, uint64(it.Block))
		b = binary.BigEndian.AppendUint64(b, it.Tag)
	}
	return b
}

// decodeRequest parses a request payload, and reports whether it is a
// cached request. It never panics.
func decodeRequest(b []byte) (uint32, []Item, bool, error) {
	d := decoder{b: b}
	t := d.u8()
	if t != msgRequest && t != msgCached {
		return 0, nil, false, fmt.Errorf("%w: not a request", ErrWire)
	}
	cached := t == msgCached
	id := d.u32()
	n := int(d.u16())
	if n > MaxItems {
		return 0, nil, false, fmt.Errorf("%w: %d items, at most %d", ErrWire, n, MaxItems)
	}
	items := make([]Item, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		l := int(d.u16())
		if l > maxPathLen {
			return 0, nil, false, fmt.Errorf("%w: path of %d bytes", ErrWire, l)
		}
		it := Item{Path: string(d.bytes(l))}
		it.Block, it.Tag = int64(d.u64()), d.u64()
		if it.Block < 0 {
			return 0, nil, false, fmt.Errorf("%w: negative block", ErrWire)
		}
		items = append(items, it)
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrWire, len(d.b))
	}
	return id, items, cached, d.err
}

// encodeResponse builds a response frame payload.
func encodeResponse(id uint32, results []Result) []byte {
	size := 7
	for _, r := range results {
		size += 9 + len(r.Data)
	}
	b := make([]byte, 0, size)
	b = append(b, msgResponse)
	b = binary.BigEndian.AppendUint32(b, id)
	b = binary.BigEndian.AppendUint16(b, uint16(len(results)))
	for _, r := range results {
		b = append(b, r.Status)
		b = binary.BigEndian.AppendUint32(b, r.Sum)
		b = binary.BigEndian.AppendUint32(b, uint32(len(r.Data)))
		b = append(b, r.Data...)
	}
	return b
}

// decodeResponse parses a response payload. Data slices alias b.
func decodeResponse(b []byte) (uint32, []Result, error) {
	d := decoder{b: b}
	if d.u8() != msgResponse {
		return 0, nil, fmt.Errorf("%w: not a response", ErrWire)
	}
	id := d.u32()
	n := int(d.u16())
	if n > MaxItems {
		return 0, nil, fmt.Errorf("%w: %d results", ErrWire, n)
	}
	out := make([]Result, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		st := d.u8()
		sum := d.u32()
		l := int(d.u32())
		if st > StatusError {
			return 0, nil, fmt.Errorf("%w: status %d", ErrWire, st)
		}
		out = append(out, Result{Status: st, Sum: sum, Data: d.bytes(l)})
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrWire, len(d.b))
	}
	return id, out, d.err
}

// decoder reads big-endian fields; the first short read sets err and makes
// every later read return zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || n < 0 || n > len(d.b) {
		if d.err == nil {
			d.err = fmt.Errorf("%w: truncated", ErrWire)
		}
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() byte {
	if v := d.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if v := d.take(2); v != nil {
		return binary.BigEndian.Uint16(v)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if v := d.take(4); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if v := d.take(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) bytes(n int) []byte { return d.take(n) }
