package netlimit

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// HTTPConfig bounds an HTTP server. Zero fields take DefaultHTTP's.
type HTTPConfig struct {
	ReadTimeout  time.Duration // to read a whole request, headers and body
	WriteTimeout time.Duration // from the end of the request's headers to the end of the response
	IdleTimeout  time.Duration // a keep-alive connection waiting for its next request
	MaxConns     int           // connections at once (see Config)
	MaxPerHost   int           // of them from one source IP
}

// DefaultHTTP returns the bounds of the daemon's metrics server.
func DefaultHTTP() HTTPConfig {
	return HTTPConfig{
		ReadTimeout:  10 * time.Second, // requests are GETs with a few headers
		WriteTimeout: 30 * time.Second, // a scrape of a large /metrics
		IdleTimeout:  60 * time.Second, // a keep-alive outlives a 30 s scrape interval
		MaxConns:     64,               // a scraper, a few browsers, some spare
		MaxPerHost:   16,               // one address takes a quarter
	}
}

func (c HTTPConfig) withDefaults() HTTPConfig {
	def := DefaultHTTP()
	if c.ReadTimeout == 0 {
		c.ReadTimeout = def.ReadTimeout
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = def.WriteTimeout
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = def.IdleTimeout
	}
	if c.MaxConns == 0 {
		c.MaxConns = def.MaxConns
	}
	if c.MaxPerHost == 0 {
		c.MaxPerHost = min(def.MaxPerHost, c.MaxConns)
	}
	return c
}

// Validate checks c after defaults; the error names the field.
func (c HTTPConfig) Validate() error {
	c = c.withDefaults()
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"ReadTimeout", c.ReadTimeout}, {"WriteTimeout", c.WriteTimeout}, {"IdleTimeout", c.IdleTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%w: HTTP %s %v is negative", ErrConfig, d.name, d.v)
		}
	}
	return Config{Name: "http", MaxConns: c.MaxConns, MaxPerHost: c.MaxPerHost}.Validate()
}

// HTTPServer is an http.Server serving h on ln within cfg's bounds. Call
// Serve(Listener) to run it. name and log are for the refusal lines.
func HTTPServer(ln net.Listener, h http.Handler, cfg HTTPConfig, name string, log *slog.Logger) (*http.Server, *Listener, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	cfg = cfg.withDefaults()
	lim, err := NewListener(ln, Config{Name: name, MaxConns: cfg.MaxConns, MaxPerHost: cfg.MaxPerHost, Logger: log})
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10, // a GET's headers; net/http's default is 1 MiB
		ErrorLog:          slog.NewLogLogger(discardIfNil(log).Handler(), slog.LevelDebug),
	}
	return srv, lim, nil
}

func discardIfNil(log *slog.Logger) *slog.Logger {
	if log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return log
}
