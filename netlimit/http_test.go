package netlimit

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/dlfs/dlfs/netlimit/limittest"
)

// An HTTP server holds at most MaxConns keep-alive connections, and
// closes idle ones after IdleTimeout.
func TestHTTPServerBounds(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv, lim, err := HTTPServer(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		HTTPConfig{IdleTimeout: 300 * time.Millisecond, MaxConns: 4, MaxPerHost: 4}, "test", nil)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lim)
	t.Cleanup(func() { srv.Close() })

	answered, refused := limittest.IdleKeepAlives(t, ln.Addr().String(), 12)
	if len(answered) != 4 || refused != 8 {
		t.Fatalf("%d answered and %d refused of 12 keep-alives, want 4 and 8", len(answered), refused)
	}
	if h := lim.Held(); h > 4 {
		t.Fatalf("holds %d connections, over MaxConns=4", h)
	}
	limittest.WaitClosed(t, answered)
	limittest.WaitFor(t, "every slot to come free", func() bool { return lim.Held() == 0 })
	again, _ := limittest.IdleKeepAlives(t, ln.Addr().String(), 1)
	if len(again) != 1 {
		t.Fatal("no answer once the idle connections were closed")
	}
}
