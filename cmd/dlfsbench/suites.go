package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/dlfs/dlfs/test/datagen"
)

// The suites dlfsbench knows, in the order it runs them. -suites picks
// them by exact name; "all" (the default, and make bench) is those marked
// default. The order is the one make bench has always printed its tables
// in, so that runs stay comparable.
var suites = []suite{
	{name: "mount", def: true, data: true, doc: "raw reads of every file: native, pfssim, dlfs cold, warm, from RAM, after remount (issue 2)",
		run: func(o options, d dataset) error { return runMount(o, d.src, d.files, d.total) }},
	{name: "push", def: true, data: true, doc: "an announced order from the RAM tier, pushing into the page cache on and off (issue 14)",
		run: func(o options, d dataset) error { return runPush(o, d.src, d.files, d.total) }},
	{name: "clairvoyance", def: true, data: true, doc: "the DataLoader over a busy PFS, directly and through dlfs told the sampler's seed (issue 3)",
		run: func(o options, d dataset) error { return runClairvoyance(o, d.src, d.total) }},
	{name: "untold", def: true, data: true, doc: "loaders that announce nothing, over the busy pfssim (issue 12)",
		run: func(o options, d dataset) error { return runUntold(o, d.src, d.files, d.total) }},
	{name: "cluster", def: true, data: true, doc: "three nodes on loopback over one busy pfssim, one 3-rank job (issue 4)",
		run: func(o options, d dataset) error { return runCluster(o, d.src, d.files, d.total) }},
	{name: "balance", def: true, data: true, doc: "the cluster's job in stock and locality batch orders (issue 11)",
		run: func(o options, d dataset) error { return runBalance(o, d.src, d.files, d.total) }},
	{name: "hosts", def: true, data: true, doc: "the cluster on the multi-host test bed: 3 hosts, then 16 (issue 28)",
		run: func(o options, d dataset) error { return runHosts(o, d.src, d.files, d.total) }},
	{name: "zoo", def: true, doc: "datasets of other shapes than ImageNet's, each read the way its job reads it; -zoo picks them (issue 29)",
		run: func(o options, _ dataset) error { return runZoo(o) }},
	{name: "packed", def: true, data: true, doc: "dlfs pack against tar, then an epoch over a packed copy behind pfssim (issue 5)",
		run: func(o options, d dataset) error { return runPacked(o, d.src, d.files, d.total) }},
	{name: "sealing", def: true, doc: "what TLS costs the peer transport, against bare TCP frames",
		run: func(o options, _ dataset) error { return runSealing(o) }},
	{name: "tablechange", def: true, doc: "a member leaving and joining at 1 M files, placement alone at 1 M and 10 M (issue 39)",
		run: func(o options, _ dataset) error { return runTableChange(o) }},
	{name: "allocation", def: true, doc: "stand-in jobs on one node with --allocation even and need (issue 15)",
		run: func(o options, _ dataset) error { return runAllocation(o) }},
	{name: "advice", def: true, doc: "TestLoaderAdvice measured: a fast and a slow DataLoader advised workers on one mount (issue 39)",
		run: func(o options, _ dataset) error { return runAdvice(o) }},
	{name: "observe", def: true, data: true, doc: "what the latency histograms and the access log cost the read path (issue 16)",
		run: func(o options, d dataset) error { return runObserve(o, d.src, d.files, d.total) }},
	{name: "sharing", def: true, doc: "two announced jobs sharing the prefetcher, by deadline and evenly",
		run: func(o options, _ dataset) error { return runPrefetchShare(o) }},
	{name: "passthrough", def: true, doc: "a later epoch from the RAM tier with FUSE passthrough and without, against the FUSE floor (issue 32)",
		run: func(o options, _ dataset) error { return runPassthrough(o) }},
	{name: "simulate", def: true, doc: "dlfs simulate over 16 to 1,024 nodes; plots and CSV to -simulate-out (issue 11)",
		run: func(o options, _ dataset) error { return runSimulate(o) }},
	{name: "scale", doc: "a tree of -scale-files tiny files under -scale-dir, natively and through dlfs (make bench-scale; issue 13)",
		run: runScaleSuite},
}

// suite is one table dlfsbench can measure.
type suite struct {
	name string
	doc  string // one line for -h
	def  bool   // in the default set: make bench, -suites all
	data bool   // reads the generated dataset under DIR/source
	run  func(o options, d dataset) error
}

// dataset is the ImageFolder-like tree under DIR/source that the suites
// marked data read.
type dataset struct {
	src   string
	files []string // paths relative to src
	total int64    // bytes in files
}

// selectSuites returns the suites spec names, in table order whatever the
// order of spec: a comma list of names, where "all" stands for the default
// set. A name listed twice runs once.
func selectSuites(spec string) ([]suite, error) {
	want := map[string]bool{}
	for _, name := range strings.Split(spec, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
		case name == "all":
			for _, s := range suites {
				want[s.name] = want[s.name] || s.def
			}
		case knownSuite(name):
			want[name] = true
		default:
			return nil, fmt.Errorf("unknown suite %q in -suites (valid: %s, all)", name, strings.Join(suiteNames(), ", "))
		}
	}
	var picked []suite
	for _, s := range suites {
		if want[s.name] {
			picked = append(picked, s)
		}
	}
	if len(picked) == 0 {
		return nil, fmt.Errorf("no suite in -suites %q (valid: %s, all)", spec, strings.Join(suiteNames(), ", "))
	}
	return picked, nil
}

func knownSuite(name string) bool {
	for _, s := range suites {
		if s.name == name {
			return true
		}
	}
	return false
}

func suiteNames() []string {
	names := make([]string, len(suites))
	for i, s := range suites {
		names[i] = s.name
	}
	return names
}

// printSuites lists the table for -h, the default set marked.
func printSuites(w io.Writer) {
	fmt.Fprintf(w, "\nSuites (-suites: a comma list of names, run in this order; all: those marked *):\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range suites {
		mark := " "
		if s.def {
			mark = "*"
		}
		fmt.Fprintf(tw, "  %s %s\t%s\n", mark, s.name, s.doc)
	}
	tw.Flush()
}

// runSuites runs the suites -suites names, generating the dataset first
// if one of them reads it (or -gen-only asks for it alone).
func runSuites(o options) error {
	picked, err := selectSuites(o.suites)
	if err != nil {
		return err
	}
	var d dataset
	needData := o.genOnly
	for _, s := range picked {
		needData = needData || s.data
	}
	if needData {
		if d, err = generate(o); err != nil {
			return err
		}
	}
	if o.genOnly {
		return nil
	}
	if err := os.MkdirAll(o.dir, 0o755); err != nil {
		return fmt.Errorf("work directory: %w", err)
	}
	for _, s := range picked {
		if err := s.run(o, d); err != nil {
			return fmt.Errorf("%s suite: %w", s.name, err)
		}
	}
	return nil
}

// generate makes (or reuses) the dataset under DIR/source.
func generate(o options) (dataset, error) {
	src := filepath.Join(o.dir, "source")
	fmt.Fprintf(os.Stderr, "generating %d files under %s ...\n", o.files, src)
	gen, err := datagen.ImageFolder(src, datagen.Spec{Classes: 100, Files: o.files, MeanSize: 110_000, Spread: 40_000, Seed: 42})
	if err != nil {
		return dataset{}, fmt.Errorf("generate dataset: %w", err)
	}
	d := dataset{src: src, files: make([]string, len(gen))}
	for i, f := range gen {
		d.files[i] = f.Path
		d.total += f.Size
	}
	return d, nil
}

// runScaleSuite runs the scale suite with its work directory defaulted.
func runScaleSuite(o options, _ dataset) error {
	if o.scaleDir == "" {
		o.scaleDir = filepath.Join(o.dir, fmt.Sprintf("scale-%d", o.scaleFiles))
	}
	return runScale(o)
}
