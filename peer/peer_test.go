package peer

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// mapSource serves blocks from a map keyed by path, with identity checks.
type mapSource struct {
	files map[string][]byte
	mtime int64
}

func (m mapSource) Block(it Item) ([]byte, byte) {
	b, ok := m.files[it.Path]
	if !ok || int64(len(b)) != it.Size || it.Mtime != m.mtime || it.Block != 0 {
		return nil, StatusMissing
	}
	return b, StatusOK
}

// Cached serves only "b.jpg", as if nothing else were cached.
func (m mapSource) Cached(it Item) ([]byte, byte) {
	if it.Path != "b.jpg" {
		return nil, StatusMissing
	}
	return m.Block(it)
}

func serve(t *testing.T, key []byte) (*Server, mapSource) {
	t.Helper()
	src := mapSource{files: map[string][]byte{"a/x.jpg": bytes.Repeat([]byte("x"), 100_000), "b.jpg": []byte("bee")}, mtime: 5}
	s, err := Listen("127.0.0.1:0", key, src, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, src
}

// TestFetchCached: a cached request is served from the source's caches
// only.
func TestFetchCached(t *testing.T) {
	key := []byte("sixteen byte key")
	s, _ := serve(t, key)
	cl := NewClient(key)
	defer cl.Close()
	res, err := cl.FetchCached(context.Background(), s.Addr(), []Item{{Path: "b.jpg", Size: 3, Mtime: 5}, {Path: "a/x.jpg", Size: 100_000, Mtime: 5}})
	if err != nil || len(res) != 2 || res[0].Status != StatusOK || string(res[0].Data) != "bee" || res[1].Status != StatusMissing {
		t.Fatalf("cached fetch: %+v, %v", res, err)
	}
}

func TestFetch(t *testing.T) {
	key := []byte("sixteen byte key")
	s, src := serve(t, key)
	cl := NewClient(key)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ { // pipelined on one connection
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := cl.Fetch(ctx, s.Addr(), []Item{
				{Path: "a/x.jpg", Size: 100_000, Mtime: 5},
				{Path: "b.jpg", Size: 3, Mtime: 5},
				{Path: "b.jpg", Size: 4, Mtime: 5},            // another version
				{Path: "../../etc/passwd", Size: 1, Mtime: 5}, // not in the catalog
			})
			if err != nil {
				t.Error(err)
				return
			}
			if res[0].Status != StatusOK || !bytes.Equal(res[0].Data, src.files["a/x.jpg"]) ||
				res[1].Status != StatusOK || string(res[1].Data) != "bee" ||
				res[2].Status != StatusMissing || res[3].Status != StatusMissing {
				t.Errorf("results %v %v %v %v", res[0].Status, res[1].Status, res[2].Status, res[3].Status)
			}
		}()
	}
	wg.Wait()
}

// TestKeyRequired: a client with another key is refused before any
// request is read, and learns nothing.
func TestKeyRequired(t *testing.T) {
	s, _ := serve(t, []byte("sixteen byte key"))
	cl := NewClient([]byte("another key!!!!!"))
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := cl.Fetch(ctx, s.Addr(), []Item{{Path: "b.jpg", Size: 3, Mtime: 5}})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("got %v, want ErrAuth", err)
	}
}

// TestServerSurvivesGarbage: a peer that sends nonsense after the
// handshake loses its connection; the server keeps serving others.
func TestServerSurvivesGarbage(t *testing.T) {
	key := []byte("sixteen byte key")
	s, _ := serve(t, key)
	cl := NewClient(key)
	defer cl.Close()
	ctx := context.Background()
	cn, err := cl.get(ctx, s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	writeFrame(cn.c, []byte{msgRequest, 0, 0}) // truncated
	<-cn.done
	if _, err := cl.Fetch(ctx, s.Addr(), []Item{{Path: "b.jpg", Size: 3, Mtime: 5}}); err != nil {
		t.Fatalf("after a bad peer: %v", err)
	}
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add(encodeRequest(7, []Item{{Path: "a/b", Size: 1, Mtime: 2, Block: 0}}, false))
	f.Add(encodeRequest(8, []Item{{Path: "c", Size: 3, Mtime: 4, Block: 1}}, true))
	f.Add([]byte{msgRequest})
	f.Add([]byte{msgRequest, 0, 0, 0, 1, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, items, cached, err := decodeRequest(b)
		if err != nil {
			if !errors.Is(err, ErrWire) {
				t.Fatalf("error %v does not wrap ErrWire", err)
			}
			return
		}
		if !bytes.Equal(encodeRequest(id, items, cached), b) {
			t.Fatal("decode(encode) is not the identity")
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(encodeResponse(3, []Result{{Status: StatusOK, Data: []byte("abc")}, {Status: StatusMissing}}))
	f.Add([]byte{msgResponse, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, res, err := decodeResponse(b)
		if err != nil {
			if !errors.Is(err, ErrWire) {
				t.Fatalf("error %v does not wrap ErrWire", err)
			}
			return
		}
		if !bytes.Equal(encodeResponse(id, res), b) {
			t.Fatal("decode(encode) is not the identity")
		}
	})
}
