package peer

// Unit tests of the wire format's bounds, each at its exact value and one
// past it: the fuzzers (FuzzDecodeRequest, FuzzDecodeResponse) do not run
// under go test, and rarely reach a limit exactly.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
)

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func frameHeader(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }

func TestFrameBounds(t *testing.T) {
	// A frame of exactly MaxFrame bytes is read whole.
	b, err := readFrame(io.MultiReader(bytes.NewReader(frameHeader(MaxFrame)), io.LimitReader(zeros{}, MaxFrame)))
	if err != nil || len(b) != MaxFrame {
		t.Fatalf("frame of MaxFrame bytes: %d bytes, %v", len(b), err)
	}
	for _, n := range []uint32{0, MaxFrame + 1, math.MaxUint32} {
		// The body is never read (or allocated): the reader would give it.
		_, err := readFrame(io.MultiReader(bytes.NewReader(frameHeader(n)), zeros{}))
		if !errors.Is(err, ErrWire) {
			t.Errorf("frame of %d bytes: %v, want ErrWire", n, err)
		}
	}
	// Short headers and bodies.
	if _, err := readFrame(bytes.NewReader(nil)); err != io.EOF {
		t.Errorf("no header: %v, want EOF", err)
	}
	if _, err := readFrame(bytes.NewReader([]byte{0, 0, 1})); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("3-byte header: %v, want ErrUnexpectedEOF", err)
	}
	if _, err := readFrame(bytes.NewReader(append(frameHeader(5), "abcd"...))); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("body one byte short: %v, want ErrUnexpectedEOF", err)
	}
	// What writeFrame writes, readFrame reads, twice in a row.
	var buf bytes.Buffer
	for _, p := range []string{"x", "hello, peer"} {
		if err := writeFrame(&buf, []byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if buf.Len() != 4+1+4+11 {
		t.Fatalf("two frames took %d bytes, want 20", buf.Len())
	}
	for _, want := range []string{"x", "hello, peer"} {
		got, err := readFrame(&buf)
		if err != nil || string(got) != want {
			t.Fatalf("readFrame = %q, %v; want %q", got, err, want)
		}
	}
}

// failWriter fails its n-th write.
type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n--; w.n == 0 {
		return 0, errors.New("write failed")
	}
	return len(p), nil
}

func TestWriteFrameErrors(t *testing.T) {
	for n := 1; n <= 2; n++ {
		if err := writeFrame(&failWriter{n: n}, []byte("abc")); err == nil {
			t.Errorf("write %d failing: no error", n)
		}
	}
}

func TestRequestRoundTrip(t *testing.T) {
	items := []Item{{Path: "a/b.jpg", Block: 0, Tag: 1}, {Path: "", Block: math.MaxInt64, Tag: math.MaxUint64}, {Path: strings.Repeat("p", maxPathLen), Block: 7, Tag: 0}}
	for _, cached := range []bool{false, true} {
		b := encodeRequest(0xdeadbeef, items, cached)
		id, got, c, err := decodeRequest(b)
		if err != nil || id != 0xdeadbeef || c != cached || len(got) != len(items) {
			t.Fatalf("cached=%v: id %#x, %d items, cached %v, %v", cached, id, len(got), c, err)
		}
		for i := range items {
			if got[i] != items[i] {
				t.Errorf("item %d: %+v, want %+v", i, got[i], items[i])
			}
		}
	}
}

// wireRequest builds a request payload by hand: n as the item count, then the
// items as given.
func wireRequest(n uint16, items ...[]byte) []byte {
	b := []byte{msgRequest, 0, 0, 0, 9}
	b = binary.BigEndian.AppendUint16(b, n)
	for _, it := range items {
		b = append(b, it...)
	}
	return b
}

// wireItem encodes one item with a path of pathLen bytes (the length field
// says declared).
func wireItem(declared uint16, pathLen int, block int64) []byte {
	b := binary.BigEndian.AppendUint16(nil, declared)
	b = append(b, strings.Repeat("x", pathLen)...)
	b = binary.BigEndian.AppendUint64(b, uint64(block))
	return binary.BigEndian.AppendUint64(b, 42)
}

func TestDecodeRequestBounds(t *testing.T) {
	many := make([][]byte, MaxItems)
	for i := range many {
		many[i] = wireItem(1, 1, int64(i))
	}
	ok := map[string][]byte{
		"no items":                  wireRequest(0),
		"MaxItems items":            wireRequest(MaxItems, many...),
		"path of maxPathLen":        wireRequest(1, wireItem(maxPathLen, maxPathLen, 0)),
		"block MaxInt64":            wireRequest(1, wireItem(1, 1, math.MaxInt64)),
		"cached":                    append([]byte{msgCached}, wireRequest(0)[1:]...),
		"an empty path, block zero": wireRequest(1, wireItem(0, 0, 0)),
	}
	for name, b := range ok {
		if _, _, _, err := decodeRequest(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	_, items, _, _ := decodeRequest(ok["MaxItems items"])
	if len(items) != MaxItems || items[MaxItems-1].Block != MaxItems-1 {
		t.Errorf("MaxItems items: decoded %d", len(items))
	}
	bad := map[string][]byte{
		"empty":                 nil,
		"a response":            append([]byte{msgResponse}, wireRequest(0)[1:]...),
		"type 0":                append([]byte{0}, wireRequest(0)[1:]...),
		"MaxItems+1 items":      wireRequest(MaxItems+1, append(many, wireItem(1, 1, 0))...),
		"path over maxPathLen":  wireRequest(1, wireItem(maxPathLen+1, maxPathLen+1, 0)),
		"negative block":        wireRequest(1, wireItem(1, 1, -1)),
		"most negative block":   wireRequest(1, wireItem(1, 1, math.MinInt64)),
		"trailing byte":         append(wireRequest(0), 0),
		"trailing after item":   append(wireRequest(1, wireItem(1, 1, 0)), 0),
		"fewer items than said": wireRequest(2, wireItem(1, 1, 0)),
		"path longer than left": wireRequest(1, wireItem(9, 1, 0)[:3]),
		"no count":              []byte{msgRequest, 0, 0, 0, 1},
	}
	for name, b := range bad {
		if _, _, _, err := decodeRequest(b); !errors.Is(err, ErrWire) {
			t.Errorf("%s: %v, want ErrWire", name, err)
		}
	}
	// Every strict prefix of a good request is refused, never a panic.
	good := encodeRequest(3, []Item{{Path: "ab", Block: 1, Tag: 2}, {Path: "c", Block: 3, Tag: 4}}, false)
	for i := 0; i < len(good); i++ {
		if _, _, _, err := decodeRequest(good[:i]); !errors.Is(err, ErrWire) {
			t.Errorf("prefix of %d bytes: %v, want ErrWire", i, err)
		}
	}
}

func TestResponseRoundTrip(t *testing.T) {
	res := []Result{{Status: StatusOK, Sum: 0xfeedface, Data: []byte("block bytes")}, {Status: StatusMissing}, {Status: StatusError, Sum: 1}}
	b := encodeResponse(77, res)
	if len(b) != 7+3*9+len("block bytes") {
		t.Fatalf("encoded %d bytes", len(b))
	}
	id, got, err := decodeResponse(b)
	if err != nil || id != 77 || len(got) != len(res) {
		t.Fatalf("id %d, %d results, %v", id, len(got), err)
	}
	for i := range res {
		if got[i].Status != res[i].Status || got[i].Sum != res[i].Sum || !bytes.Equal(got[i].Data, res[i].Data) {
			t.Errorf("result %d: %+v, want %+v", i, got[i], res[i])
		}
	}
	// Data aliases the payload: no copy per block.
	b[len(b)-1-2*9] ^= 0xff
	if got[0].Data[len(got[0].Data)-1] == 's' {
		t.Error("Data does not alias the payload")
	}
}

// wireResponse builds a response payload by hand.
func wireResponse(n uint16, results ...[]byte) []byte {
	b := []byte{msgResponse, 0, 0, 0, 5}
	b = binary.BigEndian.AppendUint16(b, n)
	for _, r := range results {
		b = append(b, r...)
	}
	return b
}

// wireResult encodes one result whose length field says declared.
func wireResult(status byte, declared uint32, data string) []byte {
	b := []byte{status, 0, 0, 0, 1}
	b = binary.BigEndian.AppendUint32(b, declared)
	return append(b, data...)
}

func TestDecodeResponseBounds(t *testing.T) {
	many := make([][]byte, MaxItems)
	for i := range many {
		many[i] = wireResult(StatusMissing, 0, "")
	}
	ok := map[string][]byte{
		"no results":       wireResponse(0),
		"MaxItems results": wireResponse(MaxItems, many...),
		"each status":      wireResponse(3, wireResult(StatusOK, 2, "ab"), wireResult(StatusMissing, 0, ""), wireResult(StatusError, 0, "")),
	}
	for name, b := range ok {
		if _, _, err := decodeResponse(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	bad := map[string][]byte{
		"empty":                   nil,
		"a request":               append([]byte{msgRequest}, wireResponse(0)[1:]...),
		"MaxItems+1 results":      wireResponse(MaxItems+1, append(many, wireResult(StatusMissing, 0, ""))...),
		"status past StatusError": wireResponse(1, wireResult(StatusError+1, 0, "")),
		"status 255":              wireResponse(1, wireResult(255, 0, "")),
		"data longer than left":   wireResponse(1, wireResult(StatusOK, 5, "abcd")),
		"data length 2^32-1":      wireResponse(1, wireResult(StatusOK, math.MaxUint32, "abcd")),
		"trailing byte":           append(wireResponse(1, wireResult(StatusOK, 1, "a")), 0),
		"fewer results than said": wireResponse(2, wireResult(StatusOK, 1, "a")),
	}
	for name, b := range bad {
		if _, _, err := decodeResponse(b); !errors.Is(err, ErrWire) {
			t.Errorf("%s: %v, want ErrWire", name, err)
		}
	}
	good := encodeResponse(1, []Result{{Status: StatusOK, Sum: 2, Data: []byte("xyz")}, {Status: StatusMissing}})
	for i := 0; i < len(good); i++ {
		if _, _, err := decodeResponse(good[:i]); !errors.Is(err, ErrWire) {
			t.Errorf("prefix of %d bytes: %v, want ErrWire", i, err)
		}
	}
}

// TestDecoderStopsAtFirstShortRead: after a short read, every later read
// returns zero and the first error stays.
func TestDecoderStopsAtFirstShortRead(t *testing.T) {
	d := decoder{b: []byte{1, 2, 3}}
	if d.u16() != 0x0102 || d.err != nil {
		t.Fatal("u16 of the first two bytes")
	}
	if d.u32() != 0 || !errors.Is(d.err, ErrWire) {
		t.Fatalf("u32 of one byte left: err %v", d.err)
	}
	first := d.err
	if d.u8() != 0 || d.u64() != 0 || d.bytes(0) != nil || d.err != first {
		t.Fatal("reads after a short read returned data or replaced the error")
	}
	if (&decoder{b: []byte{1}}).take(-1) != nil {
		t.Fatal("take(-1) returned bytes")
	}
	e := decoder{b: []byte{1, 2, 3, 4, 5, 6, 7, 8}}
	if e.u64() != 0x0102030405060708 || len(e.b) != 0 || e.err != nil {
		t.Fatal("u64 of exactly eight bytes")
	}
}
