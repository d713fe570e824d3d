// Package packer packs a directory tree into seqfile shards in parallel,
// and verifies a pack against the tree it came from.
//
// # Pipeline
//
// Pack lists SOURCE (directories, regular files, symlinks; sorted by
// path), and cuts the list into Shards runs of about equal bytes, so a
// shard holds neighbouring samples (a class of an ImageFolder tree stays
// together, which chunk coalescing likes). Workers goroutines read files;
// one writer per shard appends them in list order. Reads run ahead of the
// writers by at most a bounded number of bytes.
//
// # Idempotence
//
// Shards are written under temporary names and renamed, and the index is
// written last: a directory with a valid index is a finished pack. Pack
// over a finished pack of the same tree does nothing; over a pack of a
// different tree it refuses, naming a difference. OUTDIR itself takes
// SOURCE's mode and mtime, as it is the root of the mounted tree.
package packer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dlfs/dlfs/seqfile"
)

// Config configures Pack.
type Config struct {
	Source  string // the tree to pack
	Out     string // the pack's directory; created if missing
	Shards  int    // default 16
	Workers int    // files read at once; default 8
	// AheadBytes bounds the bytes read but not yet written; default 256 MiB.
	AheadBytes int64
	// Progress, if set, is called at most every Every with the totals so far.
	Progress func(Progress)
	Every    time.Duration // default 200 ms
}

// Progress is how far a pack has come.
type Progress struct {
	Files, TotalFiles int
	Bytes, TotalBytes int64
	Elapsed           time.Duration
}

// Result describes a finished Pack.
type Result struct {
	Progress
	AlreadyPacked bool // the pack existed and matches SOURCE: nothing was done
	Skipped       int  // entries of SOURCE that are not files, directories or symlinks
}

// item is one entry of SOURCE.
type item struct {
	rel   string
	mode  uint32
	mtime int64
	size  int64
}

// list walks src and returns its entries sorted by path (directories
// included, the root excluded) and the number skipped.
func list(src string) ([]item, int, error) {
	var out []item
	skipped := 0
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("pack: %w", err)
		}
		if p == src {
			return nil
		}
		rel, _ := filepath.Rel(src, p)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return fmt.Errorf("pack: %s: %w", p, err)
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR, syscall.S_IFREG, syscall.S_IFLNK:
		default:
			skipped++
			return nil
		}
		out = append(out, item{rel: filepath.ToSlash(rel), mode: st.Mode, mtime: st.Mtim.Nano(), size: st.Size})
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].rel < out[j].rel })
	return out, skipped, err
}

// ErrOther means OUTDIR holds a pack of a different tree.
var ErrOther = errors.New("pack: OUTDIR holds a pack of another tree")

// Pack packs cfg.Source into cfg.Out.
func Pack(ctx context.Context, cfg Config) (Result, error) {
	if cfg.Shards <= 0 {
		cfg.Shards = 16
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 8
	}
	if cfg.AheadBytes <= 0 {
		cfg.AheadBytes = 256 << 20
	}
	if cfg.Every <= 0 {
		cfg.Every = 200 * time.Millisecond
	}
	start := time.Now()
	if fi, err := os.Stat(cfg.Source); err != nil || !fi.IsDir() {
		return Result{}, fmt.Errorf("pack: SOURCE %s is not a directory", cfg.Source)
	}
	items, skipped, err := list(cfg.Source)
	if err != nil {
		return Result{}, err
	}
	var res Result
	res.Skipped = skipped
	for _, it := range items {
		if it.mode&syscall.S_IFMT != syscall.S_IFDIR {
			res.TotalFiles++
			res.TotalBytes += it.size
		}
	}
	if ix, err := seqfile.ReadIndex(cfg.Out); err == nil {
		if diff := compare(ix, items); diff != "" {
			return res, fmt.Errorf("%w (%s); remove %s to pack again", ErrOther, diff, cfg.Out)
		}
		res.Files, res.Bytes, res.AlreadyPacked = res.TotalFiles, res.TotalBytes, true
		res.Elapsed = time.Since(start)
		return res, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("pack: %w; remove %s to pack again", err, cfg.Out)
	}
	if err := os.MkdirAll(cfg.Out, 0o755); err != nil {
		return res, fmt.Errorf("pack: %w", err)
	}
	p := &packing{cfg: cfg, res: &res, start: start, budget: cfg.AheadBytes}
	p.cond = sync.NewCond(&p.mu)
	entries, err := p.run(ctx, items)
	if err != nil {
		return res, err
	}
	names := make([]string, cfg.Shards)
	for i := range names {
		names[i] = seqfile.ShardName(i)
		if err := os.Rename(filepath.Join(cfg.Out, names[i]+".tmp"), filepath.Join(cfg.Out, names[i])); err != nil {
			return res, fmt.Errorf("pack: %w", err)
		}
	}
	ix, err := seqfile.NewIndex(names, entries)
	if err != nil {
		return res, fmt.Errorf("pack: %w", err)
	}
	if err := seqfile.WriteIndex(cfg.Out, ix); err != nil {
		return res, fmt.Errorf("pack: %w", err)
	}
	// OUTDIR is the root of the mounted tree: it takes SOURCE's mode and
	// mtime, last, since writing into it changes its mtime.
	var st syscall.Stat_t
	if err := syscall.Stat(cfg.Source, &st); err == nil {
		mt := time.Unix(0, st.Mtim.Nano())
		if err := os.Chtimes(cfg.Out, mt, mt); err != nil {
			return res, fmt.Errorf("pack: %w", err)
		}
		if err := os.Chmod(cfg.Out, os.FileMode(st.Mode&0o777)); err != nil {
			return res, fmt.Errorf("pack: %w", err)
		}
	}
	res.Files, res.Bytes = int(p.files.Load()), p.bytes.Load()
	res.Elapsed = time.Since(start)
	return res, nil
}

// compare names the first difference between a pack's index and the
// listing of a tree, or returns "".
func compare(ix *seqfile.Index, items []item) string {
	if len(ix.Entries) != len(items) {
		return fmt.Sprintf("%d entries packed, %d in SOURCE", len(ix.Entries), len(items))
	}
	for i, it := range items {
		e := ix.Entries[i]
		switch {
		case e.Name != it.rel:
			return fmt.Sprintf("%q packed where SOURCE has %q", e.Name, it.rel)
		case e.Mode != it.mode:
			return fmt.Sprintf("%s: mode %#o packed, %#o in SOURCE", it.rel, e.Mode, it.mode)
		case !e.IsDir() && (e.Length != it.size || e.Mtime != it.mtime):
			return fmt.Sprintf("%s changed since it was packed", it.rel)
		}
	}
	return ""
}

// packing is one run of Pack.
type packing struct {
	cfg   Config
	res   *Result
	start time.Time

	files atomic.Int64
	bytes atomic.Int64

	mu     sync.Mutex
	cond   *sync.Cond
	budget int64 // mu guards budget: bytes that may still be read ahead
}

// job is a file to read, in its shard's order; data and err are set
// before done closes.
type job struct {
	it   item
	data []byte
	err  error
	done chan struct{}
}

func (p *packing) run(ctx context.Context, items []item) ([]seqfile.Entry, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Cut the files into shards of about equal bytes, in path order.
	perShard := make([][]*job, p.cfg.Shards)
	var entries []seqfile.Entry
	var total, at int64
	for _, it := range items {
		if it.mode&syscall.S_IFMT != syscall.S_IFDIR {
			total += max(it.size, 1)
		}
	}
	all := make([]*job, 0, len(items))
	for _, it := range items {
		if it.mode&syscall.S_IFMT == syscall.S_IFDIR {
			entries = append(entries, seqfile.Entry{Name: it.rel, Mode: it.mode, Mtime: it.mtime})
			continue
		}
		s := int(at * int64(p.cfg.Shards) / max(total, 1))
		at += max(it.size, 1)
		j := &job{it: it, done: make(chan struct{})}
		perShard[s] = append(perShard[s], j)
		all = append(all, j)
	}
	// Readers, in list order, within the read-ahead budget.
	jobs := make(chan *job)
	var wg sync.WaitGroup
	for w := 0; w < p.cfg.Workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				j.data, j.err = p.read(j.it)
				close(j.done)
			}
		}()
	}
	wg.Add(1)
	go func() { // the feeder: owned by run, ends when the list is done or ctx ends
		defer wg.Done()
		defer close(jobs)
		for _, j := range all {
			if !p.reserve(ctx, max(j.it.size, 1)) {
				return
			}
			select {
			case jobs <- j:
			case <-ctx.Done():
				return
			}
		}
	}()
	// One writer per shard.
	var (
		emu     sync.Mutex
		werrs   = make([]error, p.cfg.Shards)
		writers sync.WaitGroup
	)
	for s := range perShard {
		writers.Add(1)
		go func() {
			defer writers.Done()
			es, err := p.write(ctx, s, perShard[s])
			if err != nil {
				werrs[s] = err
				cancel()
				return
			}
			emu.Lock()
			entries = append(entries, es...)
			emu.Unlock()
		}()
	}
	stopProgress := p.report()
	writers.Wait()
	cancel() // stop the feeder and readers if a writer failed
	p.mu.Lock()
	p.cond.Broadcast()
	p.mu.Unlock()
	wg.Wait()
	stopProgress()
	if err := errors.Join(werrs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	return entries, nil
}

// reserve waits until n bytes fit in the read-ahead budget (a file larger
// than the whole budget waits for an empty pipeline).
func (p *packing) reserve(ctx context.Context, n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.budget < min(n, p.cfg.AheadBytes) && ctx.Err() == nil {
		p.cond.Wait()
	}
	p.budget -= n
	return ctx.Err() == nil
}

func (p *packing) release(n int64) {
	p.mu.Lock()
	p.budget += n
	p.cond.Broadcast()
	p.mu.Unlock()
}

// read returns a file's bytes, or a symlink's target.
func (p *packing) read(it item) ([]byte, error) {
	full := filepath.Join(p.cfg.Source, filepath.FromSlash(it.rel))
	if it.mode&syscall.S_IFMT == syscall.S_IFLNK {
		t, err := os.Readlink(full)
		return []byte(t), err
	}
	b, err := os.ReadFile(full)
	if err == nil && int64(len(b)) != it.size {
		err = fmt.Errorf("%s changed while packing (%d bytes, listed as %d)", full, len(b), it.size)
	}
	return b, err
}

// write appends shard s's files in order and returns their entries.
func (p *packing) write(ctx context.Context, s int, jobs []*job) ([]seqfile.Entry, error) {
	path := filepath.Join(p.cfg.Out, seqfile.ShardName(s)+".tmp")
	w, err := seqfile.Create(path, s)
	if err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	out := make([]seqfile.Entry, 0, len(jobs))
	for _, j := range jobs {
		select {
		case <-j.done:
		case <-ctx.Done():
			w.Close()
			return nil, ctx.Err()
		}
		if j.err != nil {
			w.Close()
			return nil, fmt.Errorf("pack: %w", j.err)
		}
		e, err := w.Append(j.it.rel, j.it.mode, j.it.mtime, j.data)
		if err != nil {
			w.Close()
			return nil, fmt.Errorf("pack: %w", err)
		}
		out = append(out, e)
		p.files.Add(1)
		p.bytes.Add(int64(len(j.data)))
		j.data = nil
		p.release(max(j.it.size, 1))
	}
	if err := w.Close(); err != nil {
		return nil, fmt.Errorf("pack: %w", err)
	}
	return out, nil
}

// report calls Progress every Every until the returned stop is called;
// stop sends a last report.
func (p *packing) report() (stop func()) {
	if p.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	send := func() {
		p.cfg.Progress(Progress{Files: int(p.files.Load()), TotalFiles: p.res.TotalFiles,
			Bytes: p.bytes.Load(), TotalBytes: p.res.TotalBytes, Elapsed: time.Since(p.start)})
	}
	go func() {
		defer wg.Done()
		t := time.NewTicker(p.cfg.Every)
		defer t.Stop()
		for {
			select {
			case <-done:
				send()
				return
			case <-t.C:
				send()
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// Mismatch is one difference Verify found.
type Mismatch struct {
	Name   string
	Reason string
}

// Verify checks every record of the pack in dir against the tree at src:
// every entry exists in src with the same type, mode, size and bytes, the
// records' checksums hold, and src has nothing the pack lacks. It returns
// the entries checked and up to limit mismatches.
func Verify(dir, src string, limit int) (int, []Mismatch, error) {
	ix, err := seqfile.ReadIndex(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil, fmt.Errorf("verify: %s is not a pack (no %s); make one with dlfs pack SOURCE %s", dir, seqfile.IndexName, dir)
	}
	if err != nil {
		return 0, nil, fmt.Errorf("verify: %w", err)
	}
	items, _, err := list(src)
	if err != nil {
		return 0, nil, err
	}
	var bad []Mismatch
	add := func(name, reason string) {
		if len(bad) < limit {
			bad = append(bad, Mismatch{name, reason})
		}
	}
	inPack := map[string]bool{}
	shards := make([]*os.File, len(ix.Shards))
	defer func() {
		for _, f := range shards {
			if f != nil {
				f.Close()
			}
		}
	}()
	sizes := make([]int64, len(ix.Shards))
	for i, s := range ix.Shards {
		f, err := os.Open(filepath.Join(dir, s))
		if err != nil {
			return 0, nil, fmt.Errorf("verify: %w", err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return 0, nil, fmt.Errorf("verify: %w", err)
		}
		shards[i], sizes[i] = f, fi.Size()
	}
	for _, e := range ix.Entries {
		inPack[e.Name] = true
		full := filepath.Join(src, filepath.FromSlash(e.Name))
		var st syscall.Stat_t
		if err := syscall.Lstat(full, &st); err != nil {
			add(e.Name, "missing from SOURCE")
			continue
		}
		if st.Mode != e.Mode {
			add(e.Name, fmt.Sprintf("mode %#o packed, %#o in SOURCE", e.Mode, st.Mode))
			continue
		}
		if e.IsDir() {
			continue
		}
		rec, err := seqfile.ReadRecord(shards[e.Shard], sizes[e.Shard], e.Offset)
		if err != nil {
			add(e.Name, fmt.Sprintf("%s: %v", ix.Shards[e.Shard], err))
			continue
		}
		if rec.Name != e.Name || rec.Length != e.Length || rec.CRC != e.CRC {
			add(e.Name, fmt.Sprintf("%s offset %d holds %q, not the indexed record", ix.Shards[e.Shard], e.Offset, rec.Name))
			continue
		}
		var want []byte
		if e.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			t, err := os.Readlink(full)
			want = []byte(t)
			if err != nil {
				add(e.Name, err.Error())
				continue
			}
		} else if want, err = os.ReadFile(full); err != nil {
			add(e.Name, err.Error())
			continue
		}
		if string(want) != string(rec.Data) {
			add(e.Name, fmt.Sprintf("bytes differ (%d packed, %d in SOURCE)", len(rec.Data), len(want)))
		}
	}
	for _, it := range items {
		if !inPack[it.rel] {
			add(it.rel, "in SOURCE but not packed")
		}
	}
	return len(ix.Entries), bad, nil
}
